"""A token-level fake of the KV cache for scheduler tests (see tests/unit/scheduler/test_scheduler.py)."""

from __future__ import annotations

from paddle_mla.sched.scheduler import Scheduler


def next_token(history: list[int]) -> int:
    return (sum(t * (i + 7) for i, t in enumerate(history[-5:])) + len(history)) % 97


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int):
        self.slots: dict[int, int] = {}
        self.block_size = block_size
        self.tokens_per_step: list[int] = []

    def execute(self, out) -> list[int]:
        bs = self.block_size
        # decodes lead every batch (attention backends run the leading one-token rows through their
        # decode kernel and only the rest through extend)
        decode = [not s.is_prefill for s in out.scheduled]
        assert decode == sorted(decode, reverse=True), "a decode row after a prefill row"
        assert all(s.num_new == 1 for s in out.scheduled if not s.is_prefill)
        sampled = []
        for s in out.scheduled:
            ids = s.seq.token_ids()
            for pos in range(s.num_cached):      # the cached prefix must be intact
                slot = s.seq.block_ids[pos // bs] * bs + pos % bs
                assert self.slots.get(slot) == ids[pos], f"stale KV at position {pos} of request {s.seq.request.id}"
            for pos in range(s.num_cached, s.num_cached + s.num_new):
                self.slots[s.seq.block_ids[pos // bs] * bs + pos % bs] = ids[pos]
            sampled.append(next_token(ids[: s.num_cached + s.num_new]) if s.samples else -1)
        self.tokens_per_step.append(out.num_tokens)
        return sampled


def drive(sched: Scheduler, execute, max_tokens: int, after_step=lambda out: None) -> int:
    """Run ``sched`` to completion, ``execute(out)`` giving each scheduled row's sampled token (-1
    where none), through the scheduler's own ``update_from_output`` (the requests' max_tokens, which
    must be ``max_tokens``, finish them); returns the number of steps."""
    steps = 0
    while sched.has_work():
        out = sched.schedule()
        assert out.num_tokens <= sched.cfg.max_num_batched_tokens or not sched.cfg.enable_chunked_prefill
        assert all(s.seq.params.max_tokens == max_tokens for s in out.scheduled)
        sampled = execute(out) if out.scheduled else []
        update = sched.update_from_output(out, sampled)
        after_step(out)
        assert all(len(seq.output_token_ids) == max_tokens and seq.finish_reason == "length"
                   for seq in update.finished)
        steps += 1
        assert steps < 20_000, "scheduler made no progress"
    return steps
