"""SIGINT: at any moment of start-up (inside the CLI's own imports, inside the runtime's imports,
at the config, during the model load) and during the run, `generate` exits 130 with the
documented message (not click's "Aborted!", exit 1 or an ImportError traceback), and --summary is
still written with "interrupted": true."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.cli_harness import REAL_ENGINE, ROOT, default_sigint, read_jsonl

from paddle_mla.cli.generate_command import INTERRUPTED, INTERRUPTED_STDOUT
from paddle_mla.cli.interrupts import PAUSE_ANNOUNCEMENT, PAUSE_ENV
from paddle_mla.platform import runtime

TESTS = ROOT / "tests"
needs_real = pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")


def _env(**extra):
    # PYTHONPATH: this checkout's paddle_mla, whatever an editable install points at
    return dict(os.environ, PADDLE_MLA_RUNTIME=runtime.name(), PYTHONPATH=str(ROOT), **extra)


def _wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _stderr_reader(proc):
    """Collects stderr lines in a thread (so the pipe never fills); returns the list."""
    import threading

    lines = []

    def pump():
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _check_interrupted(proc, lines, message=INTERRUPTED):
    proc.wait(timeout=120)
    time.sleep(0.1)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert message in err and "Aborted!" not in err and "Traceback" not in err, err[-3000:]
    return err


def _input(path, n):
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Request {i}: tell me a long story",
                                        "max_tokens": 24, "ignore_eos": True}) + "\n" for i in range(n)))


def test_sigint_while_the_model_loads_exits_130(tmp_path):
    """The fake engine stands in for a slow model load (30 s) so the signal surely lands inside it."""
    inp = tmp_path / "in.jsonl"
    _input(inp, 2)
    summary = tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, str(TESTS / "helpers" / "fake_llm.py"), "generate", "-i", str(inp), "-o",
                             str(tmp_path / "o.jsonl"), "--summary", str(summary), "--no-progress"],
                            env=_env(FAKE_LLM_LOAD_DELAY_S="30"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    lines = _stderr_reader(proc)
    assert _wait_for(lambda: any(x.startswith("paddle-mla: runtime") for x in lines)), "".join(lines)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _check_interrupted(proc, lines)
    s = json.loads(summary.read_text())   # nothing ran, and the summary says so
    assert s["interrupted"] is True and s["requests"] == 0 and s["runtime"] == runtime.name()


# Where start-up can be cut: inside the CLI's own first import (before the options are parsed),
# before the config loads, inside the runtime's imports (torch.nn: torch itself, or Paddle's real
# torch; triton.language: inside `import triton`), and just before the model loads.
_TRITON_AT_START_UP = runtime.name() == "paddle" or os.environ.get("TRITON_INTERPRET") == "1"
START_UP_POINTS = ["import:click", "config", "import:torch.nn",
                   pytest.param("import:triton.language", marks=pytest.mark.skipif(
                       not _TRITON_AT_START_UP, reason="triton is imported at start-up only under paddle or "
                                                       "TRITON_INTERPRET=1")),
                   "load"]


@needs_real
@pytest.mark.parametrize("point", START_UP_POINTS)
def test_sigint_at_each_start_up_point_exits_130_and_writes_the_summary(point, tmp_path):
    inp, out, summary = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "s.json"
    _input(inp, 2)
    proc = subprocess.Popen([sys.executable, "-m", "paddle_mla", "generate", "-i", str(inp), "-o", str(out),
                             "--summary", str(summary), "--no-progress"], env=_env(**{PAUSE_ENV: point}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, preexec_fn=default_sigint)
    lines = _stderr_reader(proc)
    assert _wait_for(lambda: any(x.startswith(PAUSE_ANNOUNCEMENT + point) for x in lines)), "".join(lines)
    proc.send_signal(signal.SIGINT)
    _check_interrupted(proc, lines)
    s = json.loads(summary.read_text())
    assert s["interrupted"] is True and s["requests"] == s["ok"] == s["completion_tokens"] == 0
    assert s["output"] == str(out) and not (out.exists() and out.read_bytes())
    assert ("runtime" in s) == (point == "load")     # what runs is known once the run is described


@needs_real
def test_sigint_during_start_up_of_the_real_cli_exits_130(tmp_path):
    """SIGINT as soon as the CLI has said what runs: the real model load (or the stdin read that
    follows it) is interrupted."""
    proc = subprocess.Popen([sys.executable, "-m", "paddle_mla", "generate", "--no-progress"], env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            preexec_fn=default_sigint)
    lines = _stderr_reader(proc)
    assert _wait_for(lambda: any(x.startswith("paddle-mla: runtime") for x in lines)), "".join(lines)
    proc.send_signal(signal.SIGINT)
    assert "--resume" not in _check_interrupted(proc, lines, INTERRUPTED_STDOUT)     # its output went to stdout
    proc.stdin.close()


@needs_real
def test_sigint_during_the_run_writes_the_summary_and_resume_finishes(tmp_path):
    inp = tmp_path / "in.jsonl"
    n = 12
    _input(inp, n)
    out, summary = tmp_path / "out.jsonl", tmp_path / "s.json"
    args = [sys.executable, "-m", "paddle_mla", "generate", "-i", str(inp), "-o", str(out), "--summary",
            str(summary), "--no-progress", "--set", "scheduler.max_num_seqs=2"]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            preexec_fn=default_sigint)
    lines = _stderr_reader(proc)
    assert _wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 2), "".join(lines)
    proc.send_signal(signal.SIGINT)
    _check_interrupted(proc, lines)
    s = json.loads(summary.read_text())
    written = read_jsonl(out)
    assert s["interrupted"] is True and 2 <= s["ok"] == len(written) < n and s["errors"] == 0
    assert s["completion_tokens"] == 24 * len(written) and s["runtime"] == runtime.name()
    done = subprocess.run([*args, "--resume"], env=_env(), capture_output=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert [r["id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(n)]
    assert json.loads(summary.read_text())["interrupted"] is False


def _interrupted_import(cfg):
    """What a SIGINT inside `import triton` can look like to the CLI: the handler has run, and the
    import surfaces as an ImportError about a half-initialised module."""
    from paddle_mla.cli import interrupts

    interrupts._state.received = True
    raise ImportError("cannot import name 'language' from partially initialized module 'triton'")


def test_an_error_that_follows_a_sigint_is_reported_as_the_interrupt(tmp_path, monkeypatch):
    from helpers.cli_harness import invoke

    from paddle_mla.cli import app as cli
    from paddle_mla.cli import interrupts

    monkeypatch.setattr(interrupts, "_state", interrupts._SigintState())
    monkeypatch.setattr(cli, "select_runtime", _interrupted_import)
    inp, out, summary = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "s.json"
    _input(inp, 2)
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--summary", str(summary), "--no-progress"],
                 "fake", monkeypatch)
    assert res.exit_code == 130 and INTERRUPTED in res.stderr and "ImportError" not in res.stderr, res.stderr
    s = json.loads(summary.read_text())
    assert s["interrupted"] is True and s["requests"] == 0
    res = invoke(["bench", "--workload", "random:num_prompts=1"], "fake", monkeypatch)
    assert res.exit_code == 130 and res.stderr.strip() == "interrupted", res.stderr

    def broken_import(cfg):
        raise ImportError("cannot import name 'language' from partially initialized module 'triton'")

    monkeypatch.setattr(interrupts, "_state", interrupts._SigintState())   # no SIGINT: the error is an error
    monkeypatch.setattr(cli, "select_runtime", broken_import)
    with pytest.raises(ImportError, match="partially initialized"):
        invoke(["generate", "-i", str(inp), "-o", str(out), "--overwrite", "--no-progress"], "fake", monkeypatch)


class _InterruptedLLM:
    """The fake engine, with a Ctrl-C after its first output line."""

    def __init__(self, cfg):
        from helpers.fake_llm import FakeLLM

        self._llm = FakeLLM(cfg, fail_over=None)

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def stream(self, requests):
        for i, out in enumerate(self._llm.stream(requests)):
            if i == 1:
                raise KeyboardInterrupt
            yield out


@pytest.mark.parametrize("when", ["start-up", "run"])
def test_the_interrupt_hint_fits_where_the_output_went(when, tmp_path, monkeypatch):
    """--resume continues an --output file; output to stdout cannot be continued, so its hint says so
    instead of naming --resume."""
    from helpers.cli_harness import invoke

    from paddle_mla.cli import app as cli
    from paddle_mla.cli import interrupts

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _input(inp, 3)
    for output, message in (("-", INTERRUPTED_STDOUT), (str(out), INTERRUPTED)):
        monkeypatch.setattr(interrupts, "_state", interrupts._SigintState())
        if when == "start-up":
            monkeypatch.setattr(cli, "select_runtime", _interrupted_import)
        monkeypatch.setattr(cli, "build_llm", _InterruptedLLM)
        res = invoke(["generate", "-i", str(inp), "-o", output, "--no-progress", "--max-tokens", "2"])
        assert res.exit_code == 130, res.stderr
        assert res.stderr.splitlines()[-1] == message and "Traceback" not in res.stderr
        assert ("--resume" in res.stderr) == (output != "-")
        written = res.stdout.splitlines() if output == "-" else read_jsonl(out) if out.exists() else []
        assert len(written) == (1 if when == "run" else 0)


def test_the_pause_hook_does_nothing_when_unset(monkeypatch):
    from paddle_mla.cli import interrupts

    monkeypatch.delenv(PAUSE_ENV, raising=False)
    finders = list(sys.meta_path)
    interrupts.install_import_pause()
    assert sys.meta_path == finders
    t0 = time.monotonic()
    interrupts.pause_point("config")
    assert time.monotonic() - t0 < 0.05


@needs_real
def test_sigint_after_the_run_finished_keeps_its_exit_code(tmp_path):
    """A Ctrl-C that lands in the interpreter's teardown, once every line and the summary are
    written, ends the process with the run's own code, not by the signal (-2)."""
    inp, out, summary = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "s.json"
    _input(inp, 2)
    proc = subprocess.Popen([sys.executable, "-m", "paddle_mla", "generate", "-i", str(inp), "-o", str(out),
                             "--summary", str(summary), "--no-progress", "--max-tokens", "2"],
                            env=_env(**{PAUSE_ENV: "exit"}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=ROOT, preexec_fn=default_sigint)
    lines = _stderr_reader(proc)
    assert _wait_for(lambda: any(x.startswith(PAUSE_ANNOUNCEMENT + "exit") for x in lines)), "".join(lines)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    assert len(read_jsonl(out)) == 2 and json.loads(summary.read_text())["interrupted"] is False
