"""paddle-mla bench: workload specs, interleaving, the JSON document and the plot (tiny model)."""

import builtins
import json

import pytest
from helpers.cli_harness import ENGINES, ROOT, invoke

from paddle_mla.cli.bench.workloads import WorkloadError, build_requests, parse_workload
from paddle_mla.sched.request import GenerationRequest, SamplingParams

WORKLOADS = ROOT / "configs" / "bench" / "workloads.yaml"


def test_parse_workload_specs():
    w = parse_workload("random:num_prompts=5,input_len=10,output_len=3,range_ratio=0.5")
    assert w.kind == "random" and w.params["num_prompts"] == 5 and w.params["range_ratio"] == 0.5
    assert parse_workload(f"{WORKLOADS}#smoke").kind == "shared-prefix"
    for name in ("shared", "random", "long", "smoke"):
        parse_workload(f"{WORKLOADS}#{name}")
    for bad, msg in [("zipf:num_prompts=1", "unknown workload kind"), ("random:num_prompt=1", "num_prompts"),
                     ("random:input_len=1.5", "integer"), ("random:num_prompts", "key=value"),
                     (f"{WORKLOADS}", "several workloads"), (f"{WORKLOADS}#nope", "no workload"),
                     ("random:range_ratio=1.5", "range_ratio")]:
        with pytest.raises(WorkloadError, match=msg):
            parse_workload(bad)


def test_requests_are_seeded_and_avoid_special_tokens():
    from helpers.fake_llm import ByteTokenizer

    tok = ByteTokenizer()
    w = parse_workload("shared-prefix:num_prompts=6,prefix_len=8,suffix_len=3,output_len=2,shared_fraction=0.5,seed=3")
    a = build_requests(w, tok, GenerationRequest, SamplingParams, 64)
    b = build_requests(w, tok, GenerationRequest, SamplingParams, 64)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert all(len(r.prompt_token_ids) == 11 and r.params.max_tokens == 2 and r.params.ignore_eos for r in a)
    assert not {t for r in a for t in r.prompt_token_ids} & set(tok.all_special_ids)
    c = build_requests(w.with_seed_offset(1), tok, GenerationRequest, SamplingParams, 64)
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]
    with pytest.raises(WorkloadError, match="max_model_len"):
        build_requests(parse_workload("long-context:input_len=100"), tok, GenerationRequest, SamplingParams, 64)


def test_the_longest_sequence_is_known_from_the_workload_alone():
    from paddle_mla.cli.bench.workloads import check_fits, longest_sequence

    assert longest_sequence(parse_workload("random:input_len=100,output_len=10,range_ratio=0.5")) == 150 + 15
    assert longest_sequence(parse_workload("shared-prefix:prefix_len=8,suffix_len=3,output_len=2")) == 13
    w = parse_workload("long-context:input_len=100,seed=7").with_seed_offset(3)
    check_fits(w, 116)
    with pytest.raises(WorkloadError) as info:
        check_fits(w, 115)
    assert str(info.value).startswith("workload 'long-context:num_prompts=4,input_len=100,output_len=16,"
                                      "range_ratio=0.0' needs up to 116 tokens") and "seed" not in str(info.value)
    with pytest.raises(WorkloadError, match="^workload 'long-context:input_len=100' needs"):
        check_fits(w, 115, "long-context:input_len=100")


def test_configs_are_interleaved_and_args_checked(tmp_path, monkeypatch):
    a, b = ROOT / "configs/bench/baseline.yaml", ROOT / "configs/bench/prefix.yaml"
    res = invoke(["bench", "--config", str(a), "--config", str(b), "--workload",
                  "random:num_prompts=3,input_len=5,output_len=2", "--repeats", "2"], "fake", monkeypatch)
    assert res.exit_code == 0, res.stderr
    order = [line.split("]")[0][1:] for line in res.stderr.splitlines() if line.startswith("[") and "repeat" in line]
    assert order == ["baseline", "prefix", "baseline", "prefix"]
    assert "(1.00x)" not in res.stdout.splitlines()[2] and "x)" in res.stdout.splitlines()[3]
    bad = tmp_path / "gpu.yaml"
    bad.write_text("device: cpu\n")
    assert invoke(["bench", "--config", str(a), "--config", str(bad), "--workload", "random"],
                  "fake", monkeypatch).exit_code == 2
    assert invoke(["bench", "--workload", "random:oops=1"], "fake", monkeypatch).exit_code == 2

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kw):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    res = invoke(["bench", "--workload", "random:num_prompts=1", "--plot", str(tmp_path / "p.png")],
                 "fake", monkeypatch)
    assert res.exit_code == 2 and "pip install 'paddle-mla[plot]'" in res.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_bench_end_to_end(engine, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    res = invoke(["bench", "--config", str(ROOT / "configs/bench/baseline.yaml"),
                  "--config", str(ROOT / "configs/bench/prefix.yaml"), "--workload", f"{WORKLOADS}#smoke",
                  "--repeats", "1", "--warmup", "2",
                  "--set", "scheduler.max_num_seqs=2",   # admitted in waves, so later prompts hit the prefix cache
                  "--json", str(out_json), "--plot", str(out_png)],
                 engine, monkeypatch)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("| config | req/s | out tok/s")
    doc = json.loads(out_json.read_text())
    assert doc["schema_version"] == 1 and doc["repeats"] == 1 and doc["workload"]["kind"] == "shared-prefix"
    assert {"runtime", "device", "date", "engines", "warmup_requests"} <= doc.keys()
    assert [c["name"] for c in doc["configs"]] == ["baseline", "prefix"]
    for c in doc["configs"]:
        s = c["summary"]
        for key in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50",
                    "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "e2el_ms_p50", "prefix_cache_hit_rate",
                    "peak_blocks_used", "num_blocks", "errors"):
            assert key in s, key
        assert s["errors"] == 0 and s["output_tokens_per_s"] > 0
        assert c["ratio_to_first"]["output_tokens_per_s"] > 0 and len(c["runs"]) == 1
        run = c["runs"][0]
        assert run["requests"] == 6 and run["completion_tokens"] == 6 * 3 and run["prompt_tokens"] == 6 * 36
        assert c["config"]["cache"]["enable_prefix_caching"] == (c["name"] == "prefix")
    assert doc["configs"][0]["ratio_to_first"]["output_tokens_per_s"] == 1.0
    if engine == "real":
        assert doc["configs"][0]["summary"]["prefix_cache_hit_rate"] == 0.0
        assert doc["configs"][1]["summary"]["prefix_cache_hit_rate"] > 0.0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_warmup(tmp_path, monkeypatch):
    res = invoke(["bench", "--workload", "random:num_prompts=2,input_len=8,output_len=2", "--repeats", "1",
                  "--warmup", "0"], "fake", monkeypatch)
    assert res.exit_code == 0, res.stderr
    assert "warm-up" not in res.stderr and res.stdout.startswith("| config |")
