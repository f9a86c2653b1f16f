"""paddle-mla CLI: help texts, validate, exit codes, config errors, and generate on a corpus of bad
inputs (under the fake engine, and the real one on the tiny model)."""

import errno
import json
import os
import threading

import pytest
import yaml
from helpers.cli_harness import DATA, ENGINES, REAL_ENGINE, ROOT, engine_supports, invoke, read_jsonl

from paddle_mla.config.schema import EngineConfig, load_config

CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if not p.name.startswith("workloads"))


@pytest.mark.parametrize("cmd", [[], ["generate"], ["bench"], ["validate"], ["make-tiny-model"]])
def test_help_has_examples(cmd):
    res = invoke([*cmd, "--help"])
    assert res.exit_code == 0
    assert "Examples:" in res.stdout
    if cmd == ["generate"]:
        for text in ("Exit codes:", "0    every line succeeded", "3    some lines", "2    bad arguments",
                     "custom_id", "--resume", "prompt_too_long"):
            assert text in res.stdout


def test_cli_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, paddle_mla.cli.app, paddle_mla.batch.run, paddle_mla.cli.bench.runner; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_every_shipped_config_validates():
    assert len(CONFIGS) >= 9
    res = invoke(["validate", *map(str, CONFIGS)])
    assert res.exit_code == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout)]
    assert len(docs) == len(CONFIGS)
    for path, doc in zip(CONFIGS, docs):
        assert doc == load_config(path).to_dict()
    assert load_config(ROOT / "configs" / "tiny.yaml") == EngineConfig()   # tiny.yaml is the default


def test_validate_lists_every_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("attention:\n  backend: triton\ncache:\n  block_sise: 16\nscheduler:\n  max_num_seqs: -1\n")
    res = invoke(["validate", str(bad), "--set", "sampling.top_p=2"])
    assert res.exit_code == 2
    assert "did you mean 'cache.block_size'" in res.stderr
    assert "attention.backend" in res.stderr and "max_num_seqs" in res.stderr and "top_p" in res.stderr
    res = invoke(["validate", str(ROOT / "configs/native.yaml"), "--set", "scheduler.max_num_seqs=8"])
    assert res.exit_code == 0 and yaml.safe_load(res.stdout)["scheduler"]["max_num_seqs"] == 8
    assert invoke(["validate", str(tmp_path / "nope.yaml")]).exit_code == 2
    assert invoke(["validate", str(ROOT / "configs/tiny.yaml"), "--set", "oops"]).exit_code == 2


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("engine", ENGINES)
def test_exit_codes(engine, tmp_path, monkeypatch):
    good = _write(tmp_path / "good.jsonl", [{"id": i, "prompt": f"Hello {i}", "max_tokens": 3} for i in range(3)])
    mixed = _write(tmp_path / "mixed.jsonl", [{"id": 1, "prompt": "Hi"}, {"id": 2, "prompt": "Hi", "top_p": 7}])
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    args = ["generate", "-o", str(out), "--overwrite", "--no-progress", "--set", "sampling.max_tokens=3"]
    res = invoke([*args, "-i", str(good), "--summary", str(summary)], engine, monkeypatch)
    assert res.exit_code == 0, res.stderr
    recs = read_jsonl(out)
    assert [r["id"] for r in recs] == [0, 1, 2] and all(r["finish_reason"] in ("stop", "length") for r in recs)
    s = json.loads(summary.read_text())
    for key in ("requests", "prompt_tokens", "completion_tokens", "elapsed_s", "output_tokens_per_s",
                "prefix_cache_hit_rate", "num_preemptions", "errors"):
        assert key in s
    assert s["requests"] == 3 and s["errors"] == 0
    assert s["completion_tokens"] == sum(len(r["token_ids"]) for r in recs)
    assert "3 lines" in res.stderr                                     # the final summary
    assert invoke([*args, "-i", str(mixed)], engine, monkeypatch).exit_code == 3
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("schedular: {}\n")
    res = invoke([*args, "-i", str(good), "--config", str(bad_cfg)], engine, monkeypatch)
    assert res.exit_code == 2 and "did you mean 'scheduler'" in res.stderr
    assert invoke([*args, "-i", str(good), "--set", "cache.block_size=3"], engine, monkeypatch).exit_code == 2
    assert invoke(["generate", "-i", str(good), "--resume"], engine, monkeypatch).exit_code == 2   # resume to stdout
    assert invoke([*args, "-i", str(tmp_path / "missing.jsonl")], engine, monkeypatch).exit_code == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_stdin_to_stdout(engine, monkeypatch):
    lines = b'{"id": "a", "prompt": "Hello"}\n{"id": "b", "prompt": ""}\n'
    res = invoke(["generate", "--set", "sampling.max_tokens=2"], engine, monkeypatch, input=lines)
    assert res.exit_code == 3
    a, b = [json.loads(x) for x in res.stdout.splitlines()]
    assert a["id"] == "a" and len(a["token_ids"]) <= 2 and b["error"]["type"] == "invalid_request"


def _line_id(raw: bytes) -> tuple[str, object]:
    """The id an error line keeps, read independently of the parser: a key repeated in one object
    makes the line invalid, yet its id stays known unless the id itself takes two values."""
    values: dict[str, list] = {}

    def hook(pairs):
        values.clear()
        for k, v in pairs:
            values.setdefault(k, []).append(v)
        return dict(pairs)

    try:
        obj = json.loads(raw, object_pairs_hook=hook)
    except ValueError:
        return "id", None
    if not isinstance(obj, dict):
        return "id", None
    id_field = "custom_id" if "custom_id" in obj or "body" in obj else "id"
    ids = {json.dumps(v) for v in values.get(id_field, [None])}
    ident = obj.get(id_field) if len(ids) == 1 else None
    return id_field, ident if isinstance(ident, (str, int)) and not isinstance(ident, bool) else None


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_input_corpus(engine, tmp_path, monkeypatch):
    """Every bad line gets its error line (right id, useful message); every good line completes;
    one output line per non-blank input line, in order."""
    src = DATA / "bad_inputs.jsonl"
    expected = json.loads((DATA / "bad_inputs.expected.json").read_text())
    out = tmp_path / "out.jsonl"
    res = invoke(["generate", "-i", str(src), "-o", str(out), "--set", "max_model_len=64",
                  "--set", "sampling.max_tokens=4", "--summary", str(tmp_path / "s.json")], engine, monkeypatch)
    assert res.exit_code == 3, res.stderr
    recs = read_jsonl(out)
    raw_lines = src.read_bytes().split(b"\n")[:-1]
    want = [(int(n), e) for n, e in expected.items() if e[0] != "blank"]
    assert len(want) >= 50 and sum(e[0].startswith("ok") is False for _, e in want) >= 30
    assert len(recs) == len(want)
    for rec, (line_no, (kind, substring)) in zip(recs, want):
        id_field, ident = _line_id(raw_lines[line_no - 1])
        obj = json.loads(raw_lines[line_no - 1]) if id_field == "custom_id" else None
        assert rec[id_field] == ident, (line_no, rec)
        if id_field == "custom_id":              # answered in OpenAI's batch output format
            assert rec["id"].startswith("batch_req_") and set(rec) <= {"id", "custom_id", "response", "error", "line"}
            if rec["error"] is not None:
                assert rec["response"] is None and rec["error"]["code"] in kind.split("|"), (line_no, rec)
                assert substring in rec["error"]["message"], (line_no, rec)
            else:
                assert "ok" in kind.split("|"), (line_no, rec)
                body = rec["response"]["body"]
                assert rec["response"]["status_code"] == 200 and body["object"] == "text_completion"
                n = obj["body"].get("n", 1) if engine == "fake" or engine_supports("n") else 1
                assert len(body["choices"]) == n
            continue
        if "error" in rec:
            assert rec["error"]["type"] in kind.split("|"), (line_no, rec)
            assert substring in rec["error"]["message"], (line_no, rec)
            assert rec["line"] == line_no
        else:
            assert "ok" in kind.split("|"), (line_no, rec)
            assert rec["finish_reason"] in ("stop", "length") and isinstance(rec["seed"], int)
            assert rec["usage"]["completion_tokens"] == len(rec["token_ids"]) >= 1
            if ident is None:
                assert rec["line"] == line_no
    clamped = next(r for r in recs if r.get("id") == "g8")
    assert clamped["usage"]["prompt_tokens"] + clamped["usage"]["completion_tokens"] == 64
    assert clamped["finish_reason"] == "length"
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["errors"] == sum(1 for r in recs if r.get("error") is not None) and s["ok"] + s["errors"] == len(recs)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_input_from_a_pipe_is_read_once_as_a_stream(tmp_path, monkeypatch):
    """-i <(cmd) names a pipe: it runs, every line once and in order, with the progress bar on (a
    pipe cannot be counted ahead); --resume with it runs too (it rereads the output, not the input)."""
    lines = [{"id": f"p{i}", "prompt": f"Hello {i}", "max_tokens": 2} for i in range(5)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    fifo = tmp_path / "in.fifo"
    out = tmp_path / "out.jsonl"
    for args in ([], ["-o", str(out), "--resume"]):
        os.mkfifo(fifo)
        feeder = threading.Thread(target=fifo.write_bytes, args=(data,), daemon=True)
        feeder.start()
        try:
            res = invoke(["generate", "-i", str(fifo), *args], "fake", monkeypatch)
        finally:
            if feeder.is_alive():        # the command never opened the pipe: let the feeder go
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            feeder.join(5)
            fifo.unlink()
        assert res.exit_code == 0, res.stderr
        recs = [json.loads(x) for x in res.stdout.splitlines()] if not args else read_jsonl(out)
        assert [r["id"] for r in recs] == [x["id"] for x in lines] and "5 lines" in res.stderr
    res = invoke(["generate", "-i", "-"], "fake", monkeypatch, input=data)          # "-" is stdin
    assert res.exit_code == 0 and [json.loads(x)["id"] for x in res.stdout.splitlines()] == [x["id"] for x in lines]
    for path, needle in ((tmp_path, "is a directory"), (tmp_path / "missing.jsonl", "does not exist")):
        res = invoke(["generate", "-i", str(path)], "fake", monkeypatch)
        assert res.exit_code == 2 and f"error: --input {path} {needle}" in res.stderr, res.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux: a device that is always full)")
def test_a_full_disk_is_one_error_line_naming_the_file(tmp_path, monkeypatch):
    """A write error of --output or --summary (a full disk) is one line naming the path and the OS
    error, exit 1; the summary records it."""
    inp = _write(tmp_path / "in.jsonl", [{"id": i, "prompt": "Hi", "max_tokens": 2} for i in range(3)])
    full = f"{os.strerror(errno.ENOSPC)} (errno {errno.ENOSPC})"
    summary = tmp_path / "s.json"
    res = invoke(["generate", "-i", str(inp), "-o", "/dev/full", "--no-progress", "--summary", str(summary)], "fake",
                 monkeypatch)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error")]
    assert res.exit_code == 1, res.stderr
    assert errors == [f"error: cannot write the output file /dev/full: {full}"] and "Traceback" not in res.stderr
    assert json.loads(summary.read_text())["failure"] == errors[0].removeprefix("error: ")
    out = tmp_path / "out.jsonl"
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--no-progress", "--summary", "/dev/full"], "fake",
                 monkeypatch)
    assert res.exit_code == 1, res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("error")] == \
        [f"error: cannot write --summary /dev/full: {full}"]
    assert [r["id"] for r in read_jsonl(out)] == [0, 1, 2]          # the output itself is complete


@pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")
def test_engine_error_for_a_request_that_cannot_fit_alone(tmp_path):
    inp = _write(tmp_path / "in.jsonl", [{"id": "small", "prompt": "hi"}, {"id": "big", "prompt": "word " * 60},
                                         {"id": "small2", "prompt": "hello"}])
    out = tmp_path / "out.jsonl"
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--no-progress", "--set", "cache.num_blocks=2",
                  "--set", "cache.block_size=16", "--set", "sampling.max_tokens=4"])
    assert res.exit_code == 3
    small, big, small2 = read_jsonl(out)
    assert big == {"id": "big", "error": big["error"], "line": 2} and big["error"]["type"] == "engine_error"
    assert "num_blocks" in big["error"]["message"]
    assert len(small["token_ids"]) == len(small2["token_ids"]) == 4


@pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")
@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_make_tiny_model_then_generate_with_it(arch, tmp_path):
    res = invoke(["make-tiny-model", str(tmp_path / arch), "--arch", arch, "--seed", "1"])
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / arch / "config.json").exists() and (tmp_path / arch / "tokenizer.json").exists()
    res = invoke(["generate", "--set", f"model={tmp_path / arch}", "--set", "sampling.max_tokens=2"],
                 input=b'{"id": 1, "prompt": "Hello"}\n')
    assert res.exit_code == 0, res.stderr
    assert len(json.loads(res.stdout)["token_ids"]) == 2
    assert invoke(["make-tiny-model", str(tmp_path / "x"), "--arch", "llama"]).exit_code == 2


def test_make_tiny_model_keeps_a_folder_that_holds_files_unless_forced(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "deepseek_v3", "mine": true}\n')
    res = invoke(["make-tiny-model", str(target)])
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    refusal = f"error: {target} exists and is not empty; pass --force to write the tiny checkpoint into it anyway"
    assert res.stderr.splitlines() == [refusal]
    assert [p.name for p in target.iterdir()] == ["config.json"] and "mine" in (target / "config.json").read_text()
    res = invoke(["make-tiny-model", str(target), "--force", "--seed", "3"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == str(target) and "mine" not in (target / "config.json").read_text()
    assert (target / "model.safetensors").exists() and (target / "tokenizer.json").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke(["make-tiny-model", str(empty)]).exit_code == 0            # an empty folder is written into
