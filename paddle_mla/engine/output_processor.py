"""What the engine makes of a step's tokens once the scheduler has them: logprobs, timings, stop
strings (they need the tokenizer), the n completions of a request gathered into one output, texts,
and the engine's statistics. Plain host logic: no tensor library.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass

from paddle_mla.engine.stop_strings import StopStringMatcher
from paddle_mla.sched.request import CompletionOutput, EngineStats, RequestOutput, Sequence, Status


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
class RequestGroup:
    """A request in flight: its n sequences, how many are still running, and its warnings."""

    seqs: list[Sequence]
    remaining: int
    warnings: list[str]
    deferred: list[Sequence] = dataclasses.field(default_factory=list)   # not yet given to the scheduler


class OutputProcessor:
    def __init__(self, tokenizer, num_blocks: int):
        """``tokenizer``: decodes texts and finds stop strings (a token-ids-only tokenizer
        decodes to None; stop strings then never match)."""
        self.tokenizer = tokenizer
        self.groups: dict[int, RequestGroup] = {}
        self.stats = EngineStats(num_blocks=num_blocks)
        self._stop_matchers: weakref.WeakKeyDictionary[Sequence, StopStringMatcher] = weakref.WeakKeyDictionary()
        self._token_texts: dict[int, str] = {}     # one-token decodes of the stop-string detector (<= vocab)

    def reset_stats(self, num_blocks: int) -> None:
        self.stats = EngineStats(num_blocks=num_blocks)

    def add(self, index: int, group: RequestGroup) -> None:
        self.groups[index] = group
        self.stats.requests += 1
        first = group.seqs[0]
        self.stats.prompt_tokens += first.prompt_len * len(group.seqs)   # each completion runs the prompt

    def record(self, out, logprobs: list, sampled_rows: list[int]) -> list[list[Sequence]]:
        """The step's sampled rows (``sampled_rows``: rows of ``out.scheduled`` that got a token):
        their logprobs and token times. Returns the deferred siblings to queue now, a list per
        request whose completion 0 has its first token (its prompt blocks are then cached)."""
        self.stats.steps += 1
        self.stats.completion_tokens += len(sampled_rows)
        now = time.perf_counter()
        scheduled, admit = out.scheduled, []
        for i in sampled_rows:
            seq = scheduled[i].seq
            logprob = logprobs[i]
            if logprob is not None:
                seq.logprobs.append(logprob)
            metrics = seq.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.token_times.append(now)
            if seq.completion == 0 and len(seq.output_token_ids) == 1:   # the only time siblings wait
                group = self.groups.get(seq.index)
                if group is not None and group.deferred:
                    admit.append(group.deferred)
                    group.deferred = []
        return admit

    def stop_strings(self, rows: list[tuple[Sequence, int]]) -> list[Sequence]:
        """The rows (``StepUpdate.stop_string_rows``) whose text now holds a stop string get finish
        reason "stop" and their text cut before it; returns those still running, for the engine to
        finish. The window detector runs on all the step's rows at once (``found_many``); a hit is
        confirmed by one full decode."""
        if not rows or self.tokenizer is None:
            return []
        matchers = [self._stop_matcher(seq) for seq, _ in rows]
        outs = [seq.output_token_ids for seq, _ in rows]
        to_finish = []
        for (seq, _), hit in zip(rows, StopStringMatcher.found_many(matchers, outs, self._token_texts)):
            if not hit:
                continue
            text = self.tokenizer.decode(seq.output_token_ids)
            cut = min((i for i in (text.find(s) for s in seq.params.stop) if i >= 0), default=-1)
            if cut >= 0:
                seq.finish_reason, seq.text = "stop", text[:cut]
                if seq.status is not Status.FINISHED:
                    to_finish.append(seq)
        return to_finish

    def _stop_matcher(self, seq: Sequence) -> StopStringMatcher:
        matcher = self._stop_matchers.get(seq)
        if matcher is None:
            matcher = self._stop_matchers[seq] = StopStringMatcher(self.tokenizer, seq.params.stop)
        return matcher

    def completed(self, seq: Sequence, finished: dict[int, RequestOutput]) -> None:
        """A finished sequence: its request's output once all n completions finished."""
        seq.metrics.finish_time = time.perf_counter()
        group = self.groups.get(seq.index)
        if group is None:      # its request already failed
            return
        group.remaining -= 1
        if group.remaining == 0:
            del self.groups[seq.index]
            finished[seq.index] = self._output(group)

    def failed(self, seq: Sequence, finished: dict[int, RequestOutput]) -> list[Sequence]:
        """A failed sequence fails its whole request: its error output. Returns the siblings not
        finished yet, for the engine to drop from the scheduler."""
        group = self.groups.pop(seq.index, None)
        if group is None:
            return []
        req = seq.request
        finished[seq.index] = RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=[],
                                            error=seq.error, metrics=seq.metrics, seed=group.seqs[0].seed,
                                            warnings=group.warnings)
        return [s for s in group.seqs if s is not seq and s.status is not Status.FINISHED]

    def _output(self, group: RequestGroup) -> RequestOutput:
        first = group.seqs[0]
        outputs = []
        for seq in group.seqs:
            text = seq.text
            if text is None and self.tokenizer is not None:
                text = self.tokenizer.decode(seq.output_token_ids)
            outputs.append(CompletionOutput(seq.completion, list(seq.output_token_ids), text, seq.finish_reason,
                                            logprobs=list(seq.logprobs) if seq.params.logprobs else None,
                                            seed=seq.seed))
        first.metrics.num_cached_tokens = max(first.num_cached_on_admit, 0)
        req = first.request
        return RequestOutput(id=req.id, prompt_token_ids=req.prompt_token_ids, outputs=outputs, error=None,
                             metrics=first.metrics, seed=first.seed, warnings=group.warnings)
