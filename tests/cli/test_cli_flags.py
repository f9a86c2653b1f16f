"""Flags people expect: --model/--max-tokens/--temperature/--top-p/--top-k as
shortcuts for --set, ``python -m paddle_mla``, and the stdin hint of a bare generate at a terminal."""

import json
import os
import select
import subprocess
import sys
import time

import pytest
from helpers.cli_harness import REAL_ENGINE, ROOT, invoke

from paddle_mla.cli import app as cli
from paddle_mla.platform import runtime
from paddle_mla.cli.generate_command import STDIN_HINT


class _Loaded(Exception):
    pass


def test_shortcuts_set_the_config(monkeypatch, tmp_path):
    from paddle_mla.models import ensure_tiny_model

    seen = []

    def build(cfg):
        seen.append(cfg)
        raise _Loaded

    monkeypatch.setattr(cli, "build_llm", build)
    model = str(ensure_tiny_model())
    with pytest.raises(_Loaded):
        invoke(["generate", "--model", model, "--max-tokens", "7", "--temperature", "0.5", "--top-p", "0.9",
                "--top-k", "5"], input=b"")
    (cfg,) = seen
    assert cfg.model == model
    s = cfg.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k) == (7, 0.5, 0.9, 5)
    seen.clear()   # a shortcut wins over --set of the same key; other --set keys stay
    with pytest.raises(_Loaded):
        invoke(["generate", "--set", "sampling.max_tokens=3", "--max-tokens", "4", "--set", "seed=9"], input=b"")
    assert (seen[0].sampling.max_tokens, seen[0].seed) == (4, 9)
    res = invoke(["generate", "--top-p", "1.5"], input=b"")
    assert res.exit_code == 2 and "sampling.top_p" in res.stderr
    assert invoke(["generate", "--max-tokens", "0"], input=b"").exit_code == 2


@pytest.mark.skipif(not REAL_ENGINE, reason="needs the real engine")
def test_shortcuts_through_the_real_engine(tmp_path):
    res = invoke(["make-tiny-model", str(tmp_path / "m"), "--seed", "3"])
    assert res.exit_code == 0, res.stderr
    res = invoke(["generate", "--model", str(tmp_path / "m"), "--max-tokens", "3", "--temperature", "0.8",
                  "--top-k", "4", "--top-p", "0.9"], input=b'{"id": 1, "prompt": "Hello", "ignore_eos": true}\n')
    assert res.exit_code == 0, res.stderr
    assert len(json.loads(res.stdout)["token_ids"]) == 3
    assert f"model {tmp_path / 'm'}" in res.stderr.splitlines()[0]


def _env():
    return dict(os.environ, PADDLE_MLA_RUNTIME=runtime.name(), PYTHONPATH=str(ROOT))


def test_python_dash_m_paddle_mla(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paddle_mla", "--help"], capture_output=True, text=True, cwd=ROOT,
                          env=_env(), timeout=60)
    assert proc.returncode == 0 and "Usage: paddle-mla" in proc.stdout and "generate" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "paddle_mla", "generate", "--no-progress", "--max-tokens", "2"],
                          input=b'{"id": "a", "prompt": "Hi"}\n', capture_output=True, cwd=ROOT, env=_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert json.loads(proc.stdout)["id"] == "a"
    assert STDIN_HINT not in proc.stderr.decode()            # a pipe is not a terminal: no hint


def _read_until(fd, needle: bytes, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data


def test_bare_generate_at_a_terminal_says_it_reads_stdin():
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "paddle_mla", "generate", "--no-progress", "--max-tokens", "2"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=_env())
    os.close(slave)
    try:
        err = _read_until(proc.stderr.fileno(), b"Ctrl-D", 120)
        assert STDIN_HINT.encode() in err, err.decode()
        assert err.decode().splitlines()[0].startswith("paddle-mla: runtime")
        os.write(master, b'{"id": "t", "prompt": "Hi"}\n')
        os.write(master, b"\x04")                             # Ctrl-D at the start of a line: end of input
        out, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 0, (err + rest).decode()[-2000:]
    assert json.loads(out)["id"] == "t"
