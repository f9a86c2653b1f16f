"""Which data-parallel replica takes the next request, and what the parent knows of each replica's run.

A request's expected work is its tokens: prompt plus ``n`` x ``max_tokens``. The next request goes to
the replica with the least expected work sent and not yet finished, among those under the bound of
requests whose output is not yet written. Counting work rather than requests keeps replicas even
when requests differ in length (one replica given the long ones would finish last while the others
idle), and counting it until the output *arrives* rather than until it is written lets a replica
that runs ahead take more, instead of waiting for a slower one's outputs to be written first.
Plain data: no pipes, no processes (tests drive it directly).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from paddle_mla.sched.request import GenerationRequest, RequestOutput


def request_work(req: GenerationRequest, max_model_len: int | None = None) -> int:
    """Expected tokens of ``req``: its prompt and every completion run to ``max_tokens``, capped as the
    engine caps it at ``max_model_len`` (an upper bound that is exact for ignore_eos workloads; a
    request the replica rejects costs it almost nothing)."""
    params, prompt = req.params, len(req.prompt_token_ids)
    try:
        out = max(1, int(params.max_tokens))
        if max_model_len is not None:
            out = max(1, min(out, max_model_len - prompt))
        return prompt + max(1, int(params.n)) * out
    except (TypeError, ValueError):      # invalid params: the replica answers with an error at once
        return 1


@dataclass
class ReplicaLoad:
    """The parent's book of one replica: what was sent and has not come back, in the replica's order."""

    unwritten: int = 0                   # sent, output not yet written by the caller (the memory bound)
    work: int = 0                        # expected tokens sent whose output has not arrived
    pending: deque[int] = field(default_factory=deque)   # the work of each request not yet arrived, in order

    def sent(self, work: int) -> None:
        self.unwritten += 1
        self.work += work
        self.pending.append(work)

    def arrived(self, count: int) -> None:
        """``count`` outputs came back (a replica returns its outputs in the order it was sent them)."""
        for _ in range(count):
            self.work -= self.pending.popleft()

    def written(self) -> None:
        self.unwritten -= 1


def pick(loads: Sequence[ReplicaLoad], bound: int) -> int | None:
    """The replica for the next request: least work in flight among those under ``bound`` unwritten
    requests (ties: fewer unwritten, then the lower index); None when every replica is at the bound."""
    best = None
    for i, load in enumerate(loads):
        if load.unwritten >= bound:
            continue
        if best is None or (load.work, load.unwritten) < (loads[best].work, loads[best].unwritten):
            best = i
    return best


@dataclass
class ReplicaRun:
    """One replica's share of the last ``stream`` (``DataParallelLLM.replica_runs``): what it was sent,
    when its outputs' first and last tokens came (``perf_counter``, one clock for every process), and
    how long its engine sat with nothing to run waiting for the parent's next requests."""

    index: int
    requests: int = 0
    work: int = 0                        # expected tokens sent (request_work)
    output_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    input_wait_s: float = 0.0            # from the replica, at the stream's end
    input_waits: int = 0
    tail_s: float = 0.0                  # the replica's engine: its last output to its stream's end

    def sent(self, work: int) -> None:
        self.requests += 1
        self.work += work

    def took(self, out: RequestOutput) -> None:
        m = out.metrics
        self.output_tokens += sum(len(c.token_ids) for c in out.outputs)
        first = m.first_token_time
        if first is not None and (self.first_token_time is None or first < self.first_token_time):
            self.first_token_time = first
        last = m.token_times[-1] if m.token_times else m.finish_time
        if last is not None and (self.last_token_time is None or last > self.last_token_time):
            self.last_token_time = last
