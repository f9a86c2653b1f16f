"""The LLM facade: ``LLM(config).generate(prompts)`` and the streaming ``LLM(config).stream(requests)``.

The loop is nano-vllm's: schedule -> run -> update. This module imports no tensor library at
import time; the constructor selects the runtime named by the config and then loads the runner.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import numpy as np

from paddle_mla import runtime
from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config import EngineConfig, load_config
from paddle_mla.engine.request import (CompletionOutput, EngineStats, GenerationRequest, RequestMetrics, RequestOutput,
                                       SamplingParams, Sequence)
from paddle_mla.engine.scheduler import Scheduler, SchedulerOutput


class LLM:
    def __init__(self, config: EngineConfig | str | None = None, overrides: tuple[str, ...] = ()):
        if not isinstance(config, EngineConfig):
            config = load_config(config, overrides)
        runtime.select(config.runtime)
        from paddle_mla.run_info import describe_run

        # auto device/backend resolved and the resolved backend checked before any weight loads
        # (ConfigError, ModelPathError, RuntimeError)
        self.run_info, config = describe_run(config)
        self.config = config
        from paddle_mla.engine.model_runner import ModelRunner
        from paddle_mla.models import ensure_tiny_model
        from paddle_mla.tokenizer import load_tokenizer

        model_dir = str(ensure_tiny_model()) if config.model == "tiny" else config.model
        self.model_dir = model_dir
        self.tokenizer = load_tokenizer(model_dir)   # TokenIdsOnly without tokenizer.json: texts are None
        self.runner = ModelRunner(config, model_dir)
        self.max_model_len = self.runner.limits.max_model_len
        self.pool = BlockPool(self.runner.limits.num_blocks, config.cache.block_size,
                              config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.pool, self.max_model_len)
        eos = set(self.runner.arch.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        self.eos_token_ids = eos
        self._seed_rng = np.random.default_rng(config.seed)
        self._next_index = 0
        self.reset_stats()

    # -- public API -------------------------------------------------------------------------
    def describe(self) -> dict:
        """What runs, resolved: runtime (+ version), device, dtype, backend, model and its folder."""
        info = self.run_info
        info.dtype = str(self.runner.dtype).rsplit(".", 1)[-1]
        info.backend = self.runner.backend.name
        return info.to_dict()

    def default_params(self) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
                              ignore_eos=s.ignore_eos)

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (between benchmark rounds); False while requests are in flight."""
        return self.pool.reset_prefix_cache()

    def close(self) -> None:
        """Release the model, KV caches and graphs now rather than at garbage collection."""
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

    def stream(self, requests: Iterable[GenerationRequest]) -> Iterator[RequestOutput]:
        """Outputs in input order as they finish; reads ``requests`` lazily (bounded lookahead)."""
        source = iter(requests)
        window = max(4 * self.config.scheduler.max_num_seqs, 64)
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
            if self.scheduler.has_work():
                self._step(finished)
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if exhausted and not self.scheduler.has_work() and next_out == self._next_index:
                return

    # -- internals --------------------------------------------------------------------------
    def _add(self, req: GenerationRequest, finished: dict[int, RequestOutput]) -> None:
        index = self._next_index
        self._next_index += 1
        seed = req.params.seed if req.params.seed is not None else int(self._seed_rng.integers(2**31))
        seq = Sequence(request=req, index=index, seed=seed, metrics=RequestMetrics(arrival_time=time.perf_counter()))
        problem = self._check(req)
        if problem:
            seq.finish_reason, seq.error = "error", problem
            finished[index] = self._output(seq)
            return
        self._stats.requests += 1
        self._stats.prompt_tokens += seq.prompt_len
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

    def _step(self, finished: dict[int, RequestOutput]) -> None:
        out: SchedulerOutput = self.scheduler.schedule()
        for seq in out.failed:
            finished[seq.index] = self._output(seq)
        if not out.scheduled:
            return
        sampled = self.runner.execute(out)
        self.scheduler.finish_step(out)
        self._stats.steps += 1
        now = time.perf_counter()
        for s, token in zip(out.scheduled, sampled.tolist()):
            seq = s.seq
            if not s.samples:
                continue
            seq.output_token_ids.append(int(token))
            self._stats.completion_tokens += 1
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            seq.metrics.token_times.append(now)
            if self._stopped(seq, int(token)):
                seq.metrics.finish_time = now
                self.scheduler.finish(seq)
                finished[seq.index] = self._output(seq)

    def _stopped(self, seq: Sequence, token: int) -> bool:
        p = seq.params
        n = len(seq.output_token_ids)
        if n > p.min_tokens:   # eos / stop ids / stop strings count only after min_tokens tokens
            if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                seq.finish_reason = "stop"
                return True
            if p.stop:
                text = self.tokenizer.decode(seq.output_token_ids)
                cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
                if cut >= 0:
                    seq.finish_reason, seq.text = "stop", text[:cut]
                    return True
        if n >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.finish_reason = "length"
            return True
        return False

    def _output(self, seq: Sequence) -> RequestOutput:
        if seq.error is None and not seq.text:
            seq.text = self.tokenizer.decode(seq.output_token_ids)
        seq.metrics.num_cached_tokens = max(seq.num_cached_on_admit, 0)
        outputs = [] if seq.error is not None else [
            CompletionOutput(0, list(seq.output_token_ids), seq.text, seq.finish_reason, seed=seq.seed)]
        return RequestOutput(id=seq.request.id, prompt_token_ids=seq.request.prompt_token_ids, outputs=outputs,
                             error=seq.error, metrics=seq.metrics, seed=seq.seed)

    def __repr__(self) -> str:
        return f"LLM(model={self.model_dir!r}, runtime={runtime.name()!r}, backend={self.config.attention.backend!r})"
