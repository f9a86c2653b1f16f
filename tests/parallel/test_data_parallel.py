"""Data-parallel replicas (parallel.data_parallel_size): the output file of DP=2 is the one DP=1
writes (same greedy tokens, same order, error lines in place); a replica that dies ends the run with
a clear error, a killed parent leaves no replica behind, and --resume then completes the file with
every line once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_harness import ROOT, invoke, read_jsonl

from paddle_mla.platform import runtime
from paddle_mla.config.schema import ConfigError, load_config
from paddle_mla.integrations.data_parallel import replica_envs

BASE = ["--no-progress", "--set", "sampling.max_tokens=5", "--set", "scheduler.max_num_seqs=3"]


def _lines(n=30):
    lines = []
    for i in range(n):
        if i % 11 == 4:
            lines.append(json.dumps({"id": f"bad-{i}", "prompt_token_ids": [3], "top_p": 9}))   # error line
        elif i % 7 == 2:
            lines.append(json.dumps({"prompt_token_ids": [5 + i % 9, 6, 7]}))                 # keyed by line
        else:
            lines.append(json.dumps({"id": f"r{i}", "prompt_token_ids": [5 + i % 13, 9, 11 + i % 5] * (1 + i % 3),
                                     "max_tokens": 2 + i % 6}))
    return lines


def _reference(tmp_path: Path, lines: list[str]) -> list[dict]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "ref.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    res = invoke(["generate", "-i", str(inp), "-o", str(out), *BASE])
    assert res.exit_code == 3, res.output
    return read_jsonl(out)


def test_replica_placement():
    cfg = load_config(None, ("parallel.data_parallel_size=2", "parallel.tensor_parallel_size=2"))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    assert replica_envs(cfg, "gpu", 4) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    with pytest.raises(ConfigError, match="needs 4 GPUs; this process sees 3"):
        replica_envs(cfg, "gpu", 3)
    os.environ["CUDA_VISIBLE_DEVICES"] = "5,7,1,2"
    try:
        one = load_config(None, ("parallel.data_parallel_size=3",))
        assert [e["CUDA_VISIBLE_DEVICES"] for e in replica_envs(one, "gpu", 4)] == ["5", "7", "1"]
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES")


def test_dp2_output_file_equals_dp1(tmp_path):
    lines = _lines()
    want = _reference(tmp_path, lines)
    out, summary = tmp_path / "dp2.jsonl", tmp_path / "summary.json"
    res = invoke(["generate", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *BASE,
                  "--set", "parallel.data_parallel_size=2", "--summary", str(summary)])
    assert res.exit_code == 3, res.output
    got = read_jsonl(out)
    assert got == want
    assert (tmp_path / "ref.jsonl").read_bytes() == out.read_bytes()
    data = json.loads(summary.read_text())
    assert data["data_parallel_size"] == 2
    assert data["ok"] + data["errors"] == len(lines)
    assert data["completion_tokens"] == sum(len(r["token_ids"]) for r in got if "token_ids" in r)


def _replica_pids(pid: int) -> list[int]:
    """The spawned replica processes among ``pid``'s children (not multiprocessing's resource tracker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in map(int, children):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_lines(path: Path, n: int, proc, timeout: float = 300) -> None:
    """Wait for n output lines; the guard is long because three engine processes start first (a 2-core
    box under load took over 120 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {n} lines (exit {proc.poll()})")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the replica processes")
def test_dead_replica_then_killed_parent_then_resume(tmp_path):
    lines = _lines(60)
    want = _reference(tmp_path, lines)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PADDLE_MLA_RUNTIME=runtime.name(), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "paddle_mla", "generate", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *BASE,
           "--set", "parallel.data_parallel_size=2"]

    # 1. A replica dies a few lines into the run (60 lines: long enough not to end first).
    proc = subprocess.Popen([*cmd, "--overwrite"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_lines(out, 4, proc)
    replicas = _replica_pids(proc.pid)
    assert len(replicas) == 2, replicas
    os.kill(replicas[1], signal.SIGKILL)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err[-3000:]
    assert f"data-parallel replica 1 (pid {replicas[1]}) died (killed by SIGKILL)" in err, err[-3000:]
    assert "rerun with --resume" in err
    first = read_jsonl(out)
    assert 4 <= len(first) < len(lines)
    assert first == want[:len(first)]
    assert not _alive(replicas[0])

    # 2. Resume, and SIGKILL the parent itself mid-run: its replicas must not outlive it.
    proc = subprocess.Popen([*cmd, "--resume"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_lines(out, len(first) + 1, proc)
    replicas = _replica_pids(proc.pid)
    assert len(replicas) == 2, replicas
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(map(_alive, replicas)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, replicas)), "a replica outlived its killed parent"

    # 3. Resume to the end: every line once, equal to the uninterrupted single-engine run.
    done = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, timeout=180, check=False)
    assert done.returncode == 3, done.stderr.decode()[-3000:]
    assert read_jsonl(out) == want


def test_replicas_after_the_first_start_once_it_is_ready(monkeypatch):
    """Replica 0 warms the shared kernel caches alone; the others start only after it reported ready,
    and a replica 0 that fails to load starts no other."""
    from paddle_mla.integrations import data_parallel as dp

    events = []

    class FakeReplica:
        def __init__(self, ctx, spec):
            self.index = spec.index
            events.append(f"start{spec.index}")

    def ready(self, r):
        events.append(f"ready{r.index}")
        if fail_first and r.index == 0:
            raise RuntimeError("load failed")
        return ({}, 64, None, 4, "model")

    monkeypatch.setattr(dp, "_Replica", FakeReplica)
    monkeypatch.setattr(dp.DataParallelLLM, "_wait_ready", ready)
    monkeypatch.setattr(dp.DataParallelLLM, "close", lambda self: events.append("close"))
    monkeypatch.setattr(dp.DataParallelLLM, "reset_stats", lambda self: None)
    monkeypatch.setattr("paddle_mla.engine.tokenizer.load_tokenizer", lambda path: None)
    cfg = load_config(None, ("parallel.data_parallel_size=3", "device=cpu"))
    fail_first = False
    dp.DataParallelLLM(cfg)
    assert events[:4] == ["start0", "ready0", "start1", "start2"] and events[4:] == ["ready1", "ready2"]
    events.clear()
    fail_first = True
    with pytest.raises(RuntimeError, match="load failed"):
        dp.DataParallelLLM(cfg)
    assert events == ["start0", "ready0", "close"]
