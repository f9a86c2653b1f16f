"""The LLM facade: ``LLM(config).generate(prompts)`` and the streaming ``LLM(config).stream(requests)``.

The constructor selects the runtime named by the config, then builds the parts (tokenizer, model
runner, block pool, scheduler, output processor) and the ``EngineCore`` that steps them
(engine/core.py). This module imports no tensor library at import time.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from paddle_mla.platform import runtime
from paddle_mla.config.schema import EngineConfig, load_config
from paddle_mla.engine.core import build_core
from paddle_mla.engine.output_processor import completion_seed  # noqa: F401  (callers import it from here)
from paddle_mla.sched.request import EngineStats, GenerationRequest, RequestOutput, SamplingParams


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

        self.model_dir = str(ensure_tiny_model()) if config.model == "tiny" else config.model
        self.tokenizer = load_tokenizer(self.model_dir)   # TokenIdsOnly without tokenizer.json: texts are None
        # rank 0 of N with parallel.tensor_parallel_size N; the sampler masks eos before min_tokens
        self.runner = build_runner(config, self.model_dir, model=model, plan=self.plan,
                                   eos_token_ids=frozenset(self.tokenizer.eos_token_ids))
        self.max_model_len = self.runner.limits.max_model_len
        self.core = build_core(config, self.runner, self.tokenizer)
        self.scheduler, self.pool = self.core.scheduler, self.core.scheduler.pool

    @property
    def eos_token_ids(self) -> set[int]:
        """The model's and the tokenizer's eos ids: they stop a completion unless ignore_eos."""
        return self.core.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: set[int]) -> None:
        self.core.eos_token_ids = ids

    @property
    def overlap(self) -> bool:
        return self.core.overlap

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
        self.core.reset_stats()

    def stats(self) -> EngineStats:
        return self.core.stats()

    def generate(self, prompts: list[str | GenerationRequest], params: SamplingParams | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        params = params or self.default_params()
        reqs = [p if isinstance(p, GenerationRequest)
                else GenerationRequest(id=i, prompt_token_ids=self.tokenizer.encode(p), params=params, prompt=p)
                for i, p in enumerate(prompts)]
        from tqdm import tqdm

        bar = tqdm(total=len(reqs), desc="generate", unit="req", dynamic_ncols=True) if use_tqdm else None
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

    def stream(self, requests: Iterable[GenerationRequest | None]) -> Iterator[RequestOutput]:
        """Outputs in input order as they finish; reads ``requests`` lazily (bounded lookahead). An item
        None means the source has nothing yet: the engine steps and asks again, instead of waiting for
        its read-ahead to fill (a source that yields None must block once the engine has no work)."""
        source = iter(requests)
        window = self.stream_window
        finished: dict[int, RequestOutput] = {}
        next_out = self.core.num_added
        exhausted = False
        while True:
            while not exhausted and self.core.num_added - next_out < window:
                try:
                    req = next(source)
                except StopIteration:
                    exhausted = True
                    break
                if req is None:         # nothing to read yet (a data-parallel replica's pipe): step meanwhile
                    break
                self.core.add(req, finished)
            if self.core.has_work():
                self._step(finished)
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if exhausted and not self.core.has_work() and next_out == self.core.num_added:
                return

    def _step(self, finished: dict[int, RequestOutput]) -> None:
        self.core.step(finished)

    def __repr__(self) -> str:
        return f"LLM(model={self.model_dir!r}, runtime={runtime.name()!r}, backend={self.config.attention.backend!r})"
