"""Plain-data messages of the engine: sampling parameters, requests, outputs, statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


MAX_TOP_LOGPROBS = 20
MAX_N = 128


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value   # not NaN


@dataclass
class SamplingParams:
    temperature: float = 0.0      # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0                # 0 or -1: all tokens
    max_tokens: int = 64
    seed: int | None = None       # None: drawn from the engine seed, recorded in the output
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0           # eos and stop_token_ids are masked out of the logits before this many tokens
    n: int = 1                    # completions per request (each with its own derived seed)
    presence_penalty: float = 0.0     # OpenAI: logits -= p * (count > 0) over the output tokens so far
    frequency_penalty: float = 0.0    # OpenAI: logits -= f * count over the output tokens so far
    repetition_penalty: float = 1.0   # CTRL/vLLM: over prompt + output tokens, divide positive logits,
                                      # multiply negative
    logprobs: bool = False        # return each sampled token's logprob
    top_logprobs: int = 0         # and this many most likely alternatives per position (needs logprobs)

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or self.temperature < 0:
            bad(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            bad(f"top_k must be an integer >= -1 (0 or -1 mean all tokens), got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            bad(f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2**63):
            bad(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            bad(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            bad(f"stop_token_ids must be a list of non-negative integers, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            bad(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            bad(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                bad(f"{name} must be a number in [-2, 2], got {value!r}")
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty < float("inf"):
            bad(f"repetition_penalty must be a number > 0 (1 means none), got {self.repetition_penalty!r}")
        if not isinstance(self.logprobs, bool):
            bad(f"logprobs must be true or false, got {self.logprobs!r}")
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            bad(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        if self.top_logprobs and not self.logprobs:
            bad("top_logprobs needs logprobs: true")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalty(self) -> bool:
        """A penalty applies: the sampler counts the row's tokens (listed on the host)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


@dataclass
class GenerationRequest:
    id: Any
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_cached_tokens: int = 0     # prompt tokens served from the prefix cache (first admission)



@dataclass
class TokenLogprob:
    """One generated position: the sampled token's logprob and the ``top_logprobs`` most likely tokens.

    Logprobs are the log-softmax of the model's raw logits (before penalties, temperature, top-k
    and top-p), as vLLM returns by default."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)   # (token id, logprob), most likely first


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request."""

    index: int
    token_ids: list[int]
    text: str | None               # None when the model folder has no tokenizer
    finish_reason: str             # "stop" | "length"
    logprobs: list[TokenLogprob] | None = None   # one per token when SamplingParams.logprobs
    seed: int | None = None


@dataclass
class RequestOutput:
    id: Any
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]            # n completions, by index; empty when error is set
    error: str | None
    metrics: RequestMetrics
    seed: int | None = None                    # the request's seed (completion i > 0 derives its own)
    warnings: list[str] = field(default_factory=list)   # e.g. max_tokens capped at max_model_len

    @property
    def finish_reason(self) -> str:
        return "error" if self.error is not None else self.outputs[0].finish_reason

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids if self.outputs else []

    @property
    def text(self) -> str | None:
        return self.outputs[0].text if self.outputs else ""


@dataclass
class EngineStats:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    peak_blocks_used: int = 0
    num_blocks: int = 0
    elapsed_s: float = 0.0
    steps: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)    # compared by identity: the n sequences of one request share most fields
class Sequence:
    """Engine-side state of one completion of a request (a request with n completions has n)."""

    request: GenerationRequest
    index: int                      # the request's position in the input stream (output order)
    seed: int
    metrics: RequestMetrics         # shared by the n sequences of a request
    completion: int = 0             # which of the request's n completions this is
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)   # one per output token when params.logprobs
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0    # tokens whose KV is in the cache
    num_cached_on_admit: int = -1   # prefix-cache hit of the first admission (-1: not admitted yet)
    block_keys: list = field(default_factory=list)   # prefix-cache key chain of the full blocks
    num_registered_blocks: int = 0
    # head-wise SWA (cache/head_pool.py): block_ids is then the full heads' row; these are the
    # SWA heads' rows (one per SWA head, -1 for no block) and the block index below which every
    # SWA row's non-sink blocks are already gone (recycled, or never taken on a prefix hit)
    swa_block_ids: list[list[int]] = field(default_factory=list)
    swa_dead_below: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    error: str | None = None
    text: str | None = None         # set when a stop string cut the text; else decoded at the end
    # Read by the per-token checks instead of the params, computed once (None: from the params in
    # __post_init__; the engine core passes both): the output length that stops it by length
    # (max_tokens, or less where max_model_len leaves less) and the token ids that stop it (stop
    # ids, and eos unless ignored: the engine knows eos).
    length_limit: int | None = None
    stop_ids: frozenset | None = None
    # the runner's copy (sched/output.py): the request id it is known by there (given by the
    # scheduler), whether the runner holds it, and how many block ids of each row it was sent
    seq_id: int = -1
    in_runner: bool = False
    sent_blocks: int = 0
    sent_swa: int = 0

    def __post_init__(self):
        p = self.request.params
        if self.length_limit is None:
            self.length_limit = p.max_tokens
        if self.stop_ids is None:
            self.stop_ids = frozenset(p.stop_token_ids)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        return self.request.prompt_token_ids + self.output_token_ids


PENDING = -1


def token_slice(seq: Sequence, start: int, end: int) -> list[int]:
    """Tokens [start, end) of prompt + output, without building the whole list."""
    prompt, out = seq.request.prompt_token_ids, seq.output_token_ids
    p = len(prompt)
    if end <= p:
        return prompt[start:end]
    if start >= p:
        return out[start - p:end - p]
    return prompt[start:] + out[:end - p]


def has_pending(seq: Sequence) -> bool:
    out = seq.output_token_ids
    return bool(out) and out[-1] == PENDING
