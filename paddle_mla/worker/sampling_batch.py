"""Host side of one sampling step: per-row parameters gathered from the sequences, and the
unpacking of the step's single device-to-host read.

Building is O(rows) for plain rows. Rows with penalties also list their counted tokens (prompt +
output with a repetition penalty, output only otherwise) and rows still under ``min_tokens`` list
their masked stop ids; both go up with the step's other inputs in its one pinned copy
(``sampler.device_arrays``); the penalty rows' lists are still O(context) per step.
This module imports no tensor library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.sched.request import Sequence, TokenLogprob


@dataclass
class SamplingBatch:
    vocab_size: int
    temperature: np.ndarray      # float64 [B]; 0 means greedy
    top_k: np.ndarray            # int64 [B]; vocab_size where no top-k applies
    top_p: np.ndarray            # float64 [B]
    seeds: np.ndarray            # int64 [B]
    steps: np.ndarray            # int64 [B]: tokens generated so far (the noise counter)
    presence: np.ndarray         # float32 [B]
    frequency: np.ndarray        # float32 [B]
    repetition: np.ndarray       # float32 [B]
    count_index: np.ndarray      # int64 [T]: row * vocab + token of every counted token of the penalty rows
    count_is_output: np.ndarray  # float32 [T]: 1 for generated tokens, 0 for prompt tokens
    mask_index: np.ndarray       # int64 [M]: row * vocab + token of the stop ids masked by min_tokens
    logprob_rows: np.ndarray     # int64 [L]: rows that return logprobs
    num_top: np.ndarray          # int64 [L]: top_logprobs of each of those rows

    @property
    def num_rows(self) -> int:
        return len(self.temperature)

    @property
    def any_penalty(self) -> bool:
        return len(self.count_index) > 0

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
                         rows: _RowParams | None = None) -> SamplingBatch:
    """The parameters of the rows that sample this step, in row order. ``rows``: the row
    parameters of these very sequences from an earlier step (``SamplingBatchBuilder``); then only
    the token-dependent parts are built (steps, penalty counts, min_tokens masks)."""
    if rows is None:
        rows = _row_params(seqs, vocab_size)
    steps = np.fromiter((len(s.output_token_ids) for s in seqs), dtype=np.int64, count=len(seqs))
    count_index, count_is_output, mask_index = [], [], []
    for row in rows.penalty_rows:
        seq = seqs[row]
        p = seq.params
        # The repetition penalty also counts the prompt; the others only the output.
        start = 0 if p.repetition_penalty != 1.0 else seq.prompt_len
        toks = np.asarray(seq.token_ids()[start:], dtype=np.int64)
        count_index.append(row * vocab_size + toks)
        count_is_output.append((np.arange(len(toks)) >= seq.prompt_len - start).astype(np.float32))
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
        steps=steps, presence=rows.presence, frequency=rows.frequency, repetition=rows.repetition,
        count_index=cat(count_index, np.int64), count_is_output=cat(count_is_output, np.float32),
        mask_index=cat(mask_index, np.int64), logprob_rows=rows.logprob_rows, num_top=rows.num_top)


class SamplingBatchBuilder:
    """Keeps the row parameters of the last step: a step that samples the same sequences in the
    same order (every steady decode step) rebuilds only the token-dependent parts."""

    def __init__(self):
        self._rows: _RowParams | None = None
        self._vocab = 0

    def build(self, seqs: list[Sequence], eos_token_ids, vocab_size: int) -> SamplingBatch:
        rows = self._rows
        if rows is None or self._vocab != vocab_size or rows.seqs != seqs:   # identity compare per row
            rows = self._rows = _row_params(seqs, vocab_size)
            self._vocab = vocab_size
        return build_sampling_batch(seqs, eos_token_ids, vocab_size, rows)


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
