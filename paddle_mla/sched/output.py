"""What the scheduler sends the model runner each step: plain data (vLLM v1's shape), never a live
``Sequence``. The runner keeps a persistent input batch keyed by request id and applies these
changes to it; under tensor parallelism every rank receives the same message (it pickles small).

- ``NewRequest``: a request the runner does not hold (first admission, or re-admission after a
  preemption: its tokens so far are recomputed): everything it needs, once.
- ``ScheduledRow``: each row of the step, in row order: the change since the request's last step
  (block ids appended, the SWA recycling mark) and this step's tokens.
- ``StepInput.gone``: requests the runner must drop before this step (finished, failed, preempted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paddle_mla.sched.request import SamplingParams


@dataclass(slots=True)
class NewRequest:
    req_id: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]      # so far: non-empty when a preempted request is recomputed
    params: SamplingParams
    seed: int


@dataclass(slots=True)
class ScheduledRow:
    req_id: int
    num_new: int                     # tokens computed this step
    num_cached: int                  # tokens already in the KV cache before this step
    is_prefill: bool
    samples: bool                    # every known token is computed after this step: sample the next one
    token_ids: list[int]             # this step's tokens (PENDING: the step on the device samples it)
    new_block_ids: list[int]         # appended to the block table (head-wise: the full heads' row)
    # head-wise SWA: ids appended to each SWA head's row (-1: no block) and the block index below
    # which every SWA row's non-sink blocks are gone (recycled, or never taken on a prefix hit)
    new_swa_block_ids: list[list[int]] | None = None
    swa_dead_below: int = 0


@dataclass
class StepInput:
    new: list[NewRequest] = field(default_factory=list)
    scheduled: list[ScheduledRow] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new for r in self.scheduled)
