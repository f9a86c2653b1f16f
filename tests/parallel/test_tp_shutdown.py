"""A tensor-parallel ``paddle-mla generate`` always ends, quickly: after its last output line, on
SIGINT (exit 130, no worker left behind) and when a worker is killed (one clear error line).

Each case runs the CLI as a subprocess with a TP=2 tiny model (one spawned worker) and reads its
stdout line by line with timestamps. Every process of a run carries a unique environment marker,
so a worker that outlives its run is found in /proc. The GPU variant (2 GPUs, NCCL, with and without
CUDA graphs) is ``test_tp_shutdown_gpu.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.cli_harness import ROOT, default_sigint

from paddle_mla.platform import runtime
from paddle_mla.parallel.launcher import TORCH_ONLY

pytestmark = pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)

MARK = "PADDLE_MLA_TEST_RUN_MARK"
EXIT_AFTER_LAST_LINE_S = 5.0


@dataclass
class Run:
    """A running ``generate``: its stdout lines with their arrival times, and its processes."""

    proc: subprocess.Popen
    mark: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    first_line: threading.Event = field(default_factory=threading.Event)
    readers: list[threading.Thread] = field(default_factory=list)

    def read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))
            self.first_line.set()
        self.first_line.set()

    def read_stderr(self) -> None:
        self.err.extend(self.proc.stderr)

    def workers(self) -> list[int]:
        """Pids of this run's spawned processes (the TP worker) still alive."""
        return [pid for pid in _pids_with(self.mark) if pid != self.proc.pid and b"spawn_main" in _cmdline(pid)]


def _pids_with(mark: str) -> list[int]:
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:       # gone meanwhile, or not ours to read
            continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Request {i}: " + "abc " * (i % 5)}) + "\n"
                            for i in range(n)))
    return path


def start(inp: Path, *overrides: str, tp: int = 2) -> Run:
    """``generate`` at TP=``tp``, records on stdout (the lines timed), on the device ``overrides`` name."""
    mark = uuid.uuid4().hex
    # PYTHONFAULTHANDLER: a hung run is stopped with SIGABRT, which then prints where every thread was
    env = dict(os.environ, PADDLE_MLA_RUNTIME="torch", PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1", **{MARK: mark})
    cmd = [sys.executable, "-m", "paddle_mla.cli.app", "generate", "-i", str(inp), "-o", "-", "--no-progress",
           "--set", f"parallel.tensor_parallel_size={tp}", *[a for o in overrides for a in ("--set", o)]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    run = Run(proc, mark)
    run.readers = [threading.Thread(target=fn, daemon=True) for fn in (run.read_stdout, run.read_stderr)]
    for reader in run.readers:
        reader.start()
    return run


def finish(run: Run, timeout: float) -> tuple[int, float, str]:
    """Exit code, the time it exited, and stderr; a run still alive after ``timeout`` is a hang."""
    try:
        run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.proc.send_signal(signal.SIGABRT)      # the faulthandler's stack dump goes to stderr
        try:
            run.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pid in _pids_with(run.mark):
            os.kill(pid, signal.SIGKILL)
        for reader in run.readers:
            reader.join(timeout=10)
        raise AssertionError(f"generate still running {timeout:.0f} s on: a hang; its stderr ends:\n"
                             + "".join(run.err)[-6000:]) from None
    ended = time.monotonic()
    for reader in run.readers:     # the pipes close with the process (and any worker holding them)
        reader.join(timeout=10)
    return run.proc.returncode, ended, "".join(run.err)


def assert_no_worker_left(run: Run) -> None:
    deadline = time.monotonic() + 2.0      # a killed process is reaped by init a moment later
    while run.workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = run.workers()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes outlived generate: {left}"


def check_exits_after_last_line(inp: Path, *overrides: str, tp: int = 2) -> None:
    run = start(inp, *overrides, tp=tp)
    code, ended, err = finish(run, timeout=300)
    assert code == 0, err[-2000:]
    assert len(run.lines) == len(inp.read_text().splitlines())
    lag = ended - run.lines[-1][0]
    assert lag < EXIT_AFTER_LAST_LINE_S, f"exited {lag:.1f} s after its last line"
    assert_no_worker_left(run)


CPU = ("device=cpu", "sampling.max_tokens=6", "scheduler.max_num_seqs=3")
# long enough that SIGINT and the kill land mid-run: records stream out over many seconds
CPU_LONG = ("device=cpu", "sampling.max_tokens=48", "sampling.ignore_eos=true", "scheduler.max_num_seqs=2")


def test_tp2_exits_soon_after_its_last_line(tmp_path):
    check_exits_after_last_line(write_prompts(tmp_path / "in.jsonl", 6), *CPU)


def check_sigint_exits_130_promptly(inp: Path, *overrides: str, tp: int = 2) -> None:
    """SIGINT mid-run: exit 130 within 5 s, one "interrupted" message, no worker left. ``inp`` must
    hold more records than stream out before the first line plus the signal's delivery."""
    total = len(inp.read_text().splitlines())
    run = start(inp, *overrides, tp=tp)
    assert run.first_line.wait(240) and run.lines, "no output line"
    assert len(run.workers()) == tp - 1, "the TP workers were not found while generating"
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    code, ended, err = finish(run, timeout=60)
    assert code == 130, err[-2000:]
    assert ended - sent < EXIT_AFTER_LAST_LINE_S, f"exited {ended - sent:.1f} s after SIGINT"
    assert "interrupted" in err
    assert len(run.lines) < total, "the run ended before the interrupt: nothing was tested"
    assert_no_worker_left(run)


def check_killed_worker_fails_promptly(inp: Path, *overrides: str, tp: int = 2) -> None:
    """One worker SIGKILLed mid-run: exit 1 within 5 s, one error line naming that worker, no
    traceback, no worker left (the others are stopped, not awaited)."""
    total = len(inp.read_text().splitlines())
    run = start(inp, *overrides, tp=tp)
    assert run.first_line.wait(240) and run.lines, "no output line"
    workers = run.workers()
    assert len(workers) == tp - 1, "the TP workers were not found while generating"
    worker = workers[0]
    killed = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    code, ended, err = finish(run, timeout=60)
    assert code == 1, err[-2000:]
    assert ended - killed < EXIT_AFTER_LAST_LINE_S, f"exited {ended - killed:.1f} s after the kill"
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-2000:]
    assert re.match(rf"error: tensor-parallel worker rank [1-9]\d* \(pid {worker}\) died \(killed by SIGKILL\)",
                    errors[0]), errors[0]
    assert "Traceback" not in err, err[-2000:]
    assert len(run.lines) < total, "the run ended before the kill: nothing was tested"
    assert_no_worker_left(run)


def test_sigint_exits_130_promptly_and_leaves_no_worker(tmp_path):
    check_sigint_exits_130_promptly(write_prompts(tmp_path / "in.jsonl", 60), *CPU_LONG)


def test_killed_worker_fails_promptly_with_one_line(tmp_path):
    check_killed_worker_fails_promptly(write_prompts(tmp_path / "in.jsonl", 60), *CPU_LONG)


def _tp2_llm():
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({"runtime": "torch", "device": "cpu", "dtype": "float32",
                                "parallel": {"tensor_parallel_size": 2}}))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.generate([GenerationRequest(0, [5, 17, 33, 2], params)], use_tqdm=False)
    return llm


def test_workers_leave_before_rank0_leaves_the_group(monkeypatch):
    """The order that keeps NCCL from waiting on a peer: every worker has exited (having left the
    group itself) before rank 0 drops its graphs and aborts its communicator."""
    from paddle_mla.parallel.group import TPGroup

    llm = _tp2_llm()
    driver = llm.runner.tp_driver
    seen = []
    real_leave = TPGroup.leave

    def leave(group, runner=None, drain=False):
        seen.append(([p.exitcode for p in driver.procs], runner is llm.runner))
        real_leave(group, runner, drain)

    monkeypatch.setattr(TPGroup, "leave", leave)
    llm.close()
    assert seen == [([0], True)]


def test_close_after_a_worker_died_does_not_wait():
    llm = _tp2_llm()
    driver = llm.runner.tp_driver
    (proc,) = driver.procs
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    t0 = time.monotonic()
    llm.close()
    assert time.monotonic() - t0 < 2.0
    assert proc.exitcode == -signal.SIGKILL


def test_a_step_that_returns_after_a_worker_died_raises():
    """An aborted NCCL all-reduce lets the step finish on partial sums: its tokens must not count."""
    from paddle_mla.parallel.launcher import TensorParallelError

    llm = _tp2_llm()
    driver = llm.runner.tp_driver
    (proc,) = driver.procs
    try:
        with pytest.raises(TensorParallelError, match=r"worker rank 1 .* died \(killed by SIGKILL\)"):
            with driver.guard():          # the step itself "succeeds"; the worker dies meanwhile
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(10)
    finally:
        llm.close()


def test_a_close_that_hangs_after_a_failure_exits_the_process(monkeypatch, capsys):
    from paddle_mla.parallel import launcher

    llm = _tp2_llm()
    driver = llm.runner.tp_driver
    (proc,) = driver.procs
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    codes = []
    monkeypatch.setattr(launcher.os, "_exit", codes.append)
    driver._exit_unless_closed(0.05, driver.failure()).join(5)   # the timer fires: a close that never finished
    driver._interrupted = True                 # Ctrl-C, no dead worker: 130, and not blamed on a worker
    driver._exit_unless_closed(0.05, None).join(5)
    llm.close()
    assert codes == [1, 130]
    err = capsys.readouterr().err.strip().splitlines()
    assert re.match(r"error: tensor-parallel worker rank 1 .* died \(killed by SIGKILL\).*exiting\)$", err[-2])
    assert re.match(r"error: interrupted \(closing the engine took over 0 s: exiting\)$", err[-1])
