"""paddle-mla bench --check-determinism: its argument checks and table (fake engine), and on the tiny
model with ``deterministic: true`` every configuration equal to batch 1 in tokens and logprob bits."""

import json

import pytest
from helpers.cli_harness import ROOT, invoke

from paddle_mla.cli.bench.determinism import VARIANTS, as_overrides, compare, variant_config

WORKLOAD = "random:num_prompts=4,input_len=8,output_len=2"


def test_variant_overrides_and_comparison():
    assert as_overrides(variant_config("chunked", 16)) == [
        "scheduler.max_num_seqs=256", "scheduler.enable_chunked_prefill=true", "scheduler.max_num_batched_tokens=16"]
    # 40-token prompts: three 16-token blocks each, a pool of two prompts' blocks and one more
    assert as_overrides(variant_config("preempt", 16, 40, 6))[1:] == ["cache.block_size=16", "cache.num_blocks=7"]
    # a 256-token prompt fills 16 blocks, but admission reserves its first output token: 17 each, so
    # a pool of 33 admitted one request at a time and never preempted (the GPU check at 256 + 32)
    assert as_overrides(variant_config("preempt", 16, 256, 32))[1:] == ["cache.block_size=16", "cache.num_blocks=35"]
    ref = [([1, 2, 3], [-0.5, -0.25, -1.0]), ([4, 5], [-1.0, -2.0])]
    assert compare(ref, ref) == {"differ": 0, "bits_differ": 0, "of": 2, "first_at": None}
    got = [([1, 2, 3], [-0.5, -0.25, -1.0000001]), ([4, 6], [-1.0, -2.0])]
    assert compare(ref, got) == {"differ": 1, "bits_differ": 2, "of": 2, "first_at": 1}


def test_check_runs_every_configuration_and_writes_json(tmp_path, monkeypatch):
    out = tmp_path / "check.json"
    res = invoke(["bench", "--check-determinism", "--workload", WORKLOAD, "--json", str(out)], "fake", monkeypatch)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("| configuration | requests whose tokens differ from batch1")
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == list(VARIANTS)
    assert "| batch1 | reference (4 requests) |" in res.stdout and "| batch256 | 0/4 | 0/4 |" in res.stdout
    # 8 + 2 tokens never cross a 16-token block edge: the table says why the pool preempted nothing
    assert "0 preemptions (none: a longer output_len crosses more 16-token block edges)" in res.stdout
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == set(VARIANTS) and rows["batch1"] == {"reference": True, "of": 4}


def test_check_refuses_what_it_cannot_do(monkeypatch):
    a, b = ROOT / "configs/bench/baseline.yaml", ROOT / "configs/bench/prefix.yaml"
    res = invoke(["bench", "--check-determinism", "--config", str(a), "--config", str(b), "--workload", WORKLOAD],
                 "fake", monkeypatch)
    assert res.exit_code == 2 and "one config" in res.stderr
    res = invoke(["bench", "--check-determinism", "--workload", WORKLOAD, "--plot", "x.png"], "fake", monkeypatch)
    assert res.exit_code == 2 and "no plot" in res.stderr


@pytest.mark.slow
@pytest.mark.triton
def test_deterministic_tiny_model_gives_batch1_bits_everywhere(monkeypatch):
    """The built-in tiny model is DeepSeek-V3-shaped: its sigmoid router was the one place a row's CPU
    bits followed the batch (tests/kernels/test_batch_invariant.py)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    res = invoke(["bench", "--check-determinism", "--workload", "random:num_prompts=4,input_len=24,output_len=4",
                  "--set", "device=cpu", "--set", "dtype=float32", "--set", "attention.backend=triton_mla",
                  "--set", "deterministic=true"])
    assert res.exit_code == 0, res.stderr
    for name in VARIANTS[1:]:
        assert f"| {name} | 0/4" in res.stdout and res.stdout.split(f"| {name} | ")[1].split("\n")[0].endswith(
            "| 0/4 |"), res.stdout
