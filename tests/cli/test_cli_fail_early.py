"""Fail before work, never after: bad output / summary / JSON / plot paths, an
existing --output, and bad model paths are refused with one line, exit 2, before any model loads."""

import json
import subprocess
import sys

import pytest
from helpers.cli_harness import ROOT, invoke

from paddle_mla.cli import app as cli

LINE = b'{"id": 1, "prompt": "Hello"}\n'


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if a command gets as far as loading a model."""
    calls = []
    monkeypatch.setattr(cli, "build_llm", lambda cfg: calls.append(cfg) or pytest.fail("the model was loaded"))
    return calls


def _one_error_line(res, *needles):
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.lower().startswith("error:")]   # ours or click's
    assert len(errors) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("args,needles", [
    (["-o", "{d}/nodir/out.jsonl"], ["--output", "does not exist"]),
    (["-o", "{d}"], ["--output", "is a directory"]),
    (["-o", "{d}/out.jsonl", "--summary", "{d}/nodir/s.json"], ["--summary", "does not exist"]),
    (["-o", "{d}/out.jsonl", "--summary", "{d}/out.jsonl"], ["--summary must not be the --output file"]),
    (["-o", "{d}/out.jsonl", "--resume", "--overwrite"], ["exclude each other"]),
])
def test_generate_bad_paths_fail_before_the_model_loads(tmp_path, no_model_load, args, needles):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(LINE)
    res = invoke(["generate", "-i", str(inp), *[a.format(d=tmp_path) for a in args]])
    _one_error_line(res, *needles)
    assert not no_model_load


def test_unwritable_folder_is_refused(tmp_path, no_model_load):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        _one_error_line(invoke(["generate", "-o", str(locked / "o.jsonl")], input=LINE), "not writable")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("args,needles", [
    (["--json", "{d}/nodir/b.json"], ["--json", "does not exist"]),
    (["--plot", "{d}/nodir/b.png"], ["--plot"]),
    (["--set", "model={d}/missing"], ["does not exist", "never downloads"]),
])
def test_bench_bad_paths_fail_before_any_engine_runs(tmp_path, no_model_load, args, needles):
    res = invoke(["bench", "--workload", "random:num_prompts=2,input_len=8,output_len=2", "--repeats", "1",
                  *[a.format(d=tmp_path) for a in args]])
    _one_error_line(res, *needles)


@pytest.mark.parametrize("workload,sets,needles", [
    ("long-context:num_prompts=1,input_len=4096", [],
     ["workload 'long-context:num_prompts=1,input_len=4096' needs up to 4112 tokens", "max_model_len is 2048"]),
    ("random:num_prompts=2,input_len=40,output_len=30,range_ratio=0.5", ["--set", "max_model_len=64"],
     ["workload 'random:num_prompts=2,input_len=40,output_len=30,range_ratio=0.5' needs up to 105 tokens",
      "max_model_len is 64", "shorten input_len/output_len"]),
    ("shared-prefix:prefix_len=60,suffix_len=8", ["--set", "max_model_len=64"],
     ["needs up to 100 tokens", "shorten prefix_len/suffix_len/output_len"]),
])
def test_bench_refuses_a_workload_longer_than_max_model_len_before_any_engine(no_model_load, workload, sets,
                                                                               needles):
    """From the config and the checkpoint's config.json alone, quoting the workload as given (no
    derived seed)."""
    line = _one_error_line(invoke(["bench", "--workload", workload, "--repeats", "1", *sets]), *needles)
    assert "seed=" not in line and not no_model_load


def test_existing_output_needs_resume_or_overwrite(tmp_path, monkeypatch):
    from helpers.cli_harness import read_jsonl

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(LINE)
    out = tmp_path / "out.jsonl"
    finished = [json.dumps({"id": i, "text": "x", "finish_reason": "stop"}) for i in range(200)]
    out.write_text("\n".join(finished) + "\n")
    before = out.read_bytes()
    monkeypatch.setattr(cli, "build_llm", lambda cfg: pytest.fail("the model was loaded"))
    _one_error_line(invoke(["generate", "-i", str(inp), "-o", str(out)]), "already exists", "--resume", "--overwrite")
    assert out.read_bytes() == before                       # the finished results are intact
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--overwrite", "--no-progress"], "fake", monkeypatch)
    assert res.exit_code == 0, res.stderr
    assert [r["id"] for r in read_jsonl(out)] == [1]
    out.write_text("")                                       # an empty file holds nothing to lose
    assert invoke(["generate", "-i", str(inp), "-o", str(out), "--no-progress"], "fake", monkeypatch).exit_code == 0


@pytest.fixture
def model_paths(tmp_path):
    empty = tmp_path / "no_config"
    empty.mkdir()
    (tmp_path / "a_file").write_text("x")
    return {
        "missing": (str(tmp_path / "missing"), ["model path", "does not exist", "never downloads",
                                                "local checkpoint folder"]),
        "hub": ("deepseek-ai/DeepSeek-V2-Lite", ["looks like a Hugging Face hub id", "never downloads",
                                                 "--local-dir"]),
        "no_config": (str(empty), ["has no config.json"]),
        "file": (str(tmp_path / "a_file"), ["is a file"]),
    }


@pytest.mark.parametrize("kind", ["missing", "hub", "no_config", "file"])
def test_bad_model_paths_each_get_their_own_message(model_paths, no_model_load, kind):
    path, needles = model_paths[kind]
    messages = {_one_error_line(invoke(["generate", "--model", path], input=LINE), *needles),
                _one_error_line(invoke(["generate", "--set", f"model={path}"], input=LINE), *needles)}
    assert len(messages) == 1
    res = invoke(["validate", str(ROOT / "configs/tiny.yaml"), "--set", f"model={path}"])
    assert res.exit_code == 2 and all(n in res.stderr for n in needles), res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("text,needle", [('{"model_type": ', "config.json is not valid JSON (line 1"),
                                         ('{"model_type": "mamba"}', "unsupported model_type 'mamba'"),
                                         ("{}", "cannot be read as a supported model"),
                                         ("[]", "its top level is a JSON list, not an object")])
def test_a_broken_config_json_is_one_line(tmp_path, no_model_load, text, needle):
    """A checkpoint folder whose config.json is not JSON or names no supported model: the model
    path's one-line error and exit 2, in generate and in bench; validate lists it as the config's
    error and exits 2, printing nothing for that config."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(text)
    _one_error_line(invoke(["generate", "--model", str(bad)], input=LINE), str(bad), needle)
    _one_error_line(invoke(["bench", "--workload", "random:num_prompts=1", "--set", f"model={bad}"]), needle)
    config = str(ROOT / "configs/tiny.yaml")
    res = invoke(["validate", config, "--set", f"model={bad}"])
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and lines[0] == f"{config}: 1 error", res.stderr
    assert lines[1].startswith(f"  - 'model': model folder {bad}: ") and needle in lines[1], res.stderr
    assert res.stdout == ""


def test_a_config_json_that_disagrees_with_its_tensors_is_one_line(tmp_path):
    """The tiny checkpoint with config.json making its MoE layer 1 dense: the load's one line
    (exit 2) names the tensor, before any weight is read."""
    import shutil

    from paddle_mla.models import ensure_tiny_model

    path = tmp_path / "tiny"
    shutil.copytree(ensure_tiny_model(), path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "first_k_dense_replace": 2}))
    _one_error_line(invoke(["generate", "--model", str(path), "--no-progress"], input=LINE),
                    "cannot load the model of this config: config.json and the checkpoint disagree: "
                    "model.layers.1.mlp.gate_proj.weight is missing (config.json makes layer 1 a dense layer, "
                    "the checkpoint a MoE layer)")


def test_an_empty_model_path_is_named_as_such(no_model_load):
    """--set model= (or --model "") is an empty model path, said so, not a folder without a name."""
    for args in (["generate", "--set", "model="], ["generate", "--model", ""],
                 ["validate", str(ROOT / "configs/tiny.yaml"), "--set", "model="],
                 ["bench", "--workload", "random:num_prompts=1", "--set", "model="]):
        res = invoke(args, input=LINE)
        assert res.exit_code == 2, (args, res.stderr)
        assert "'model' (the model path) is empty" in res.stderr and "model folder  " not in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


def test_the_messages_differ(model_paths):
    from paddle_mla.engine.run_info import model_problem

    texts = [model_problem(p) for p, _ in model_paths.values()]
    assert len(set(texts)) == len(texts) and model_problem("tiny") is None
    assert "tokenizer.json" not in " ".join(texts)


def test_no_traceback_reaches_the_user_in_a_real_process(tmp_path):
    """The installed entry point (python -m paddle_mla): one line on stderr, exit 2."""
    for args in (["generate", "-o", str(tmp_path / "nodir" / "o.jsonl")],
                 ["generate", "--model", "deepseek-ai/DeepSeek-V2-Lite"],
                 ["bench", "--workload", "random:num_prompts=1", "--json", str(tmp_path / "nodir" / "b.json")]):
        proc = subprocess.run([sys.executable, "-m", "paddle_mla", *args], input=LINE, capture_output=True,
                              cwd=ROOT, timeout=120)
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
