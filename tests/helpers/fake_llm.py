"""A deterministic stand-in for ``paddle_mla.engine.llm.LLM`` with the same interface, for testing
the CLI's I/O, ordering and error handling in milliseconds: it produces n completions, logprobs
and the max_tokens cut warning as the engine's outputs carry them (values are made up, only the
shapes matter). The end-to-end tests use the real engine on the tiny model; this one covers what
is independent of the model."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator

from paddle_mla.config.schema import EngineConfig
from paddle_mla.sched.request import (CompletionOutput, EngineStats, GenerationRequest, RequestMetrics, RequestOutput,
                                       SamplingParams, TokenLogprob)

OFFSET = 3   # 0 pad, 1 bos, 2 eos; byte b is token b + OFFSET


class ByteTokenizer:
    vocab_size = 300
    eos_token_id = 2
    all_special_ids = (0, 1, 2)
    has_text = True

    def __init__(self, chat_template: bool = False):
        self.chat_template = chat_template

    def encode(self, text: str) -> list[int]:
        return [b + OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - OFFSET for i in ids if OFFSET <= i < 256 + OFFSET).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if not self.chat_template:
            raise ValueError("the tokenizer of this model has no chat template")
        return self.encode("".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>")


class FakeLLM:
    def __init__(self, config: EngineConfig, max_model_len: int = 64, lookahead: int = 4,
                 chat_template: bool = False, fail_over: int | None = 48, delay_s: float = 0.0):
        self.config = config
        self.tokenizer = ByteTokenizer(chat_template)
        self.max_model_len = config.max_model_len if isinstance(config.max_model_len, int) else max_model_len
        self.lookahead = lookahead
        self.fail_over = fail_over          # prompts longer than this "cannot fit" (finish_reason error)
        self.delay_s = delay_s
        self.max_seen_pending = 0
        self.reset_stats()

    def default_params(self) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
                              ignore_eos=s.ignore_eos)

    def _completion(self, req: GenerationRequest, index: int, metrics: RequestMetrics, max_tokens: int
                    ) -> CompletionOutput:
        """Deterministic tokens from (prompt, seed, index); logprobs are a fixed function of the token."""
        p = req.params
        base = sum(req.prompt_token_ids) * 31 + (p.seed or 0) * (p.temperature > 0) + 13 * index
        out, reason, lps = [], "length", []
        for i in range(max_tokens):
            tok = OFFSET + 32 + (base + 7 * i) % 95
            if self.delay_s:
                time.sleep(self.delay_s)
            out.append(tok)
            if p.logprobs:
                top = [(OFFSET + 32 + (tok + j) % 95, -0.5 * (j + 1)) for j in range(p.top_logprobs)]
                lps.append(TokenLogprob(tok, -0.25 - 0.01 * (i % 5), top))
            metrics.token_times.append(time.perf_counter())
            if tok in p.stop_token_ids and i + 1 >= p.min_tokens:
                reason = "stop"
                break
        seed = None if p.seed is None else p.seed + index
        return CompletionOutput(index, out, self.tokenizer.decode(out), reason, lps if p.logprobs else None, seed)

    def _run(self, req: GenerationRequest) -> RequestOutput:
        p = req.params
        now = time.perf_counter()
        metrics = RequestMetrics(arrival_time=now)
        if self.fail_over is not None and len(req.prompt_token_ids) > self.fail_over:
            return RequestOutput(req.id, req.prompt_token_ids, [],
                                 f"the request needs more KV blocks than the cache has ({len(req.prompt_token_ids)} "
                                 "prompt tokens)", metrics, p.seed)
        room = self.max_model_len - len(req.prompt_token_ids)
        warnings = []
        if p.max_tokens > room:        # as the engine does: cut at max_model_len, and say so
            warnings.append(f"max_tokens {p.max_tokens} was cut to {room}: the prompt has "
                            f"{len(req.prompt_token_ids)} tokens and max_model_len is {self.max_model_len}")
        outputs = [self._completion(req, i, metrics, min(p.max_tokens, room)) for i in range(p.n)]
        metrics.first_token_time = metrics.token_times[0] if metrics.token_times else None
        metrics.finish_time = time.perf_counter()
        self._stats.requests += 1
        self._stats.prompt_tokens += len(req.prompt_token_ids)
        self._stats.completion_tokens += sum(len(c.token_ids) for c in outputs)
        return RequestOutput(req.id, req.prompt_token_ids, outputs, None, metrics, p.seed, warnings)

    def stream(self, requests: Iterable[GenerationRequest]) -> Iterator[RequestOutput]:
        window: deque[GenerationRequest] = deque()
        it = iter(requests)
        exhausted = False
        while True:
            while not exhausted and len(window) < self.lookahead:
                try:
                    window.append(next(it))
                except StopIteration:
                    exhausted = True
            self.max_seen_pending = max(self.max_seen_pending, len(window))
            if not window:
                return
            yield self._run(window.popleft())

    def generate(self, prompts, params=None, use_tqdm=True) -> list[RequestOutput]:
        reqs = [p if isinstance(p, GenerationRequest) else
                GenerationRequest(i, self.tokenizer.encode(p), dataclasses.replace(params or self.default_params()))
                for i, p in enumerate(prompts)]
        return list(self.stream(reqs))

    def stats(self) -> EngineStats:
        return dataclasses.replace(self._stats)

    def reset_stats(self) -> None:
        self._stats = EngineStats()


def run_cli_with_fake(argv: list[str]) -> None:
    """Entry point for subprocess tests: the CLI with FakeLLM (FAKE_LLM_DELAY_S slows each token)."""
    from paddle_mla.cli import app as cli

    delay = float(os.environ.get("FAKE_LLM_DELAY_S", "0"))
    load_delay = float(os.environ.get("FAKE_LLM_LOAD_DELAY_S", "0"))

    def build(cfg):
        time.sleep(load_delay)       # stands in for a slow model load (SIGINT-during-start-up tests)
        return FakeLLM(cfg, delay_s=delay, fail_over=None)

    cli.build_llm = build
    sys.argv = ["paddle-mla", *argv]
    cli.main()


if __name__ == "__main__":
    run_cli_with_fake(sys.argv[1:])
