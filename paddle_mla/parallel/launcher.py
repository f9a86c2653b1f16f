"""Rank 0 of a tensor-parallel engine: starts the workers, forms the group, sends each step's batch,
and turns a dead worker into one clear error.

``build_runner(config, model_dir)`` is what the engine calls: a plain ModelRunner when
``parallel.tensor_parallel_size`` is 1; otherwise it spawns ranks 1..N-1 (multiprocessing
"spawn", no torchrun), joins them in a torch.distributed group as rank 0, and returns rank 0's
ModelRunner, which sends each step's plain-data scheduler changes to the workers
(``TPDriver.send``) before running the step itself. The scheduler, the sampler and the one host
read stay on rank 0.

Failure handling: a watchdog thread waits on the workers' process sentinels. When one dies, the
step in flight fails (gloo reports the closed peer at once) and is re-raised as
``TensorParallelError`` naming the rank, its exit signal and its traceback when it sent one; an
idle engine raises it at the next step. Where a collective cannot notice the dead peer (NCCL
kernels spin), the watchdog aborts the communicator, and if the engine is still stuck after
``PADDLE_MLA_TP_GRACE_S`` seconds (default 3) it prints the error and exits the process with 1,
so a batch run never hangs: its output so far is intact and ``generate --resume`` completes it.
A step that returns while a worker died during it (an aborted collective lets it finish on partial
sums) raises too: its tokens are not trusted. The close after such a failure runs under the same
deadline (freeing graphs whose collectives an abort did not stop would wait on the device forever).

Shutdown (``close``) never waits on a peer: the workers leave first (each drops its CUDA graphs and
aborts its communicator, then exits), then rank 0 does the same; after a dead worker or a cut step
the live workers are killed instead of asked.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from multiprocessing import connection

from paddle_mla.platform import runtime
from paddle_mla.parallel.process_exit import RESUME_HINT, describe_exit
from paddle_mla.parallel.worker import WorkerSpec, worker_main

TORCH_ONLY = ("parallel.tensor_parallel_size > 1 runs on torch.distributed and is torch-only; "
              "use runtime: torch (the paddle runtime has no tensor-parallel path)")
# how long rank 0's close waits for idle workers to leave (they drop their graphs and abort their
# communicator: well under a second); a worker still there then is killed
LEAVE_S = 5.0


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or failed; the engine cannot go on."""


def build_runner(config, model_dir: str, model=None, plan=None, eos_token_ids: frozenset = frozenset()):
    """The engine's ModelRunner: rank 0 of a tensor-parallel group when the config asks for one.
    ``model``: a prebuilt model (benchmarks with random weights; single rank only). ``plan``: the
    engine's ``RunPlan`` (each tensor-parallel rank resolves the same one itself).
    ``eos_token_ids``: the tokenizer's (rank 0 samples: its runner masks them before min_tokens)."""
    from paddle_mla.worker.model_runner import ModelRunner

    if config.parallel.tensor_parallel_size == 1:
        return ModelRunner(config, model_dir, model=model, plan=plan, eos_token_ids=eos_token_ids)
    if model is not None:
        raise ValueError("a prebuilt model runs on one rank only: set parallel.tensor_parallel_size: 1")
    return TPDriver(config, model_dir).start(eos_token_ids)


class TPDriver:
    def __init__(self, config, model_dir: str):
        if runtime.is_paddle():
            raise TensorParallelError(TORCH_ONLY)
        self.config, self.model_dir = config, model_dir
        self.size = config.parallel.tensor_parallel_size
        self.device_kind = runtime.resolve_device(config.device)
        if self.device_kind == "gpu":
            import torch  # the real torch: this runs only on the torch runtime

            if torch.cuda.device_count() < self.size:
                raise TensorParallelError(f"parallel.tensor_parallel_size {self.size} needs {self.size} GPUs; "
                                          f"this process sees {torch.cuda.device_count()}")
        self.procs: list = []
        self.conns: list = []
        self.group = None
        self._closing = False
        self._busy = 0                 # > 0 while the main thread is inside a guarded call
        self._raised = False
        self._cut = False              # a guarded call ended by an exception: workers may be mid-step
        self._interrupted = False      # ... by Ctrl-C
        self._runner = None            # weakref to rank 0's ModelRunner (its graphs go before the group)
        # after the abort, how long a stuck step (or the close after a failure) may take before exit
        self.grace_s = float(os.environ.get("PADDLE_MLA_TP_GRACE_S", "3"))

    # -- start-up ---------------------------------------------------------------------------
    def start(self, eos_token_ids: frozenset = frozenset()):
        from paddle_mla.worker.model_runner import ModelRunner
        from paddle_mla.parallel.group import TPGroup, master_store
        from paddle_mla.parallel.worker import Rendezvous

        store = master_store(self.size)
        rdzv = Rendezvous("127.0.0.1", store.port, self.size, self.device_kind)
        ctx = mp.get_context("spawn")
        for rank in range(1, self.size):
            parent, child = ctx.Pipe()
            spec = WorkerSpec(rank, rdzv, self.config, self.model_dir, os.getpid())
            proc = ctx.Process(target=worker_main, args=(spec, child), name=f"paddle-mla-tp{rank}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        atexit.register(self.close)
        threading.Thread(target=self._watch, name="paddle-mla-tp-watchdog", daemon=True).start()
        try:
            with self.guard():
                for rank, conn in enumerate(self.conns, start=1):
                    self._wait_for(rank, conn, "joining")
                par = self.config.parallel
                self.group = TPGroup.join(0, rdzv, store, par.expert_parallel, par.attention_rows)
                runner = ModelRunner(self.config, self.model_dir, tp=self.group, eos_token_ids=eos_token_ids)
                for rank, conn in enumerate(self.conns, start=1):
                    self._wait_for(rank, conn, "ready")
        except BaseException:
            self.close()
            raise
        runner.tp_driver = self     # its launch and read run in guard(): a dead worker -> TensorParallelError
        self._runner = weakref.ref(runner)
        return runner

    def _wait_for(self, rank: int, conn, what: str) -> None:
        """The worker's ``what`` message, or its start-up failure as a TensorParallelError."""
        proc = self.procs[rank - 1]
        while not conn.poll(0.2):
            if proc.exitcode is not None and not conn.poll():
                raise TensorParallelError(self.failure() or f"tensor-parallel worker {rank} exited at start-up")
        msg = conn.recv()
        if msg[0] != what:
            detail = msg[1].rstrip() if len(msg) > 1 else msg[0]
            raise TensorParallelError(f"tensor-parallel worker rank {rank} failed at start-up:\n{detail}")

    # -- each step --------------------------------------------------------------------------
    def send(self, msg) -> None:
        """Hand this step's scheduler changes (sched/output.py ``StepInput``: plain data, small) to
        every worker; each applies them to its own input batch (called by rank 0's runner)."""
        for conn in self.conns:
            conn.send(msg)

    @contextmanager
    def guard(self):
        """Around rank 0's work with the workers (a step's launch, its read): a worker found dead
        before or after raises TensorParallelError with its traceback, and an interrupted or failed
        call marks the group cut (close aborts instead of draining)."""
        self._busy += 1
        finished = False
        try:
            failure = self.failure()
            if failure:
                raise TensorParallelError(failure)
            yield
            failure = self.failure()     # died during the call: an aborted collective's sums are partial
            if failure:
                raise TensorParallelError(failure)
            finished = True
        except TensorParallelError:
            self._raised = True
            raise
        except KeyboardInterrupt:
            self._interrupted = True
            raise
        except Exception as exc:
            failure = self.failure(wait_s=5.0)   # the exit may be seen a moment after the error
            if failure:
                self._raised = True
                raise TensorParallelError(failure) from exc
            raise
        finally:
            self._busy -= 1
            if not finished:          # also KeyboardInterrupt: the workers may wait in a collective
                self._cut = True

    def failure(self, wait_s: float = 0.0) -> str | None:
        """One line (+ the worker's traceback) for the first dead worker; None while all live."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
                if proc.exitcode is None:
                    continue
                detail = ""
                try:
                    while conn.poll():
                        msg = conn.recv()
                        if msg[0] == "error":
                            detail = "\n" + msg[1].rstrip()
                except (EOFError, OSError):
                    pass
                return (f"tensor-parallel worker rank {rank} (pid {proc.pid}) died ({describe_exit(proc.exitcode)}); "
                        f"the engine stops; {RESUME_HINT}{detail}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _watch(self) -> None:
        while not self._closing:
            if not connection.wait([p.sentinel for p in self.procs], timeout=1.0) or self._closing:
                continue
            if not self._busy:          # idle: the next guarded call raises it
                return
            if self.group is not None and self.device_kind == "gpu":
                # NCCL kernels waiting on the dead rank never return otherwise. The abort can block
                # too (measured: rank 0's host inside an eager all-reduce's enqueue holds the
                # communicator), so it runs on its own thread and the deadline below still holds.
                threading.Thread(target=self.group.abort, name="paddle-mla-tp-abort", daemon=True).start()
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline and self._busy and not self._raised:
                time.sleep(0.2)
            if self._busy and not self._raised and not self._closing:
                sys.stderr.write(f"error: {self.failure()} (the engine was stuck {self.grace_s:.0f} s "
                                 "waiting on it: exiting)\n")
                sys.stderr.flush()
                os._exit(1)
            return

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Workers leave first, then rank 0; nothing waits on a peer that is gone.

        Clean (every worker alive and idle, no step cut short): each worker gets the goodbye, drops
        its graphs, aborts its communicator and exits; rank 0 waits ``LEAVE_S`` at most for that.
        Otherwise (a worker died, or a step was interrupted or failed, so a live worker may sit in
        a collective that will never complete) the workers are killed at once. Rank 0 then drops
        its own graphs and aborts its communicator (``TPGroup.leave``)."""
        if self._closing:
            return
        self._closing = True
        atexit.unregister(self.close)
        clean = not self._cut and all(proc.exitcode is None for proc in self.procs)
        # the reason is taken now: _close kills the live workers, after which every one looks dead
        deadline = None if clean else self._exit_unless_closed(self.grace_s, self.failure())
        try:
            self._close(clean)
        finally:
            if deadline is not None:
                deadline.cancel()

    def _exit_unless_closed(self, seconds: float, failure: str | None) -> threading.Timer:
        """After a failure, close must not hang either: freeing graphs or the communicator waits on the
        device, where a collective the abort did not stop still spins. The process exits instead,
        naming ``failure`` (a dead worker), else the interrupt or the failed step."""
        def expire() -> None:
            reason = failure or ("interrupted" if self._interrupted else "a tensor-parallel step failed")
            sys.stderr.write(f"error: {reason} (closing the engine took over {seconds:.0f} s: exiting)\n")
            sys.stderr.flush()
            os._exit(130 if self._interrupted and not failure else 1)

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        return timer

    def _close(self, clean: bool) -> None:
        if clean:
            for conn in self.conns:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    clean = False
        deadline = time.monotonic() + (LEAVE_S if clean else 0.0)
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()            # SIGKILL: a worker blocked inside a collective cannot delay it
                proc.join(timeout=LEAVE_S)
                clean = False
        for conn in self.conns:
            conn.close()
        if self.group is not None:
            runner = self._runner() if self._runner is not None else None
            # clean: the workers drained every collective rank 0 queued (an overlapped step may still
            # be unread), so rank 0's own queue ends too and its graphs are freed idle
            self.group.leave(runner, drain=clean)
