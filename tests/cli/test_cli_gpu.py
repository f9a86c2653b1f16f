"""The CLI on the GPU (run by scripts/gpu_check.sh): configs/triton_mla.yaml end to end, and bench
in its GPU mode (engines rebuilt per run)."""

import json

import pytest
from helpers.cli_harness import ROOT, invoke, read_jsonl

pytestmark = pytest.mark.gpu


def test_generate_with_triton_mla_config(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": f"Request {i}: " + "abc " * i}) + "\n" for i in range(24)))
    out = tmp_path / "out.jsonl"
    res = invoke(["generate", "--config", str(ROOT / "configs/triton_mla.yaml"), "-i", str(inp), "-o", str(out),
                  "--set", "sampling.max_tokens=8", "--no-progress"])
    assert res.exit_code == 0, res.stderr
    recs = read_jsonl(out)
    assert [r["id"] for r in recs] == list(range(24))
    assert all(r["finish_reason"] in ("stop", "length") and r["usage"]["completion_tokens"] >= 1 for r in recs)


def test_bench_rebuilds_engines_on_gpu(tmp_path):
    out = tmp_path / "bench.json"
    res = invoke(["bench", "--config", str(ROOT / "configs/bench/baseline.yaml"),
                  "--config", str(ROOT / "configs/bench/prefix.yaml"), "--workload",
                  str(ROOT / "configs/bench/workloads.yaml#smoke"), "--repeats", "2", "--warmup", "2",
                  "--set", "device=gpu", "--json", str(out)])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["device"] == "gpu" and doc["engines"] == "rebuild"
    assert all(c["summary"]["errors"] == 0 for c in doc["configs"])


def test_default_config_on_a_gpu_says_triton_mla(tmp_path):
    """attention.backend auto resolves to triton_mla on a GPU, and the first stderr line says so."""
    summary = tmp_path / "s.json"
    res = invoke(["generate", "--no-progress", "--max-tokens", "4", "--summary", str(summary)],
                 input=b'{"id": 1, "prompt": "Hello"}\n')
    assert res.exit_code == 0, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith("paddle-mla: runtime ") and ", device gpu (" in first, first
    assert ", dtype bfloat16, backend triton_mla, model tiny (" in first, first
    s = json.loads(summary.read_text())
    assert (s["device"], s["backend"], s["dtype"]) == ("gpu", "triton_mla", "bfloat16") and s["device_name"]
