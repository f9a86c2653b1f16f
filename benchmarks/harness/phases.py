"""The engine's host phases, timed in place: ``PhaseTimer`` wraps methods and keeps each phase's self
time (nested phases subtracted); ``wrap_phases`` wraps the phases of one engine step (scheduler, input
state, metadata, sampling batch, sampler, read, outputs, stop checks); ``forward_host_part_only``
replaces the model's forward by its host part, so a CPU run times the host work of a step."""

from __future__ import annotations

import time

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from paddle_mla.attention.forward_meta import ForwardMeta  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.sched.scheduler import Scheduler  # noqa: E402
from paddle_mla.worker import model_runner, sampler  # noqa: E402


class PhaseTimer:
    """Self time per named phase: a phase nested in another is subtracted from its parent."""

    def __init__(self, clock_fn=time.thread_time):
        self.clock = clock_fn
        self.total: dict[str, float] = {}
        self._stack: list[list] = []
        self._undo: list = []

    def wrap(self, owner, attr: str, name: str) -> None:
        real = getattr(owner, attr)
        timer = self

        def timed(*args, **kwargs):
            frame = [0.0]                       # time of nested phases
            timer._stack.append(frame)
            now = timer.clock
            t = now()
            try:
                return real(*args, **kwargs)
            finally:
                dt = now() - t
                timer._stack.pop()
                timer.total[name] = timer.total.get(name, 0.0) + dt - frame[0]
                if timer._stack:
                    timer._stack[-1][0] += dt

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, real))

    def reset(self) -> None:
        self.total = {}

    def close(self) -> None:
        for owner, attr, real in reversed(self._undo):
            setattr(owner, attr, real)
        self._undo = []


def forward_host_part_only(llm, batch: int) -> None:
    """Replace the runner's forward by its host part (``ForwardMeta.build`` and the pending-token
    scatter) returning fixed logits for ``batch`` rows, so what is timed is the engine's host work."""
    runner = llm.runner
    logits = torch.randn(batch, runner.arch.vocab_size, generator=torch.Generator().manual_seed(0))

    def fake_forward(step_batch, extra=None):
        meta = ForwardMeta.build(step_batch, runner.cfg.cache.block_size, runner.device, runner.key_windows,
                                 runner.uploader, extra)
        if "pending_pos" in meta.extra:
            ids = runner.last_sampled.gather(0, meta.extra["pending_slot"])
            meta.input_ids.scatter_(0, meta.extra["pending_pos"], ids)
        return logits[:int(step_batch.sample_mask.sum())], meta

    runner._forward = fake_forward


def wrap_phases(timer: PhaseTimer, llm, gpu: bool = False) -> None:
    """Time the engine's host phases (module docstring). ``gpu``: the real forward runs, so its host
    part (the model's eager op launches or the graph replay, less ``ForwardMeta.build``) is a phase of
    its own, and the sampler's ops are host launches of device work, counted as host time."""
    timer.wrap(Scheduler, "schedule", "schedule")
    timer.wrap(Scheduler, "finish_step", "finish_step")
    timer.wrap(llm.runner, "_gather", "inputs")
    timer.wrap(ForwardMeta, "build", "meta")
    if gpu:
        timer.wrap(llm.runner, "_forward", "forward (model op launches / graph replay)")
        try:     # the Python side of every Triton kernel launch (argument binding, cache lookup, launch)
            from triton.runtime.jit import JITFunction
            timer.wrap(JITFunction, "run", "Triton kernel launches (Python side)")
        except ImportError:
            pass
    timer.wrap(llm.runner.sampling_builder, "build", "sampling batch")
    timer.wrap(sampler, "device_arrays", "sampling batch")
    timer.wrap(sampler, "sample_step_ids", "sampler op launches" if gpu else "sampler ops")
    timer.wrap(model_runner.LaunchedStep, "result", "read/unpack")
    timer.wrap(llm, "_apply", "outputs")
    timer.wrap(llm, "_stopped", "stop checks")
    if hasattr(llm, "_stop_string_hits"):            # the step's stop-string rows, one batched decode
        timer.wrap(llm, "_stop_string_hits", "stop checks")
    timer.wrap(llm.runner, "launch", "launch (rest)")
    timer.wrap(llm, "_step", "other (step)")
