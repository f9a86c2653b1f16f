"""Per-step probes of a running ``LLM`` (used by the engine-step and chunked-prefill benchmarks).

``StepProbe`` wraps ``llm._step``, ``runner.launch`` and ``sampler.read_to_host`` and records, per
step: its rows (decodes, short extends, prefill-chunk tokens), the host time of ``_step`` less the
wait for the sampled tokens, the host time of ``launch`` alone, CUDA events around the launch, the
syncs flagged by ``set_sync_debug_mode("warn")`` and the reads. With ``phases`` it also times the
host phases of ``phases.wrap_phases`` on the wall clock.
With ``profile`` every step runs inside ``record_function("step#N")``, and the attention regions
below inside theirs, so that ``step_kernels`` can attribute each kernel of a ``torch.profiler`` run
(CPU + CUDA activity) to the step that launched it: ``step_kernels_by_launch`` by each kernel's
CUPTI correlation with its launch call (complete), ``step_kernels`` by the profiler's op tree (which
also splits by region; on torch 2.11 it linked only 20 of 236 ms of kernels: a lower bound).
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from benchmarks.harness.kernel_profile import categorize  # noqa: E402
from benchmarks.harness.phases import PhaseTimer, wrap_phases  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402

SHORT_MAX = 128     # a prefill row with at most this many new tokens over a cached context: a short extend
# (module, class, method, label): the attention regions a profiled step reports apart
EXTEND = "extend (interleave cached+new latent, kv_b_proj GEMMs, attention)"
REGIONS = [
    ("paddle_mla.attention.triton_mla.extend", "ExtendWorkspace", "run", EXTEND),
    ("paddle_mla.attention.triton_mla.backend", "TritonMLABackend", "_short_rows", "short extends, absorbed"),
    ("paddle_mla.attention.triton_mla.backend", "TritonMLABackend", "_decode", "decode attention"),
]


def composition(out) -> dict:
    dec = short = chunk = 0
    for s in out.scheduled:
        if s.num_new == 1 and not s.is_prefill:
            dec += 1
        elif s.num_new <= SHORT_MAX and s.num_cached > 0:
            short += 1
        else:
            chunk += s.num_new
    return dict(decodes=dec, short_extends=short, chunk_tokens=chunk)


def step_kind(c: dict | None) -> str:
    if c is None:
        return "no launch (last reads)"
    if c["chunk_tokens"]:
        return "prefill chunk (+ decodes)"
    if c["short_extends"]:
        return "admission: short extends (+ decodes)"
    return "decode only"


class _NoEvent:
    """Stands in for a CUDA event on a machine without CUDA (the benchmarks' CPU smoke runs)."""

    def record(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return float("nan")


def _event():
    return torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() else _NoEvent()


def _sync_debug(mode: str) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode(mode)


class StepProbe:
    def __init__(self, llm, batch: int = 0, phases: bool = False, profile: bool = False):
        self.llm, self.batch, self.recs, self.profile = llm, batch, [], profile
        self._launches, self._wait, self._reads, self._launch_host, self._comp = [], 0.0, 0, 0.0, None
        self.timer = PhaseTimer(clock_fn=time.perf_counter) if phases else None
        if self.timer is not None:      # first: the probe's wrappers call the timed methods
            wrap_phases(self.timer, llm, gpu=True)
        self._regions = []
        if profile:
            import importlib
            for mod, cls, meth, label in REGIONS:
                owner = getattr(importlib.import_module(mod), cls)
                real = getattr(owner, meth)
                setattr(owner, meth, _labelled(real, label))
                self._regions.append((owner, meth, real))
        self._real = (llm._step, llm.runner.launch, sampler.read_to_host)
        llm._step, llm.runner.launch, sampler.read_to_host = self._step, self._launch, self._read

    def close(self) -> None:
        self.llm._step, self.llm.runner.launch, sampler.read_to_host = self._real
        for owner, meth, real in self._regions:
            setattr(owner, meth, real)
        if self.timer is not None:
            self.timer.close()
        self.llm = self._real = None     # the records stay; the engine can be freed

    def _read(self, pending):
        t = time.perf_counter()
        try:
            return self._real[2](pending)
        finally:
            self._wait += time.perf_counter() - t
            self._reads += 1

    def _launch(self, out):
        start, end = _event(), _event()
        start.record()
        t = time.perf_counter()
        launched = self._real[1](out)
        self._launch_host += time.perf_counter() - t
        end.record()
        decode = len(out.scheduled) == self.batch and not any(s.is_prefill for s in out.scheduled)
        rows = len(out.scheduled)
        kind = ("with prefill tokens" if any(s.num_new > 1 for s in out.scheduled) else
                f"decode, batch {rows}" if rows in (1, self.batch) else
                f"decode, batch {'2-63' if rows < 64 else '64-' + str(self.batch - 1)}")
        self._launches.append((decode, start, end, kind))
        self._comp = composition(out)
        return launched

    def _step(self, finished):
        self._wait, self._reads, self._launch_host, self._comp, n0 = 0.0, 0, 0.0, None, len(self._launches)
        before = dict(self.timer.total) if self.timer is not None else {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _sync_debug("warn")
            t0 = time.perf_counter()
            try:
                if self.profile:
                    with torch.profiler.record_function(f"step#{len(self.recs)}"):
                        self._real[0](finished)
                else:
                    self._real[0](finished)
            finally:
                t1 = time.perf_counter()
                _sync_debug("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        launch = self._launches[n0] if len(self._launches) > n0 else None
        phases = {}
        if self.timer is not None:
            phases = {k: (v - before.get(k, 0.0)) * 1e3 for k, v in self.timer.total.items()}
            if "read/unpack" in phases:     # the wait for the sampled tokens is not host work
                phases["read/unpack"] -= self._wait * 1e3
        self.recs.append(dict(t0=t0, host=t1 - t0 - self._wait, wait=self._wait, syncs=syncs, reads=self._reads,
                              launch=launch, launch_host=self._launch_host, comp=self._comp, phases=phases))

    def periods(self, t_end: float) -> list[float]:
        """Wall time from each step's start to the next one's (ms)."""
        ts = [r["t0"] for r in self.recs] + [t_end]
        return [(b - a) * 1e3 for a, b in zip(ts, ts[1:])]

    def gpu_ms(self) -> list[float | None]:
        """Device time between the events around each step's launch (kernels and any idle between them)."""
        runtime.synchronize()
        return [r["launch"][1].elapsed_time(r["launch"][2]) if r["launch"] else None for r in self.recs]

    def breakdown(self, t_start: float, t_end: float) -> dict:
        """Where a whole ``generate`` call's wall time went (every step, by the kind of step it launched):
        wall = the steps' periods; host = time in ``_step`` not waiting for sampled tokens; wait = time
        blocked on them; GPU = device time of each launch (events around it); gap = device idle time
        between one launch's end and the next one's start (the GPU waiting for the host)."""
        runtime.synchronize()
        groups: dict[str, dict] = {}
        prev_end = None
        for i, r in enumerate(self.recs):
            nxt = self.recs[i + 1]["t0"] if i + 1 < len(self.recs) else t_end
            kind = r["launch"][3] if r["launch"] else "no launch (last reads)"
            g = groups.setdefault(kind, dict(steps=0, wall_s=0.0, host_s=0.0, wait_s=0.0, gpu_s=0.0, gap_s=0.0,
                                             syncs=0))
            g["steps"] += 1
            g["wall_s"] += nxt - r["t0"]
            g["host_s"] += r["host"]
            g["wait_s"] += r["wait"]
            g["syncs"] += r["syncs"]
            if r["launch"]:
                _, s, e, _ = r["launch"]
                g["gpu_s"] += s.elapsed_time(e) / 1e3
                if prev_end is not None:
                    g["gap_s"] += prev_end.elapsed_time(s) / 1e3
                prev_end = e
        tot = {k: sum(g[k] for g in groups.values()) for k in ("steps", "wall_s", "host_s", "wait_s", "gpu_s",
                                                               "gap_s", "syncs")}
        tot["before_first_step_s"] = (self.recs[0]["t0"] - t_start) if self.recs else 0.0
        tot["run_s"] = t_end - t_start
        return {"groups": groups, "total": tot}

    def summary(self) -> dict:
        """Medians over the steps that launched a full decode batch and follow one (steady state);
        with ``phases``, also each phase's median (ms) under ``phase:<name>``."""
        runtime.synchronize()
        rows = []
        for i in range(1, len(self.recs) - 1):
            cur, prev = self.recs[i], self.recs[i - 1]
            if not (cur["launch"] and cur["launch"][0] and prev["launch"] and prev["launch"][0]):
                continue
            _, s, e, _ = cur["launch"]
            rows.append(dict(period=(self.recs[i + 1]["t0"] - cur["t0"]) * 1e3, host=cur["host"] * 1e3,
                             gpu=s.elapsed_time(e), gap=prev["launch"][2].elapsed_time(s), syncs=cur["syncs"],
                             reads=cur["reads"], **{"phase:" + k: v for k, v in cur["phases"].items()}))
        if not rows:
            raise RuntimeError("no steady decode steps were measured (raise --steps)")
        keys = sorted({k for r in rows for k in r})
        return {k: float(np.median([r.get(k, 0.0) for r in rows])) for k in keys} | {"steps": len(rows)}


def _labelled(fn, label: str):
    def run(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)
    return run


def _kernels_under(ev):
    for k in ev.kernels:
        yield k.name, k.duration
    for ch in ev.cpu_children:
        yield from _kernels_under(ch)


def _regions_under(ev, labels: set, acc: dict) -> None:
    """acc[label]: kernel ms of the region; acc["label / category"]: of which that category."""
    for ch in ev.cpu_children:
        if ch.name in labels:     # outermost region only: its kernels are counted once
            for name, us in _kernels_under(ch):
                for key in (ch.name, f"{ch.name} / {categorize(name)}"):
                    acc[key] = acc.get(key, 0.0) + us / 1e3
        else:
            _regions_under(ch, labels, acc)


def step_kernels(prof) -> tuple[dict[int, dict], float]:
    """Per step index: kernel ms, kernel count, ms by category (``kernel_profile.categorize``) and by
    region (and region / category); and the device ms of every kernel the profiler saw (attributed or not)."""
    from torch.autograd import DeviceType

    labels = {lab for *_, lab in REGIONS}
    evs = prof.events()
    steps: dict[int, dict] = {}
    for ev in evs:
        if ev.device_type != DeviceType.CPU or not ev.name.startswith("step#"):
            continue
        ks = list(_kernels_under(ev))
        cats: dict[str, float] = {}
        for name, us in ks:
            cats[categorize(name)] = cats.get(categorize(name), 0.0) + us / 1e3
        regions: dict[str, float] = {}
        _regions_under(ev, labels, regions)
        steps[int(ev.name[5:])] = dict(kernel_ms=sum(us for _, us in ks) / 1e3, kernels=len(ks), cats=cats,
                                       regions=regions)
    total = sum(e.time_range.elapsed_us() for e in evs
                if e.device_type != DeviceType.CPU and not e.name.startswith("step#") and e.name not in labels)
    return steps, total / 1e3


def step_kernels_by_launch(prof) -> dict[int, dict]:
    """A second attribution, independent of the profiler's op tree: each device event is matched by
    its CUPTI correlation id to the host API call that launched it (``cudaLaunchKernel``,
    ``cuLaunchKernelEx`` for Triton, ``cudaGraphLaunch``, ``cudaMemcpyAsync``...), and that call to the
    ``step#N`` range it ran in. Per step index: kernel ms and count."""
    import bisect

    from torch.autograd import DeviceType

    ranges, launches, device = [], {}, []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if e.device_type() == DeviceType.CPU:
            if name.startswith("step#"):
                ranges.append((e.start_ns(), e.start_ns() + e.duration_ns(), int(name[5:])))
            elif name.startswith("cu") and e.correlation_id():
                launches[e.correlation_id()] = e.start_ns()
        elif not name.startswith("step#") and name not in {lab for *_, lab in REGIONS}:
            device.append((e.correlation_id(), e.duration_ns()))
    ranges.sort()
    starts = [r[0] for r in ranges]
    out: dict[int, dict] = {}
    for corr, dur in device:
        t = launches.get(corr)
        if t is None:
            continue
        j = bisect.bisect_right(starts, t) - 1
        if j >= 0 and t <= ranges[j][1]:
            d = out.setdefault(ranges[j][2], dict(kernel_ms=0.0, kernels=0))
            d["kernel_ms"] += dur / 1e6
            d["kernels"] += 1
    return out
