"""The engine core: requests in, one step at a time, outputs out.

``step()`` is nano-vllm's loop: ``Scheduler.schedule()`` -> ``ModelRunner.execute()`` ->
``Scheduler.update_from_output()`` -> ``OutputProcessor`` (logprobs, stop strings, n completions,
texts). With overlapped scheduling the runner's ``launch`` enqueues step N+1 before step N's tokens
are read (docs/overlap.md); the outputs equal the plain loop's. A request with ``n`` completions
runs as n engine sequences and is output once, when all n finished. No tensor library here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from paddle_mla.config.schema import EngineConfig
from paddle_mla.engine.output_processor import OutputProcessor, RequestGroup, completion_seed
from paddle_mla.sched.request import (EngineStats, GenerationRequest, RequestMetrics, RequestOutput, Sequence, Status,
                                      has_pending)
from paddle_mla.sched.scheduler import Scheduler, SchedulerOutput


@dataclass(frozen=True)
class CoreLimits:
    """What a request is checked against, and how its completions share a prompt."""

    max_model_len: int
    vocab_size: int
    share_prompt: bool      # prefix caching: completions 1.. wait for completion 0's cached prompt


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner, processor: OutputProcessor, limits: CoreLimits,
                 eos_token_ids: set[int], overlap: bool, seed: int):
        """``runner``: has ``execute(msg)`` and ``launch(msg)`` (ModelRunner; ``msg``: the
        scheduler's plain-data ``step_input``). ``eos_token_ids``: stop a completion unless its
        params ignore eos. ``overlap``: overlapped scheduling. ``seed``: draws the seeds of
        requests that name none."""
        self.scheduler, self.runner, self.processor, self.limits = scheduler, runner, processor, limits
        self.eos_token_ids = eos_token_ids
        self.overlap = overlap
        self.inflight = None      # overlapped scheduling: (SchedulerOutput, LaunchedStep) still on the device
        self._seed_rng = np.random.default_rng(seed)
        self.num_added = 0        # requests added: the next one's index (output order)
        self.reset_stats()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.inflight is not None

    # -- statistics -------------------------------------------------------------------------
    def reset_stats(self) -> None:
        sched = self.scheduler
        self.processor.reset_stats(sched.pool.num_blocks)
        self._preempt_base = sched.num_preemptions
        self._cached_base = sched.cached_prompt_tokens
        sched.pool.peak_used = sched.pool.num_used      # the peak restarts here
        self._t0 = time.perf_counter()

    def stats(self) -> EngineStats:
        st, sched = self.processor.stats, self.scheduler
        st.num_preemptions = sched.num_preemptions - self._preempt_base
        st.cached_prompt_tokens = sched.cached_prompt_tokens - self._cached_base
        st.peak_blocks_used = sched.pool.peak_used
        st.elapsed_s = time.perf_counter() - self._t0
        return st

    # -- requests ---------------------------------------------------------------------------
    def add(self, req: GenerationRequest, finished: dict[int, RequestOutput]) -> None:
        """Queue ``req`` as its n sequences; a request that cannot run is output at once, as an error."""
        index = self.num_added
        self.num_added += 1
        seed = req.params.seed if req.params.seed is not None else int(self._seed_rng.integers(2**31))
        metrics = RequestMetrics(arrival_time=time.perf_counter())
        problem = self._check(req)
        if problem:
            finished[index] = RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=[],
                                            error=problem, metrics=metrics, seed=seed)
            return
        req, warnings = self._cap_length(req)
        n, p = req.params.n, req.params
        length_limit = min(p.max_tokens, self.limits.max_model_len - len(req.prompt_token_ids))
        stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(self.eos_token_ids))
        seqs = [Sequence(request=req, index=index, seed=completion_seed(seed, i), metrics=metrics, completion=i,
                         length_limit=length_limit, stop_ids=stop_ids) for i in range(n)]
        # With prefix caching, completions 1.. wait until completion 0 has computed (and cached) the
        # prompt, so they reuse its full blocks instead of computing the prompt n times.
        share = n > 1 and self.limits.share_prompt
        self.processor.add(index, RequestGroup(seqs, n, warnings, deferred=seqs[1:] if share else []))
        self.scheduler.add(*(seqs[:1] if share else seqs))

    def _check(self, req: GenerationRequest) -> str | None:
        try:
            req.params.validate()
        except ValueError as exc:
            return str(exc)
        n, max_len = len(req.prompt_token_ids), self.limits.max_model_len
        if n == 0:
            return "prompt is empty"
        if n >= max_len:
            return f"prompt has {n} tokens; max_model_len is {max_len} (the prompt must leave room for 1 token)"
        vocab = self.limits.vocab_size
        bad = [t for t in req.prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            return f"prompt_token_ids holds {bad[0]!r}, outside the vocabulary [0, {vocab})"
        return None

    def _cap_length(self, req: GenerationRequest) -> tuple[GenerationRequest, list[str]]:
        """Cut max_tokens (and min_tokens) to what max_model_len leaves after the prompt, with a warning.
        The params are copied: callers may share one SamplingParams between requests."""
        p, n_prompt, max_len = req.params, len(req.prompt_token_ids), self.limits.max_model_len
        room = max_len - n_prompt
        if p.max_tokens <= room:
            return req, []
        warnings = [f"max_tokens {p.max_tokens} capped to {room} (max_model_len {max_len} - "
                    f"{n_prompt} prompt tokens)"]
        if p.min_tokens > room:
            warnings.append(f"min_tokens {p.min_tokens} capped to {room}")
        params = dataclasses.replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
        return dataclasses.replace(req, params=params), warnings

    # -- one step ---------------------------------------------------------------------------
    def step(self, finished: dict[int, RequestOutput]) -> None:
        """One step; the requests it finishes go into ``finished`` (by index)."""
        if self.overlap:
            self._step_overlapped(finished)
            return
        out: SchedulerOutput = self.scheduler.schedule()
        if out.scheduled:
            self._apply(out, self.runner.execute(self.scheduler.step_input(out)), finished)
        # After the step's tokens: a failed sequence fails its whole request, and its siblings
        # (maybe scheduled in this very step) are dropped from the scheduler.
        self._fail(out, finished)

    def _step_overlapped(self, finished: dict[int, RequestOutput]) -> None:
        """Schedule and launch step N+1, then read step N's tokens while N+1 runs (docs/overlap.md).

        Step N's sampled tokens are PENDING on the host when N+1 is scheduled: a decode row's input
        token is taken on the device from N's sampled ids. Stop checks thus lag one step; a sequence
        that step N finished has its row of N+1 discarded. Rows that need their tokens on the host
        (penalties) make the loop read step N first."""
        out: SchedulerOutput = self.scheduler.schedule()
        prev, self.inflight = self.inflight, None
        if prev is not None and out.scheduled and self._needs_host_tokens(out):
            self._apply(prev[0], prev[1].result(), finished)
            prev = None
            out.scheduled = [s for s in out.scheduled if s.seq.status is Status.RUNNING]
        launched = self.runner.launch(self.scheduler.step_input(out)) if out.scheduled else None
        if prev is not None:
            self._apply(prev[0], prev[1].result(), finished)
        if launched is not None:
            self.scheduler.on_launch(out)
            self.inflight = (out, launched)
        self._fail(out, finished)

    @staticmethod
    def _needs_host_tokens(out: SchedulerOutput) -> bool:
        """Whether a row's input needs a PENDING token on the host: more than one new token (a decode
        row takes it on the device; penalties count sampled ids on the device too)."""
        for s in out.scheduled:
            if s.num_new != 1 and has_pending(s.seq):
                return True
        return False

    def _apply(self, out: SchedulerOutput, step, finished: dict[int, RequestOutput]) -> None:
        """A step's sampled tokens: the scheduler appends them and stops rows by stop id and
        length; the output processor records logprobs, checks stop strings and gathers outputs."""
        update = self.scheduler.update_from_output(out, step.token_ids.tolist())
        processor = self.processor
        for siblings in processor.record(out, step.logprobs, update.sampled_rows):
            self.scheduler.add(*siblings, front=True)
        done = update.finished
        if update.stop_string_rows:
            hits = processor.stop_strings(update.stop_string_rows)
            for seq in hits:
                self.scheduler.finish(seq)
            done = done + hits
        for seq in done:
            processor.completed(seq, finished)

    def _fail(self, out: SchedulerOutput, finished: dict[int, RequestOutput]) -> None:
        for seq in out.failed:
            for sibling in self.processor.failed(seq, finished):
                self.scheduler.finish(sibling)


def build_core(config: EngineConfig, runner, tokenizer) -> EngineCore:
    """The core of an engine over ``runner`` (its limits size the block pool, which the runner
    then reads for head-wise tables): pool, scheduler, output processor."""
    lim = runner.limits
    pool = runner.new_block_pool()
    runner.attach_pool(pool)
    scheduler = Scheduler(config.scheduler, pool, lim.max_model_len,
                          absorbed_max_new=getattr(runner.backend, "short_max_q", 0),   # GQA backends: none
                          prompt_apart=runner.prompt_apart)
    limits = CoreLimits(lim.max_model_len, runner.arch.vocab_size, config.cache.enable_prefix_caching)
    return EngineCore(scheduler, runner, OutputProcessor(tokenizer, pool.num_blocks), limits,
                      set(runner.eos_token_ids), runner.overlap, config.seed)
