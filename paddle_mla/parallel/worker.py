"""The loop of tensor-parallel ranks 1..N-1 (a spawned process each; rank 0 is the engine itself).

A worker loads its shards, builds its own ModelRunner (KV caches, backend, CUDA graphs), says
"ready", then runs every step rank 0 sends: the scheduler's plain-data changes (``StepInput``)
applied to its own persistent input batch, then the same model call as rank 0 (``worker_step``: its
collectives pair with rank 0's; the logits are dropped, rank 0 samples; under overlapped scheduling
rank 0's sampled ids arrive by a broadcast after the step, for the next step's decode rows on the
device). ``None`` ends the loop:
the worker leaves the group (its graphs dropped, then its communicator aborted: nothing waits on
rank 0) and exits at once. A failure is sent to rank 0 as text before the worker exits; a worker
whose rank 0 is gone (its pipe closes or its parent changes) exits at once.

Test hook: ``PADDLE_MLA_TP_TEST_KILL=RANK:STEPS`` makes that rank kill itself (SIGKILL) after
STEPS steps, so the dead-worker path and ``--resume`` after it can be tested end to end.
Benchmark hook: a ``ProfileControl`` message between steps (``benchmarks.e2e.tensor_parallel
--profile``) records the steps that follow under ``torch.profiler`` (optionally without the CUDA
graphs) and writes this rank's Chrome trace at the stop; it runs nothing on the device itself.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

KILL_ENV = "PADDLE_MLA_TP_TEST_KILL"


@dataclass
class Rendezvous:
    """Where ranks meet: rank 0's TCPStore (plain data, sent to the workers)."""

    host: str
    port: int
    size: int
    device_kind: str               # 'cpu' (gloo) | 'gpu' (nccl)
    timeout_s: float = 1800.0      # collectives: covers one rank loading weights slower than another


@dataclass
class WorkerSpec:
    rank: int
    rdzv: Rendezvous
    config: Any                  # the resolved EngineConfig
    model_dir: str
    parent_pid: int


@dataclass
class ProfileControl:
    """Benchmarks: sent by rank 0 (``TPDriver.send``) between steps, in step order.

    ``eager``: set this rank's CUDA graphs aside (the steps run eagerly) / ``graphs``: put them back;
    ``start``: record the following steps under ``torch.profiler`` (CPU, and CUDA on a GPU);
    ``stop``: wait for the device, stop, and write the Chrome trace to ``path`` with ``{rank}``
    filled in (written to a temporary name, then renamed: a reader never sees half a file); an
    empty ``path`` drops the trace (a warm-up cycle)."""

    action: str             # "eager" | "graphs" | "start" | "stop"
    path: str = ""          # stop: where the trace goes ("": nowhere)


class RankProfile:
    """One rank's side of ProfileControl (each worker's, and rank 0's in the TP benchmark)."""

    def __init__(self, rank: int):
        self.rank, self.prof, self.graphs = rank, None, None   # graphs: those set aside by "eager"

    def handle(self, msg: ProfileControl, runner) -> None:
        from paddle_mla.platform import runtime

        if msg.action == "eager" and self.graphs is None:
            self.graphs, runner.graphs = runner.graphs, None
        elif msg.action == "graphs" and self.graphs is not None:
            runner.graphs, self.graphs = self.graphs, None
        elif msg.action == "start":
            from torch.profiler import ProfilerActivity, profile   # the real torch: TP is torch-only

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.device_kind == "gpu" else [])
            self.prof = profile(activities=acts)
            self.prof.start()
        elif msg.action == "stop" and self.prof is not None:
            runtime.synchronize()            # the window's kernels are done before the trace is taken
            self.prof.stop()
            if msg.path:                     # no path: a cycle that only warms the profiler up
                path = msg.path.format(rank=self.rank)
                tmp = path + ".part" + (".gz" if path.endswith(".gz") else "")
                self.prof.export_chrome_trace(tmp)
                os.replace(tmp, path)
            self.prof = None


def _exit_with_parent(parent_pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:   # rank 0 died (we were re-parented): nobody needs us
            os._exit(1)


def _kill_after(rank: int) -> int | None:
    spec = os.environ.get(KILL_ENV, "")
    if ":" not in spec:
        return None
    who, steps = spec.split(":", 1)
    return int(steps) if int(who) == rank else None


def worker_main(spec: WorkerSpec, conn) -> None:
    # Ctrl-C reaches the whole process group: rank 0 handles it (exit 130, output intact); a worker
    # dying of it first would turn the interrupt into a "worker died" error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(spec.parent_pid,), daemon=True).start()
    try:
        from paddle_mla.platform import runtime

        runtime.select("torch")
        import tqdm

        # tqdm's default lock is a multiprocessing semaphore that a killed worker would leak
        # (a resource_tracker warning after the real error); a worker draws no bars
        tqdm.tqdm.set_lock(threading.RLock())
        from paddle_mla.worker.model_runner import ModelRunner
        from paddle_mla.attention.forward_meta import StepBatch
        from paddle_mla.parallel.group import TPGroup

        conn.send(("joining",))      # imports done: rank 0 now waits in the rendezvous, not before
        par = spec.config.parallel
        group = TPGroup.join(spec.rank, spec.rdzv, expert_parallel=par.expert_parallel,
                             attention_rows=par.attention_rows)
        runner = ModelRunner(spec.config, spec.model_dir, tp=group)
        # head-wise SWA: the input state rebuilds the table rows from the scheduler's deltas with the
        # pool's layout; rank 0's scheduler allocates, this copy only describes (the same on every rank)
        runner.attach_pool(runner.new_block_pool())
        conn.send(("ready",))
        kill_after, steps = _kill_after(spec.rank), 0
        profiler = RankProfile(spec.rank)
        while True:
            msg = conn.recv()     # the scheduler's plain-data StepInput, as rank 0's runner applies it
            if msg is None:
                break
            if isinstance(msg, ProfileControl):
                profiler.handle(msg, runner)
                continue
            if isinstance(msg, StepBatch):   # a whole batch (benchmarks, tests)
                runner.forward_step(msg)
            else:                            # the scheduler's changes (engine steps)
                runner.worker_step(msg)
            steps += 1
            if kill_after is not None and steps >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    except EOFError:          # rank 0 closed the pipe without a goodbye: it is gone
        os._exit(1)
    except BaseException:     # noqa: BLE001 - reported to rank 0, then out without teardown
        try:
            conn.send(("error", traceback.format_exc(limit=8)))
        except Exception:  # noqa: BLE001
            pass
        os._exit(1)
    # rank 0's goodbye: every collective this rank queued has its partners run, so the drain ends;
    # then out at once (interpreter teardown of CUDA and NCCL state can block on a gone peer)
    group.leave(runner, drain=True)
    conn.close()
    os._exit(0)
