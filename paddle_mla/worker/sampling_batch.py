"""Host side of one sampling step: per-row parameters gathered from the sequences, the host
ledger of the penalty token state (``PenaltySlots``), and the unpacking of the step's single
device-to-host read.

Building is O(rows). The token counts of penalized rows live on the device per slot
(``penalties.PenaltyState``): a step lists only the penalized rows, their slots and parameters;
a sequence's tokens are listed once, when its slot is (re)admitted. Rows still under
``min_tokens`` list their masked stop ids. All of it goes up with the step's other inputs in its
one pinned copy (``sampler.device_arrays``).
This module imports no tensor library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.sched.request import Sequence, TokenLogprob, has_pending


@dataclass
class PenaltyStep:
    """The penalized rows of one step, the device slots of their token state, and the slots that
    start over this step (their tokens listed once: the only O(context) part, at admission)."""

    rows: np.ndarray             # int64 [P]: sampling rows with a penalty, ascending
    slots: np.ndarray            # int64 [P]: their slots
    repetition: np.ndarray       # float32 [P]
    frequency: np.ndarray        # float32 [P]
    presence: np.ndarray         # float32 [P]
    admit_slots: np.ndarray      # int64 [A]: slots cleared, then filled with the lists below
    admit_prompt: np.ndarray     # int64 [Tp]: slot * vocab + token, prompts of rows with a repetition penalty
    admit_output: np.ndarray     # int64 [To]: slot * vocab + token, output produced before this step


def admission_index(slots, token_lists, vocab_size: int) -> np.ndarray:
    """slot * vocab + token for each token of each slot's list (int64, one flat array)."""
    parts = [slot * vocab_size + np.asarray(toks, dtype=np.int64) for slot, toks in zip(slots, token_lists)]
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)


class PenaltySlots:
    """The host ledger of the device token state: which sequence each slot counts and how many of
    its output tokens are in. A penalized row is admitted when its slot holds another sequence (a
    new request, a slot reused, a preempted request back in another slot) or a count that is not
    its output's; else its state is current and nothing of its tokens goes up."""

    def __init__(self, max_slots: int):
        self.owner: list[Sequence | None] = [None] * max_slots   # objects, not ids: an id can be reused
        self.recorded = [0] * max_slots     # output tokens in the slot's counts after the planned step
        self.tokens_admitted = 0            # tests: tokens listed by admissions

    def release(self, slot: int) -> None:
        self.owner[slot] = None

    def plan(self, seqs: list[Sequence], rows: _RowParams, slots, vocab_size: int) -> PenaltyStep:
        """``slots``: the slot of each sampling row. Every planned row counts its sampled token
        (``PenaltyState.record``) in the same step."""
        pen = rows.penalty_rows
        admitted = []
        owner, recorded = self.owner, self.recorded
        for r in pen:
            seq, slot = seqs[r], int(slots[r])
            n = len(seq.output_token_ids)
            if owner[slot] is not seq or recorded[slot] != n:
                admitted.append(r)
                owner[slot] = seq
            recorded[slot] = n + 1
        prompts, outputs = [], []
        for r in admitted:
            seq = seqs[r]
            if has_pending(seq):   # the count would miss it: the engine reads such a row's step first
                raise RuntimeError("a penalized sequence is (re)admitted while its last token is still on the device")
            prompts.append(seq.prompt_token_ids if rows.repetition[r] != 1.0 else ())
            outputs.append(seq.output_token_ids)
        admit_slots = np.asarray(slots, dtype=np.int64)[admitted] if admitted else np.zeros(0, dtype=np.int64)
        step = PenaltyStep(rows=np.array(pen, dtype=np.int64), slots=np.asarray(slots, dtype=np.int64)[pen],
                           repetition=rows.repetition[pen], frequency=rows.frequency[pen],
                           presence=rows.presence[pen], admit_slots=admit_slots,
                           admit_prompt=admission_index(admit_slots, prompts, vocab_size),
                           admit_output=admission_index(admit_slots, outputs, vocab_size))
        self.tokens_admitted += len(step.admit_prompt) + len(step.admit_output)
        return step


@dataclass
class SamplingBatch:
    vocab_size: int
    temperature: np.ndarray      # float64 [B]; 0 means greedy
    top_k: np.ndarray            # int64 [B]; vocab_size where no top-k applies
    top_p: np.ndarray            # float64 [B]
    seeds: np.ndarray            # int64 [B]
    steps: np.ndarray            # int64 [B]: tokens generated so far (the noise counter)
    penalty: PenaltyStep | None  # the rows with a penalty and their slots; None when no row has one
    mask_index: np.ndarray       # int64 [M]: row * vocab + token of the stop ids masked by min_tokens
    logprob_rows: np.ndarray     # int64 [L]: rows that return logprobs
    num_top: np.ndarray          # int64 [L]: top_logprobs of each of those rows

    @property
    def num_rows(self) -> int:
        return len(self.temperature)

    @property
    def any_penalty(self) -> bool:
        return self.penalty is not None

    @property
    def max_top(self) -> int:
        return min(int(self.num_top.max()), self.vocab_size) if len(self.num_top) else 0


@dataclass
class _RowParams:
    """The per-row arrays that depend only on the rows' sequences (not on their tokens)."""

    seqs: list
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    seeds: np.ndarray
    presence: np.ndarray
    frequency: np.ndarray
    repetition: np.ndarray
    logprob_rows: np.ndarray
    num_top: np.ndarray
    penalty_rows: list[int]      # rows that count tokens (any penalty)
    min_token_rows: list[int]    # rows with min_tokens > 0 (they may mask stop ids)


def _row_params(seqs: list[Sequence], vocab_size: int) -> _RowParams:
    n = len(seqs)
    params = [s.params for s in seqs]
    top_k = np.fromiter((p.top_k for p in params), dtype=np.int64, count=n)
    lp_rows = [r for r, p in enumerate(params) if p.logprobs]
    return _RowParams(
        seqs=list(seqs),
        temperature=np.fromiter((p.temperature for p in params), dtype=np.float64, count=n),
        top_k=np.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size),
        top_p=np.fromiter((p.top_p for p in params), dtype=np.float64, count=n),
        seeds=np.fromiter((s.seed for s in seqs), dtype=np.int64, count=n),
        presence=np.fromiter((p.presence_penalty for p in params), dtype=np.float32, count=n),
        frequency=np.fromiter((p.frequency_penalty for p in params), dtype=np.float32, count=n),
        repetition=np.fromiter((p.repetition_penalty for p in params), dtype=np.float32, count=n),
        logprob_rows=np.array(lp_rows, dtype=np.int64),
        num_top=np.array([params[r].top_logprobs for r in lp_rows], dtype=np.int64),
        penalty_rows=[r for r, p in enumerate(params) if p.has_penalty],
        min_token_rows=[r for r, p in enumerate(params) if p.min_tokens > 0])


def build_sampling_batch(seqs: list[Sequence], eos_token_ids, vocab_size: int,
                         rows: _RowParams | None = None, slots=None,
                         ledger: PenaltySlots | None = None) -> SamplingBatch:
    """The parameters of the rows that sample this step, in row order. ``rows``: the row
    parameters of these very sequences from an earlier step (``SamplingBatchBuilder``); then only
    the token-dependent parts are built (steps, penalty plan, min_tokens masks).
    ``slots`` (per row) and ``ledger``: the runner's penalty token state. Without them the
    penalized rows get a fresh ledger over slots 0..B-1 (every row admitted: tests and tools,
    whose ``sampler`` calls then use a state of their own)."""
    if rows is None:
        rows = _row_params(seqs, vocab_size)
    steps = np.fromiter((len(s.output_token_ids) for s in seqs), dtype=np.int64, count=len(seqs))
    mask_index = []
    penalty = None
    if rows.penalty_rows:
        if ledger is None:
            ledger, slots = PenaltySlots(len(seqs)), np.arange(len(seqs), dtype=np.int64)
        penalty = ledger.plan(seqs, rows, slots, vocab_size)
    if rows.min_token_rows:
        eos = sorted(eos_token_ids)
        for row in rows.min_token_rows:
            p = seqs[row].params
            if steps[row] < p.min_tokens:
                ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
                mask_index.append(row * vocab_size + np.array(sorted(t for t in ids if t < vocab_size),
                                                              dtype=np.int64))

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    return SamplingBatch(
        vocab_size=vocab_size, temperature=rows.temperature, top_k=rows.top_k, top_p=rows.top_p, seeds=rows.seeds,
        steps=steps, penalty=penalty, mask_index=cat(mask_index, np.int64), logprob_rows=rows.logprob_rows,
        num_top=rows.num_top)


class SamplingBatchBuilder:
    """Keeps the row parameters of the last step: a step that samples the same sequences in the
    same order (every steady decode step) rebuilds only the token-dependent parts."""

    def __init__(self):
        self._rows: _RowParams | None = None
        self._vocab = 0

    def build(self, seqs: list[Sequence], eos_token_ids, vocab_size: int, slots=None,
              ledger: PenaltySlots | None = None) -> SamplingBatch:
        rows = self._rows
        if rows is None or self._vocab != vocab_size or rows.seqs != seqs:   # identity compare per row
            rows = self._rows = _row_params(seqs, vocab_size)
            self._vocab = vocab_size
        return build_sampling_batch(seqs, eos_token_ids, vocab_size, rows, slots, ledger)


def unpack(host: np.ndarray, batch: SamplingBatch) -> tuple[np.ndarray, list[TokenLogprob | None]]:
    """The read of ``sampler.sample_step``'s packed tensor -> (token ids int64 [B], logprobs per row).

    Layout (float64, exact for token ids): B sampled ids, then for each logprob row
    [sampled logprob, max_top ids, max_top logprobs]."""
    rows = batch.num_rows
    token_ids = host[:rows].astype(np.int64)
    logprobs: list[TokenLogprob | None] = [None] * rows
    n_top = batch.max_top
    table = host[rows:].reshape(len(batch.logprob_rows), 1 + 2 * n_top)
    for row, k, entry in zip(batch.logprob_rows.tolist(), batch.num_top.tolist(), table):
        top_ids = entry[1:1 + k].astype(np.int64).tolist()
        top_lps = entry[1 + n_top:1 + n_top + k].tolist()
        logprobs[row] = TokenLogprob(int(token_ids[row]), float(entry[0]), list(zip(top_ids, top_lps)))
    return token_ids, logprobs
