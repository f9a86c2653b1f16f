"""The LLM facade: ``LLM(config).generate(prompts)`` and the streaming ``LLM(config).stream(requests)``.

The loop is nano-vllm's: schedule -> run -> update. A request with ``n`` completions runs as n
engine sequences and is output once, when all n finished. This module imports no tensor library
at import time; the constructor selects the runtime named by the config and then loads the runner.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from paddle_mla.platform import runtime
from paddle_mla.cache.head_pool import make_block_pool
from paddle_mla.config.schema import EngineConfig, load_config
from paddle_mla.sched.request import (CompletionOutput, EngineStats, GenerationRequest, RequestMetrics, RequestOutput,
                                       SamplingParams, Sequence, Status)
from paddle_mla.worker.input_state import PENDING, has_pending
from paddle_mla.sched.scheduler import Scheduler, SchedulerOutput
from paddle_mla.engine.stop_strings import StopStringMatcher


_MASK64 = 2**64 - 1


def completion_seed(seed: int, index: int) -> int:
    """Seed of completion ``index`` of a request seeded ``seed``: the seed itself for completion 0,
    a splitmix64 hash of (seed, index) below 2**63 for the others, so seeded runs reproduce."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & (2**63 - 1)


@dataclass
class _Pending:
    """A request in flight: its n sequences, how many are still running, and its warnings."""

    seqs: list[Sequence]
    remaining: int
    warnings: list[str]
    deferred: list[Sequence] = dataclasses.field(default_factory=list)   # not yet given to the scheduler


class LLM:
    def __init__(self, config: EngineConfig | str | None = None, overrides: tuple[str, ...] = (), model=None):
        """``model``: a prebuilt model (benchmarks and tests with random weights); ``config.model``
        then only names the tokenizer's folder."""
        if not isinstance(config, EngineConfig):
            config = load_config(config, overrides)
        runtime.select(config.runtime)
        from paddle_mla.engine.run_info import plan_run, run_info

        # every start-up decision resolved and checked before any weight loads
        # (ConfigError, ModelPathError, RuntimeError)
        self.plan = plan_run(config, model)
        self.run_info, config = run_info(self.plan), self.plan.config
        self.config = config
        from paddle_mla.models import ensure_tiny_model
        from paddle_mla.parallel.launcher import build_runner
        from paddle_mla.engine.tokenizer import load_tokenizer

        model_dir = str(ensure_tiny_model()) if config.model == "tiny" else config.model
        self.model_dir = model_dir
        self.tokenizer = load_tokenizer(model_dir)   # TokenIdsOnly without tokenizer.json: texts are None
        self.runner = build_runner(config, model_dir, model=model, plan=self.plan)   # rank 0 of N with parallel.tensor_parallel_size N
        self.max_model_len = self.runner.limits.max_model_len
        self.pool = make_block_pool(self.runner.limits.num_blocks, config.cache.block_size,
                                    config.cache.enable_prefix_caching, self.runner.head_wise_swa,
                                    self.runner.swa_num_blocks)
        self.runner.attach_pool(self.pool)
        self.scheduler = Scheduler(config.scheduler, self.pool, self.max_model_len)
        self.scheduler.absorbed_max_new = getattr(self.runner.backend, "short_max_q", 0)   # GQA backends: none
        eos = set(self.runner.arch.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        self.eos_token_ids = eos
        self.runner.eos_token_ids = frozenset(eos)
        self._pending: dict[int, _Pending] = {}
        self._stop_matchers: weakref.WeakKeyDictionary[Sequence, StopStringMatcher] = weakref.WeakKeyDictionary()
        self._token_texts: dict[int, str] = {}     # one-token decodes of the stop-string detector (<= vocab)
        ov = config.scheduler.overlap
        # tensor parallel: the workers take every input token from rank 0's batch, so no overlap
        # (it feeds decode rows from the device's last sampled ids, which only rank 0 has)
        single_rank = config.parallel.tensor_parallel_size == 1
        self.overlap = self.runner.device_kind == "gpu" and single_rank if ov == "auto" else bool(ov)
        self._inflight = None      # overlapped scheduling: (SchedulerOutput, LaunchedStep) still on the device
        self._seed_rng = np.random.default_rng(config.seed)
        self._next_index = 0
        self.reset_stats()

    # -- public API -------------------------------------------------------------------------
    def describe(self) -> dict:
        """What runs, resolved: runtime (+ version), device, dtype, backend, model and its folder
        (a view of the run plan the runner was built from)."""
        return self.run_info.to_dict()

    def default_params(self) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
                              ignore_eos=s.ignore_eos)

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (between benchmark rounds); False while requests are in flight."""
        return self.pool.reset_prefix_cache()

    def close(self) -> None:
        """Release the model, KV caches and graphs (and tensor-parallel workers) now rather than at
        garbage collection."""
        if self.runner is not None:
            self.runner.close()
        self.runner = None
        self.scheduler = None
        runtime.empty_cache()

    def reset_stats(self) -> None:
        self._stats = EngineStats(num_blocks=self.pool.num_blocks)
        self._preempt_base = self.scheduler.num_preemptions
        self._cached_base = self.scheduler.cached_prompt_tokens
        self.pool.peak_used = self.pool.num_used
        self._t0 = time.perf_counter()

    def stats(self) -> EngineStats:
        st = self._stats
        st.num_preemptions = self.scheduler.num_preemptions - self._preempt_base
        st.cached_prompt_tokens = self.scheduler.cached_prompt_tokens - self._cached_base
        st.peak_blocks_used = self.pool.peak_used
        st.elapsed_s = time.perf_counter() - self._t0
        return st

    def generate(self, prompts: list[str | GenerationRequest], params: SamplingParams | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        params = params or self.default_params()
        reqs = [p if isinstance(p, GenerationRequest)
                else GenerationRequest(id=i, prompt_token_ids=self.tokenizer.encode(p), params=params, prompt=p)
                for i, p in enumerate(prompts)]
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(reqs), desc="generate", unit="req", dynamic_ncols=True)
        outputs = []
        for out in self.stream(reqs):
            outputs.append(out)
            if bar is not None:
                st = self.stats()
                bar.set_postfix_str(f"in {st.prompt_tokens / max(st.elapsed_s, 1e-9):.0f} tok/s, "
                                    f"out {st.completion_tokens / max(st.elapsed_s, 1e-9):.0f} tok/s", refresh=False)
                bar.update(1)
        if bar is not None:
            bar.close()
        return outputs

    @property
    def stream_window(self) -> int:
        """How many requests ``stream`` reads ahead of its outputs; it blocks on its input only
        while fewer than this are in flight (data-parallel replicas are fed at least this many)."""
        return max(4 * self.config.scheduler.max_num_seqs, 64)

    def stream(self, requests: Iterable[GenerationRequest]) -> Iterator[RequestOutput]:
        """Outputs in input order as they finish; reads ``requests`` lazily (bounded lookahead)."""
        source = iter(requests)
        window = self.stream_window
        finished: dict[int, RequestOutput] = {}
        first = self._next_index
        next_out = first
        exhausted = False
        while True:
            while not exhausted and self._next_index - next_out < window:
                try:
                    req = next(source)
                except StopIteration:
                    exhausted = True
                    break
                self._add(req, finished)
            if self.scheduler.has_work() or self._inflight is not None:
                self._step(finished)
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if exhausted and not self.scheduler.has_work() and self._inflight is None and next_out == self._next_index:
                return

    # -- internals --------------------------------------------------------------------------
    def _add(self, req: GenerationRequest, finished: dict[int, RequestOutput]) -> None:
        index = self._next_index
        self._next_index += 1
        seed = req.params.seed if req.params.seed is not None else int(self._seed_rng.integers(2**31))
        metrics = RequestMetrics(arrival_time=time.perf_counter())
        problem = self._check(req)
        if problem:
            finished[index] = RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=[],
                                            error=problem, metrics=metrics, seed=seed)
            return
        req, warnings = self._cap_length(req)
        n, p = req.params.n, req.params
        length_limit = min(p.max_tokens, self.max_model_len - len(req.prompt_token_ids))
        stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(self.eos_token_ids))
        seqs = [Sequence(request=req, index=index, seed=completion_seed(seed, i), metrics=metrics, completion=i,
                         length_limit=length_limit, stop_ids=stop_ids) for i in range(n)]
        # With prefix caching, completions 1.. wait until completion 0 has computed (and cached) the
        # prompt, so they reuse its full blocks instead of computing the prompt n times.
        share = n > 1 and self.config.cache.enable_prefix_caching
        self._pending[index] = _Pending(seqs, n, warnings, deferred=seqs[1:] if share else [])
        self._stats.requests += 1
        self._stats.prompt_tokens += len(req.prompt_token_ids) * n   # each completion runs the prompt
        for seq in seqs[:1] if share else seqs:
            self.scheduler.add(seq)

    def _check(self, req: GenerationRequest) -> str | None:
        try:
            req.params.validate()
        except ValueError as exc:
            return str(exc)
        n = len(req.prompt_token_ids)
        if n == 0:
            return "prompt is empty"
        if n >= self.max_model_len:
            return f"prompt has {n} tokens; max_model_len is {self.max_model_len} (the prompt must leave room for 1 token)"
        vocab = self.runner.arch.vocab_size
        bad = [t for t in req.prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            return f"prompt_token_ids holds {bad[0]!r}, outside the vocabulary [0, {vocab})"
        return None

    def _cap_length(self, req: GenerationRequest) -> tuple[GenerationRequest, list[str]]:
        """Cut max_tokens (and min_tokens) to what max_model_len leaves after the prompt, with a warning.
        The params are copied: callers may share one SamplingParams between requests."""
        p, n_prompt = req.params, len(req.prompt_token_ids)
        room = self.max_model_len - n_prompt
        if p.max_tokens <= room:
            return req, []
        warnings = [f"max_tokens {p.max_tokens} capped to {room} (max_model_len {self.max_model_len} - "
                    f"{n_prompt} prompt tokens)"]
        if p.min_tokens > room:
            warnings.append(f"min_tokens {p.min_tokens} capped to {room}")
        params = dataclasses.replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
        return dataclasses.replace(req, params=params), warnings

    def _step(self, finished: dict[int, RequestOutput]) -> None:
        if self.overlap:
            self._step_overlapped(finished)
            return
        out: SchedulerOutput = self.scheduler.schedule()
        if out.scheduled:
            step = self.runner.execute(out)
            self.scheduler.finish_step(out)
            self._apply(out, step, finished)
        # After the step's tokens: a failed sequence fails its whole request, and its siblings
        # (maybe scheduled in this very step) are dropped from the scheduler.
        for seq in out.failed:
            self._failed(seq, finished)

    def _step_overlapped(self, finished: dict[int, RequestOutput]) -> None:
        """Schedule and launch step N+1, then read step N's tokens while N+1 runs (docs/overlap.md).

        Step N's sampled tokens are PENDING on the host when N+1 is scheduled: a decode row's input
        token is taken on the device from N's sampled ids. Stop checks thus lag one step; a sequence
        that step N finished has its row of N+1 discarded. Rows that need their tokens on the host
        (penalties) make the loop read step N first."""
        out: SchedulerOutput = self.scheduler.schedule()
        prev, self._inflight = self._inflight, None
        if prev is not None and out.scheduled and self._needs_host_tokens(out.scheduled):
            self._complete(prev, finished)
            prev = None
            out.scheduled = [s for s in out.scheduled if s.seq.status is Status.RUNNING]
        launched = self.runner.launch(out) if out.scheduled else None
        if prev is not None:
            self._complete(prev, finished)
        if launched is not None:
            running = Status.RUNNING
            live = [s for s in out.scheduled if s.seq.status is running]
            self.scheduler.finish_step(SchedulerOutput(scheduled=live) if len(live) < len(out.scheduled) else out)
            for s in live:
                if s.samples:
                    s.seq.output_token_ids.append(PENDING)
            self._inflight = (out, launched)
        for seq in out.failed:
            self._failed(seq, finished)

    @staticmethod
    def _needs_host_tokens(scheduled) -> bool:
        """Whether a row's input needs a PENDING token on the host: more than one new token, or a
        penalty (the sampler counts the row's tokens on the host)."""
        for s in scheduled:
            if (s.num_new != 1 or s.seq.penalized) and has_pending(s.seq):
                return True
        return False

    def _complete(self, inflight, finished: dict[int, RequestOutput]) -> None:
        out, launched = inflight
        self._apply(out, launched.result(), finished)

    def _apply(self, out: SchedulerOutput, step, finished: dict[int, RequestOutput]) -> None:
        """A step's sampled tokens: append (or resolve the PENDING one), stop checks, outputs.
        Per row O(1) work; only rows that may stop (at their length limit, a stop id, a stop string)
        go through ``_stopped``, after every row's token is in, in row order."""
        self._stats.steps += 1
        now = time.perf_counter()
        finished_status = Status.FINISHED
        produced = 0
        check = []          # (seq, token) of the rows that may stop, in row order
        for s, token, logprob in zip(out.scheduled, step.token_ids.tolist(), step.logprobs):
            seq = s.seq
            if not s.samples or seq.status is finished_status:   # finished: an overlapped extra step
                continue
            toks = seq.output_token_ids
            if toks and toks[-1] == PENDING:
                toks[-1] = token
            else:
                toks.append(token)
            if logprob is not None:
                seq.logprobs.append(logprob)
            produced += 1
            metrics = seq.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.token_times.append(now)
            n = len(toks)
            if n == 1 and seq.completion == 0:     # its first token: the only time siblings wait
                self._admit_deferred(seq)
            # the common row: below its length limit, no stop string, a token that cannot stop it
            if n < seq.length_limit and (token not in seq.stop_ids or n < seq.request.params.min_tokens) \
                    and not seq.request.params.stop:
                continue
            check.append((seq, token))
        self._stats.completion_tokens += produced
        if not check:
            return
        for (seq, token), text_hit in zip(check, self._stop_string_hits(check)):
            if self._stopped(seq, token, text_hit):
                seq.metrics.finish_time = now
                self.scheduler.finish(seq)
                self._completed(seq, finished)

    def _stop_string_hits(self, rows: list[tuple[Sequence, int]]) -> list[bool]:
        """Whether each row's stop-string detector fires at this token (``found_many``: all of the
        step's rows at once). The detector runs only where ``_stopped`` reaches the stop strings:
        past min_tokens and not already stopped by a stop id."""
        hits = [False] * len(rows)
        if self.tokenizer is None:
            return hits
        idx, matchers, outs = [], [], []
        for i, (seq, token) in enumerate(rows):
            p = seq.params
            if p.stop and len(seq.output_token_ids) >= p.min_tokens and token not in seq.stop_ids:
                idx.append(i)
                matchers.append(self._stop_matcher(seq))
                outs.append(seq.output_token_ids)
        if idx:
            for i, hit in zip(idx, StopStringMatcher.found_many(matchers, outs, self._token_texts)):
                hits[i] = hit
        return hits

    def _stopped(self, seq: Sequence, token: int, text_hit: bool) -> bool:
        """``text_hit``: the row's stop-string detector fired at this token (``_stop_string_hits``)."""
        p = seq.params
        n = len(seq.output_token_ids)
        # Before min_tokens the sampler masks eos and stop ids; stop strings are not checked (as vLLM).
        if n >= p.min_tokens:
            if token in seq.stop_ids:      # eos (unless ignore_eos) and stop_token_ids
                seq.finish_reason = "stop"
                return True
            if text_hit:
                # the bounded-window detector fired: one full decode confirms and cuts, as before
                text = self.tokenizer.decode(seq.output_token_ids)
                cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
                if cut >= 0:
                    seq.finish_reason, seq.text = "stop", text[:cut]
                    return True
        if n >= seq.length_limit:         # max_tokens, or max_model_len reached
            seq.finish_reason = "length"
            return True
        return False

    def _stop_matcher(self, seq: Sequence) -> StopStringMatcher:
        matcher = self._stop_matchers.get(seq)
        if matcher is None:
            matcher = self._stop_matchers[seq] = StopStringMatcher(self.tokenizer, seq.params.stop)
        return matcher

    def _admit_deferred(self, first: Sequence) -> None:
        """Completion 0 sampled, so its prompt blocks are cached: queue its siblings, first in line."""
        pending = self._pending.get(first.index)
        if pending is not None and pending.deferred:
            self.scheduler.add(*pending.deferred, front=True)
            pending.deferred = []

    def _completed(self, seq: Sequence, finished: dict[int, RequestOutput]) -> None:
        pending = self._pending.get(seq.index)
        if pending is None:      # its request already failed
            return
        pending.remaining -= 1
        if pending.remaining == 0:
            del self._pending[seq.index]
            finished[seq.index] = self._output(pending)

    def _failed(self, seq: Sequence, finished: dict[int, RequestOutput]) -> None:
        pending = self._pending.pop(seq.index, None)
        if pending is None:
            return
        for sibling in pending.seqs:
            if sibling is not seq and sibling.status is not Status.FINISHED:
                self.scheduler.finish(sibling)
        req = seq.request
        finished[seq.index] = RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=[],
                                            error=seq.error, metrics=seq.metrics, seed=pending.seqs[0].seed,
                                            warnings=pending.warnings)

    def _output(self, pending: _Pending) -> RequestOutput:
        first = pending.seqs[0]
        outputs = []
        for seq in pending.seqs:
            text = seq.text
            if text is None and self.tokenizer is not None:
                text = self.tokenizer.decode(seq.output_token_ids)
            outputs.append(CompletionOutput(seq.completion, list(seq.output_token_ids), text, seq.finish_reason,
                                            logprobs=list(seq.logprobs) if seq.params.logprobs else None,
                                            seed=seq.seed))
        first.metrics.num_cached_tokens = max(first.num_cached_on_admit, 0)
        req = first.request
        return RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=outputs, error=None,
                             metrics=first.metrics, seed=first.seed, warnings=pending.warnings)

    def __repr__(self) -> str:
        return f"LLM(model={self.model_dir!r}, runtime={runtime.name()!r}, backend={self.config.attention.backend!r})"
