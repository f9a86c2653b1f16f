"""Data-parallel replicas (``parallel.data_parallel_size`` M): M engine processes share one input stream.

``DataParallelLLM`` stands where ``LLM`` stands for ``generate``: the parent process keeps the whole
JSONL side (parsing, validation, seeds, ordering, the output file and ``--resume``, all in
batch.run / batch.io, unchanged) and hands the validated requests to M replica processes, each one
``LLM`` (tensor-parallel itself when ``tensor_parallel_size`` > 1). Its ``stream`` yields the outputs
in input order, so the output file is the one a single engine writes, and resuming works as it does
there.

- Placement: replica i sees GPUs ``[i*N, (i+1)*N)`` of the parent's visible GPUs (N the tensor-parallel
  size) through ``CUDA_VISIBLE_DEVICES``, set before the process starts; on CPU the replicas split the
  cores (``OMP_NUM_THREADS``, unless set).
- Dispatch (``dp_dispatch.py``): the next request goes to the replica with the least expected work
  (prompt + n x max_tokens tokens) sent and not yet returned, among those under a bound of twice the
  engine's read-ahead (``LLM.stream_window``) requests not yet written; memory stays bounded by M x
  the bound, also when one replica runs ahead of another. Work, not request count, so that replicas
  given requests of different lengths finish together.
- A replica's engine steps as soon as it holds requests and takes the later batches between steps
  (``dp_replica._requests``): it blocks on its input only when it has nothing to run, and the parent
  always tops it up once its finished outputs are written, so the pipeline cannot deadlock.
- Messages: the parent sends a replica's new requests as lists (up to 64, or what was read in 2 ms;
  a request read from a slow source waits at most until the next one is read), and a replica's
  outputs leave through a sender thread that sends whatever has gathered as one message, so the
  engine thread never waits on a pipe (one message per request or output cost a single-GPU replica
  0.88x the in-process engine: 290 ms to its first token and about 20 ms per finishing wave at 2048
  requests, BENCHMARKS.md, "Tensor and data parallel").
- Start-up: replica 0 loads and warms up first; the others start once it is ready and reuse what it
  compiled from the shared on-disk kernel caches.
- Failure: a replica that dies (or raises) ends the run with ``DataParallelError`` naming it; the
  outputs written so far are intact and ``generate --resume`` completes the file.

Processes are started with multiprocessing "spawn" and are not daemons (a tensor-parallel replica
starts its own workers). This module imports no tensor library.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing import connection

from paddle_mla.config.schema import ConfigError, EngineConfig
from paddle_mla.integrations.dp_dispatch import ReplicaLoad, ReplicaRun, pick, request_work
from paddle_mla.integrations.dp_replica import ReplicaSpec, StreamEnd, replica_main
from paddle_mla.parallel.process_exit import RESUME_HINT, describe_exit
from paddle_mla.sched.request import EngineStats, GenerationRequest, RequestOutput, SamplingParams

_START_ENV_LOCK = threading.Lock()


class DataParallelError(RuntimeError):
    """A data-parallel replica died or failed; the run cannot go on."""


# -- the parent -------------------------------------------------------------------------------------
def replica_envs(config: EngineConfig, device: str, gpu_count: int) -> list[dict[str, str]]:
    """The environment of each replica: its GPUs, or its share of the CPU cores."""
    m, n = config.parallel.data_parallel_size, config.parallel.tensor_parallel_size
    if device == "gpu":
        if m * n > gpu_count:
            raise ConfigError([f"'parallel.data_parallel_size' {m} x 'parallel.tensor_parallel_size' {n} needs "
                               f"{m * n} GPUs; this process sees {gpu_count}"])
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v.strip() for v in visible.split(",")][:gpu_count] if visible else [str(i) for i in range(gpu_count)]
        return [{"CUDA_VISIBLE_DEVICES": ",".join(ids[i * n:(i + 1) * n])} for i in range(m)]
    if "OMP_NUM_THREADS" in os.environ:
        return [{} for _ in range(m)]
    threads = max(1, (os.cpu_count() or 1) // (m * n))
    return [{"OMP_NUM_THREADS": str(threads)} for _ in range(m)]


class _Replica:
    def __init__(self, ctx, spec: ReplicaSpec):
        self.index = spec.index
        self.env = spec.env
        inbox_parent, inbox_child = ctx.Pipe(duplex=False)      # (reader, writer)
        outbox_parent, outbox_child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=replica_main, args=(spec, inbox_parent, outbox_child),
                                name=f"paddle-mla-dp{spec.index}", daemon=False)
        with _START_ENV_LOCK:             # the child's environment is the parent's at start(): set, start, restore
            saved = {k: os.environ.get(k) for k in spec.env}
            os.environ.update(spec.env)
            try:
                self.proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        inbox_parent.close()
        outbox_child.close()
        self.send_conn, self.recv_conn = inbox_child, outbox_parent
        self.outputs: deque[RequestOutput] = deque()   # received, not yet yielded
        self.load = ReplicaLoad()                       # sent and not yet returned / written
        self.run = ReplicaRun(spec.index)               # its share of the current stream
        self.stats = EngineStats()
        self.done = False                               # its end-of-stream came (final statistics)

    def where(self) -> str:
        gpus = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"data-parallel replica {self.index} (pid {self.proc.pid}{f', GPU {gpus}' if gpus else ''})"


class DataParallelLLM:
    """M replicas of ``LLM`` behind the part of its interface that ``generate`` uses: ``stream``,
    ``generate``, ``tokenizer``, ``max_model_len``, ``default_params``, ``config``, ``stats``,
    ``reset_stats``, ``describe``, ``close``."""

    def __init__(self, config: EngineConfig):
        from paddle_mla.platform import runtime

        self.config = config
        self.size = config.parallel.data_parallel_size
        device = runtime.resolve_device(config.device)
        envs = replica_envs(config, device, runtime.gpu_count() if device == "gpu" else 0)
        ctx = mp.get_context("spawn")
        self._closing = False
        self._broken = False                   # a stream was left midway: replicas hold stale work
        self.replicas = []
        atexit.register(self.close)
        try:
            # Replica 0 starts alone and the others once it is ready: they then find every kernel it
            # compiled in the shared on-disk caches (Triton's, the custom ops') instead of compiling
            # the same kernels at once, which made a cold two-replica start take minutes of contended
            # compilation where one replica takes seconds. A load error also surfaces before M loads.
            self.replicas.append(_Replica(ctx, ReplicaSpec(0, config, envs[0])))
            ready = [self._wait_ready(self.replicas[0])]
            self.replicas += [_Replica(ctx, ReplicaSpec(i, config, env)) for i, env in enumerate(envs) if i]
            ready += [self._wait_ready(r) for r in self.replicas[1:]]
        except BaseException:
            self.close()
            raise
        self._info, self.max_model_len, self._params, window, self.model_dir = ready[0]
        self.max_model_len = min(r[1] for r in ready)
        self.bound = 2 * window
        from paddle_mla.engine.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(self.model_dir)
        self._t0 = 0.0
        self.reset_stats()

    # -- start-up ---------------------------------------------------------------------------------
    def _wait_ready(self, r: _Replica) -> tuple:
        msg = self._recv_one(r)
        if msg[0] == "ready":
            return msg[1:]
        _, kind, message, errors, tb = msg
        if errors is not None:
            raise ConfigError(errors)
        from paddle_mla.engine.run_info import ModelPathError

        known = {"ModelPathError": ModelPathError, "FileNotFoundError": FileNotFoundError,
                 "ValueError": ValueError, "RuntimeError": RuntimeError, "KeyError": KeyError}
        if kind in known:
            raise known[kind](message)
        raise DataParallelError(f"{r.where()} failed to start: {kind}: {message}\n{tb.rstrip()}")

    def _recv_one(self, r: _Replica) -> tuple:
        """The replica's next message, waiting; DataParallelError when it dies first."""
        while True:
            if r.recv_conn.poll():
                try:
                    return r.recv_conn.recv()
                except (EOFError, OSError):
                    pass
            elif r.proc.exitcode is None:
                connection.wait([r.recv_conn, r.proc.sentinel], timeout=1.0)
                continue
            r.proc.join(timeout=5)
            raise DataParallelError(f"{r.where()} died ({describe_exit(r.proc.exitcode)}); {RESUME_HINT}")

    # -- the interface of LLM used by generate ----------------------------------------------------
    def describe(self) -> dict:
        return dict(self._info, data_parallel_size=self.size)

    def default_params(self) -> SamplingParams:
        return dataclasses.replace(self._params)

    def replica_runs(self) -> list[ReplicaRun]:
        """Each replica's share of the last (or current) ``stream``: requests, expected and output
        tokens, its first and last token times and how long its engine waited for input."""
        return [dataclasses.replace(r.run) for r in self.replicas]

    def reset_stats(self) -> None:
        for r in self.replicas:
            r.send_conn.send(("reset",))
            r.stats = EngineStats()
        self._t0 = time.perf_counter()

    def stats(self) -> EngineStats:
        """The replicas' statistics summed (as of their last output); blocks and steps add up too."""
        total = EngineStats()
        for r in self.replicas:
            for name in ("requests", "prompt_tokens", "completion_tokens", "cached_prompt_tokens",
                         "num_preemptions", "peak_blocks_used", "num_blocks", "steps"):
                setattr(total, name, getattr(total, name) + getattr(r.stats, name))
        total.elapsed_s = time.perf_counter() - self._t0
        return total

    def generate(self, prompts: list[str | GenerationRequest], params: SamplingParams | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """As ``LLM.generate`` (its code: it needs only tokenizer, default_params, stream and stats)."""
        from paddle_mla.engine.llm import LLM

        return LLM.generate(self, prompts, params, use_tqdm)

    def stream(self, requests: Iterable[GenerationRequest]) -> Iterator[RequestOutput]:
        """Outputs in input order; reads ``requests`` lazily, at most ``bound`` ahead per replica."""
        if self._broken:
            raise DataParallelError("an earlier stream over these replicas was abandoned midway; "
                                    "start a new DataParallelLLM")
        self._broken = True                    # until this stream ends normally
        source = iter(requests)
        order: deque[_Replica] = deque()       # the replica of each request not yet yielded, input order
        loads = [r.load for r in self.replicas]
        for r in self.replicas:
            r.run = ReplicaRun(r.index)
        exhausted = ended = False
        while True:
            batches: dict[int, list[GenerationRequest]] = {}
            since = time.perf_counter()
            while not exhausted:
                i = pick(loads, self.bound)
                if i is None:
                    break
                try:
                    req = next(source)
                except StopIteration:
                    exhausted = True
                    break
                r = self.replicas[i]
                batch = batches.setdefault(i, [])
                batch.append(req)
                work = request_work(req, self.max_model_len)
                r.load.sent(work)
                r.run.sent(work)
                order.append(r)
                # a slow source (a pipe) must not hold back what was read: send at 64 or after 2 ms
                if len(batch) >= 64 or time.perf_counter() - since > 2e-3:
                    self._send_batches(batches)
                    since = time.perf_counter()
            self._send_batches(batches)
            if exhausted and not ended:                 # after the last requests, in the same pipe
                ended = True
                for x in self.replicas:
                    self._send(x, ("end",))
            if order and order[0].outputs:
                while order and order[0].outputs:
                    r = order.popleft()
                    r.load.written()
                    yield r.outputs.popleft()
                continue
            if exhausted and not order:
                self._drain_done()
                self._broken = False
                return
            self._pump()

    def close(self) -> None:
        """Stop the replicas: an idle one exits at once; one still busy (an interrupted or failed run) is
        terminated, as its outputs have nowhere to go."""
        if self._closing:
            return
        self._closing = True
        atexit.unregister(self.close)
        for r in self.replicas:
            self._send(r, ("close",), quiet=True)
        for r in self.replicas:
            r.proc.join(timeout=3)
            if r.proc.exitcode is None:
                r.proc.terminate()
                r.proc.join(timeout=5)
            if r.proc.exitcode is None:
                r.proc.kill()
                r.proc.join(timeout=5)

    # -- internals --------------------------------------------------------------------------------
    def _send_batches(self, batches: dict[int, list[GenerationRequest]]) -> None:
        for i, batch in batches.items():
            if batch:
                self._send(self.replicas[i], ("reqs", batch))
        batches.clear()

    def _send(self, r: _Replica, msg: tuple, quiet: bool = False) -> None:
        try:
            r.send_conn.send(msg)
        except (OSError, ValueError):
            if not quiet:
                self._died(r)

    def _died(self, r: _Replica) -> None:
        """Raise the error of a replica whose process ended or whose pipe closed."""
        self._receive_all(r)            # an error it sent before dying says more than the exit code
        r.proc.join(timeout=5)
        raise DataParallelError(f"{r.where()} died ({describe_exit(r.proc.exitcode)}); {RESUME_HINT}")

    def _pump(self) -> None:
        """Wait for any replica's messages (or death) and take them in."""
        waitables = [r.recv_conn for r in self.replicas] + [r.proc.sentinel for r in self.replicas]
        ready = connection.wait(waitables, timeout=5.0)
        for r in self.replicas:
            if (r.recv_conn in ready and not self._receive_all(r)) or r.proc.sentinel in ready:
                self._died(r)

    def _receive_all(self, r: _Replica) -> bool:
        """Take in every message waiting from ``r``; False when its pipe is closed (it died)."""
        try:
            while r.recv_conn.poll():
                self._handle(r, r.recv_conn.recv())
        except (EOFError, OSError):
            return False
        return True

    def _handle(self, r: _Replica, msg: tuple) -> None:
        if msg[0] == "outs":
            r.outputs.extend(msg[1])
            r.load.arrived(len(msg[1]))
            for out in msg[1]:
                r.run.took(out)
            r.stats = msg[2]
        elif msg[0] == "done":
            end: StreamEnd = msg[1]
            r.stats = end.stats
            r.run.input_wait_s, r.run.input_waits, r.run.tail_s = end.input_wait_s, end.input_waits, end.tail_s
            r.done = True
        elif msg[0] == "error":
            raise DataParallelError(f"{r.where()} failed; {RESUME_HINT}\n{msg[1].rstrip()}")

    def _drain_done(self) -> None:
        """Wait for every replica's end-of-stream (its final statistics) before the next stream."""
        for r in self.replicas:
            while not r.done:
                self._handle(r, self._recv_one(r))
            r.done = False

    def __repr__(self) -> str:
        return f"DataParallelLLM(size={self.size}, model={self.model_dir!r})"
