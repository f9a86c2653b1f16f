"""Ray Data integration: ``LLMPredictor`` answers a batch as ``paddle-mla generate`` answers the same
lines (structured columns or whole JSONL lines), and examples/ray_batch.py on a local Ray instance
(``ray.init(num_cpus=2)``, two actors) writes the file the plain CLI writes."""

import importlib.util
import json

import numpy as np
import pytest
from helpers.cli_harness import ROOT, invoke, read_jsonl

from paddle_mla.platform import runtime

SETS = ["--set", "sampling.max_tokens=4", "--set", "scheduler.max_num_seqs=4"]


def _lines() -> list[str]:
    lines = []
    for i in range(14):
        if i == 3:
            lines.append(json.dumps({"id": "bad", "prompt_token_ids": [4, 5], "temperature": -1}))
        elif i == 5:
            lines.append(json.dumps({"prompt_token_ids": [9, 8, 7, 6]}))          # no id: keyed by line
        elif i == 7:
            lines.append(json.dumps({"custom_id": "oa", "method": "POST", "url": "/v1/completions",
                                     "body": {"prompt": "Hello there", "max_tokens": 3}}))
        elif i == 9:
            lines.append(json.dumps({"id": "s", "prompt": "The capital", "temperature": 0.8, "seed": 7}))
        else:
            lines.append(json.dumps({"id": f"r{i}", "prompt_token_ids": [5 + i, 6, 7 + i % 3] * (1 + i % 2),
                                     "max_tokens": 2 + i % 4}))
    return lines


def _cli(tmp_path, lines):
    inp, out = tmp_path / "in.jsonl", tmp_path / "cli.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--no-progress", *SETS])
    assert res.exit_code == 3, res.output
    return read_jsonl(out)


def _same(a: dict, b: dict) -> bool:
    """Records equal but for an OpenAI body's creation time."""
    def strip(r):
        r = json.loads(json.dumps(r))
        if isinstance(r.get("response"), dict):
            r["response"]["body"].pop("created", None)
        return r
    return strip(a) == strip(b)


def test_predictor_columns_match_cli(tmp_path):
    from paddle_mla.integrations.ray_data import LLMPredictor

    lines = _lines()
    want = _cli(tmp_path, lines)
    pred = LLMPredictor(None, [s for s in SETS if s != "--set"])
    # whole lines, numbered as the CLI numbers them
    got = pred({"line": np.arange(1, len(lines) + 1), "json": np.array(lines, dtype=object)})
    assert all(_same(json.loads(r), w) for r, w in zip(got["record"], want))
    assert list(got["line"]) == list(range(1, len(lines) + 1))           # input columns pass through
    ok = [i for i, w in enumerate(want) if "token_ids" in w]
    for i in ok:
        assert list(got["generated_token_ids"][i]) == want[i]["token_ids"]
        assert got["generated_text"][i] == want[i]["text"]
        assert got["num_generated_tokens"][i] == want[i]["usage"]["completion_tokens"]
    assert got["finish_reason"][3] == "error" and got["error"][3].startswith("invalid_sampling")

    # structured columns: prompt text / token ids + per-row sampling params, as Ray's LLM processors take them
    rows = [json.loads(lines[i]) for i in ok if "prompt_token_ids" in json.loads(lines[i])]
    batch = {"id": np.array([r.get("id") for r in rows], dtype=object),
             "prompt_token_ids": np.array([np.array(r["prompt_token_ids"]) for r in rows] + [None], dtype=object)[:-1],
             "sampling_params": np.array([{"max_tokens": r.get("max_tokens")} for r in rows], dtype=object),
             "line": np.array([lines.index(json.dumps(r)) + 1 for r in rows])}
    got = pred(batch)
    by_line = {n: w for n, w in enumerate(want, 1)}
    for n, rec in zip(batch["line"], got["record"]):
        assert json.loads(rec) == by_line[int(n)]


@pytest.mark.slow
def test_ray_example_matches_cli(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'paddle-mla[ray]'): Ray path not run")
    lines = _lines()
    want = _cli(tmp_path, lines)
    spec = importlib.util.spec_from_file_location("ray_batch", ROOT / "examples" / "ray_batch.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "ray.jsonl"
    # the actors import this checkout's paddle_mla and run the runtime of this test session
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "PADDLE_MLA_RUNTIME": runtime.name()}})
    try:
        code = example.main(["-i", str(tmp_path / "in.jsonl"), "-o", str(out), "--replicas", "2",
                             "--batch-size", "4", *SETS])
    finally:
        ray.shutdown()
    assert code == 3
    got = read_jsonl(out)
    assert len(got) == len(want)
    assert all(_same(g, w) for g, w in zip(got, want)), (got, want)
