"""Token state of the penalized requests, kept on the device per slot, so that a step's penalty
work on the host is O(penalized rows) and its upload does not grow with the context.

Per slot (the runner's row of a running sequence): ``output_counts`` int32 [max_slots, vocab],
how often each token occurs in the output (presence / frequency penalties, and the output half of
the repetition penalty), and ``prompt_seen`` bool [max_slots, vocab], the prompt tokens (the
other half of the repetition penalty). A slot is filled once when its sequence is admitted
(prompt, plus the output already produced when a preempted sequence is recomputed), grows by the
step's sampled ids ON THE DEVICE (no host read: the sampled token need not be on the host yet, as
under overlapped scheduling), and is cleared on release or by the next admission.
The tensors are allocated on the first admission: an engine that never sees a penalty pays nothing.

Which sequence each slot holds is kept on the host by ``sampling_batch.PenaltySlots`` (the
``ledger``); its ``PenaltyStep`` lists a step's rows, slots and admissions, uploaded with the
step's other inputs (``penalty_arrays``).
"""

from __future__ import annotations

import numpy as np
from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.worker.sampling_batch import PenaltySlots, PenaltyStep, admission_index  # noqa: E402


def staged(dev: dict | None, name: str, host: np.ndarray, dtype, device):
    """The staged device tensor ``name`` when the runner uploaded it, else ``host`` uploaded now."""
    if dev is not None and name in dev:
        return dev[name]
    return torch.from_numpy(np.ascontiguousarray(host)).to(device).to(dtype)


def penalty_arrays(step: PenaltyStep) -> dict[str, np.ndarray]:
    """The host arrays of ``step`` that go up with the step's inputs (empty admissions left out)."""
    out = {"pen_rows": step.rows, "pen_slots": step.slots, "repetition": step.repetition,
           "frequency": step.frequency, "presence": step.presence}
    for name in ("admit_slots", "admit_prompt", "admit_output"):
        value = getattr(step, name)
        if len(value):
            out[name] = value
    return out


class PenaltyState:
    def __init__(self, max_slots: int, vocab_size: int, device: str):
        self.max_slots, self.vocab_size, self.device = max_slots, vocab_size, device
        self.ledger = PenaltySlots(max_slots)
        self.output_counts = None    # int32 [max_slots, vocab]
        self.prompt_seen = None      # bool [max_slots, vocab]
        self._ones = None            # int32 [max_slots]: the increments of one step's record

    @property
    def allocated(self) -> bool:
        return self.output_counts is not None

    def _allocate(self) -> None:
        if self.output_counts is None:
            shape = (self.max_slots, self.vocab_size)
            self.output_counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self.prompt_seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
            self._ones = torch.ones(self.max_slots, dtype=torch.int32, device=self.device)

    def admit(self, slot: int, prompt_ids, output_ids) -> None:
        """Start ``slot`` over with these tokens (uploaded now: tests and tools; the runner stages
        its admissions through ``PenaltyStep``). ``prompt_ids`` count for the repetition penalty only."""
        self.ledger.release(slot)
        slots = np.array([slot], dtype=np.int64)
        self._admit(torch.from_numpy(slots).to(self.device),
                    admission_index(slots, [prompt_ids], self.vocab_size),
                    admission_index(slots, [output_ids], self.vocab_size), None)

    def release(self, slot: int) -> None:
        """``slot`` no longer holds a sequence: its counts and prompt mark go back to zero."""
        self.ledger.release(slot)
        if self.allocated:
            self.output_counts[slot] = 0
            self.prompt_seen[slot] = False

    def _admit(self, slots, prompt_index: np.ndarray, output_index: np.ndarray, dev: dict | None) -> None:
        self._allocate()
        self.output_counts[slots] = 0
        self.prompt_seen[slots] = False
        if len(prompt_index):
            idx = staged(dev, "admit_prompt", prompt_index, torch.int64, self.device)
            # index_put_, not scatter_: the Paddle proxy has no bool scatter
            self.prompt_seen.view(-1).index_put_((idx,), torch.ones(len(prompt_index), dtype=torch.bool,
                                                                   device=self.device))
        if len(output_index):
            idx = staged(dev, "admit_output", output_index, torch.int64, self.device)
            self.output_counts.view(-1).scatter_add_(0, idx, torch.ones(len(output_index), dtype=torch.int32,
                                                                        device=self.device))

    def admit_step(self, step: PenaltyStep, dev: dict | None = None) -> None:
        """The admissions that ``step`` lists (before its rows are applied)."""
        if len(step.admit_slots):
            self._admit(staged(dev, "admit_slots", step.admit_slots, torch.int64, self.device),
                        step.admit_prompt, step.admit_output, dev)

    def apply(self, logits, step: PenaltyStep, dev: dict | None = None):
        """vLLM's apply_penalties on the rows of ``step`` (new tensor; the other rows unchanged):
        positive logits of tokens seen in prompt + output divided by the repetition penalty,
        negative ones multiplied; then logits -= frequency * count + presence * (count > 0)."""
        self._allocate()
        device, every_row = logits.device, len(step.rows) == logits.shape[0]
        rows = staged(dev, "pen_rows", step.rows, torch.int64, device)
        slots = staged(dev, "pen_slots", step.slots, torch.int64, device)
        counts = self.output_counts[slots]
        x = logits if every_row else logits[rows]
        if (step.repetition != 1.0).any():
            seen = self.prompt_seen[slots] | (counts > 0)
            rep = staged(dev, "repetition", step.repetition, torch.float32, device).unsqueeze(1).expand(x.shape)
            factor = torch.where(seen, rep, torch.ones_like(x))
            x = torch.where(x > 0, x / factor, x * factor)
        if (step.frequency != 0).any() or (step.presence != 0).any():
            out_counts = counts.to(torch.float32)
            freq = staged(dev, "frequency", step.frequency, torch.float32, device).unsqueeze(1)
            pres = staged(dev, "presence", step.presence, torch.float32, device).unsqueeze(1)
            x = x - freq * out_counts - pres * (out_counts > 0).to(torch.float32)
        if every_row:       # rows are distinct and ascending: all of them is 0..B-1
            return x
        return logits.scatter(0, rows.unsqueeze(1).expand(x.shape), x)

    def record(self, step: PenaltyStep, sampled, dev: dict | None = None) -> None:
        """Count the step's sampled ids (int64 [B] on the device) into the slots of its penalized rows."""
        device = sampled.device
        ids = sampled if len(step.rows) == sampled.shape[0] else \
            sampled[staged(dev, "pen_rows", step.rows, torch.int64, device)]
        flat = staged(dev, "pen_slots", step.slots, torch.int64, device) * self.vocab_size + ids
        self.output_counts.view(-1).scatter_add_(0, flat, self._ones[:len(step.rows)])
