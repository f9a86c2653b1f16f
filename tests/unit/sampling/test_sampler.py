"""The sampler on fixed logits against the plain numpy references of tests/helpers/sampling_reference.py:
the min_tokens masks and the penalties, top-k / top-p, greedy on the processed logits, the
logprobs packed into the step's one read, and a chi-square test of the sampled frequencies."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.sampling_reference import (CHI2_CRITICAL_1E3, chi_square, log_softmax, min_tokens_mask, penalties,
                                sampling_probs, top_k_top_p)

from paddle_mla.worker import sampler
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence
from paddle_mla.worker.sampling_batch import SamplingBatchBuilder, build_sampling_batch, unpack
from paddle_mla.platform.tensor_api import torch

EOS = {2}


def make_seq(prompt, output=(), seed=0, **params) -> Sequence:
    seq = Sequence(GenerationRequest(0, list(prompt), SamplingParams(**params)), index=0, seed=seed,
                   metrics=RequestMetrics(0.0))
    seq.output_token_ids = list(output)
    return seq


def tensor(x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def to_numpy(t) -> np.ndarray:
    return np.asarray(t.cpu().numpy(), dtype=np.float64)


def fixed_logits(rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, vocab)) * 3).astype(np.float32)


PROCESS_ROWS = [
    dict(prompt=[1, 3], output=[5]),                                        # nothing to do
    dict(prompt=[1, 2, 3], output=[3, 4, 4], repetition_penalty=1.5),
    dict(prompt=[6, 7], output=[4, 4, 5, 9, 4], presence_penalty=0.5, frequency_penalty=0.7),
    dict(prompt=[8, 2, 11], output=[11, 12], presence_penalty=-0.4, frequency_penalty=1.2, repetition_penalty=0.7),
    dict(prompt=[1], output=[3, 4], min_tokens=5, max_tokens=8, stop_token_ids=[7, 13]),   # eos 2, 7, 13 masked
    dict(prompt=[1], output=[3, 4], min_tokens=5, max_tokens=8, stop_token_ids=[7], ignore_eos=True),
    dict(prompt=[1], output=[3, 4, 5, 6, 7], min_tokens=5, max_tokens=8, stop_token_ids=[7]),   # reached: none
    dict(prompt=[9, 9], output=[9], min_tokens=3, stop_token_ids=[9, 99], repetition_penalty=2.0),
]


def reference_processed(logits: np.ndarray, rows: list[dict]) -> np.ndarray:
    out = []
    for x, r in zip(logits, rows):
        p = SamplingParams(**{k: v for k, v in r.items() if k not in ("prompt", "output")})
        y = min_tokens_mask(x, len(r["output"]), p.min_tokens, p.stop_token_ids, EOS, p.ignore_eos)
        out.append(penalties(y, r["prompt"], r["output"], p.presence_penalty, p.frequency_penalty,
                             p.repetition_penalty))
    return np.stack(out)


def assert_same_logits(ours: np.ndarray, ref: np.ndarray) -> None:
    assert np.array_equal(np.isneginf(ours), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(ours[finite], ref[finite], rtol=1e-5, atol=1e-5)


def test_min_tokens_and_penalties_match_reference():
    vocab = 16
    logits = fixed_logits(len(PROCESS_ROWS), vocab)
    seqs = [make_seq(**r) for r in PROCESS_ROWS]
    batch = build_sampling_batch(seqs, EOS, vocab)
    ours = to_numpy(sampler.process_logits(tensor(logits), batch))
    ref = reference_processed(logits, PROCESS_ROWS)
    assert_same_logits(ours, ref)
    assert np.isneginf(ours[4, [2, 7, 13]]).all() and not np.isneginf(ours[5, 2]) and np.isneginf(ours[5, 7])
    assert not np.isneginf(ours[6]).any()
    # rows without penalties or masks pass through unchanged
    assert np.array_equal(ours[0], logits[0])


@pytest.mark.parametrize("k,p", [(0, 1.0), (5, 1.0), (0, 0.6), (4, 0.5), (1, 1.0), (31, 0.95), (-1, 0.3)])
def test_top_k_top_p_match_reference(k, p):
    vocab = 32
    logits = fixed_logits(3, vocab, seed=k + 7)
    k_arr = np.full(3, vocab if k <= 0 else k, dtype=np.int64)
    ours = to_numpy(sampler.mask_top_k_top_p(tensor(logits), k_arr, np.full(3, p)))
    ref = np.stack([top_k_top_p(x, k, p) for x in logits])
    assert_same_logits(ours, ref)
    kept = np.isfinite(ours).sum(axis=1)
    assert (kept >= 1).all() and (kept <= (k if k > 0 else vocab)).all()


def test_greedy_takes_argmax_of_processed_logits():
    vocab = 16
    logits = fixed_logits(len(PROCESS_ROWS), vocab, seed=3)
    # make the unprocessed argmax a masked or penalized token in some rows
    logits[4, 7] = logits[7, 9] = logits[1, 3] = 20.0
    seqs = [make_seq(**r) for r in PROCESS_ROWS]
    batch = build_sampling_batch(seqs, EOS, vocab)
    ids, _ = unpack(sampler.read_to_host(sampler.sample_step(tensor(logits), batch)), batch)
    assert ids.tolist() == np.argmax(reference_processed(logits, PROCESS_ROWS), axis=1).tolist()
    assert ids[4] != 7 and ids[7] != 9


def draw(logits_row: np.ndarray, n: int, temperature: float, k: int, p: float, seeds, steps) -> np.ndarray:
    logits = tensor(np.tile(logits_row, (n, 1)))
    vocab = len(logits_row)
    ids = sampler.sample(logits, np.full(n, temperature), np.full(n, k, dtype=np.int64), np.full(n, p),
                         np.asarray(seeds, dtype=np.int64), np.asarray(steps, dtype=np.int64))
    return np.bincount(sampler.read_to_host(ids).astype(np.int64), minlength=vocab)


ROW = np.array([1.2, 0.4, -0.3, 2.0, 0.9, -1.5, 0.1, 1.6], dtype=np.float32)


@pytest.mark.parametrize("k,p", [(0, 1.0), (5, 1.0), (0, 0.8), (6, 0.9)])
@pytest.mark.parametrize("over", ["seeds", "steps"])
def test_sampled_frequencies_chi_square(k, p, over):
    n, temperature = 4000, 0.9
    seeds = np.arange(n) * 7919 + 11 if over == "seeds" else np.full(n, 123456789)
    steps = np.full(n, 3) if over == "seeds" else np.arange(n)
    counts = draw(ROW, n, temperature, k, p, seeds, steps)
    probs = sampling_probs(ROW, temperature, k, p)
    assert counts[probs == 0].sum() == 0, "a token outside the top-k / top-p set was drawn"
    stat, dof = chi_square(counts, probs)
    assert stat < CHI2_CRITICAL_1E3[dof], f"chi2 {stat:.1f} over {dof} dof: {counts} vs {probs * n}"
    # the test has power: the same draws are far from the untempered, unmasked distribution
    wrong, _ = chi_square(counts, sampling_probs(ROW, 1.0, 0, 1.0) if (k, p) != (0, 1.0)
                          else np.full(len(ROW), 1 / len(ROW)))
    assert wrong > CHI2_CRITICAL_1E3[7]


def test_seeded_row_is_batch_independent():
    vocab = 64
    logits = fixed_logits(5, vocab, seed=5)
    params = [dict(temperature=1.0), dict(temperature=0.7, top_k=10), dict(temperature=0.0),
              dict(temperature=1.3, top_p=0.8, frequency_penalty=0.5), dict(temperature=1.0)]
    seqs = [make_seq([1, 2], [3, 4, 5], seed=100 + i, **p) for i, p in enumerate(params)]
    batch = build_sampling_batch(seqs, EOS, vocab)
    together, _ = unpack(sampler.read_to_host(sampler.sample_step(tensor(logits), batch)), batch)
    for i, seq in enumerate(seqs):
        alone_batch = build_sampling_batch([seq], EOS, vocab)
        alone, _ = unpack(sampler.read_to_host(sampler.sample_step(tensor(logits[i:i + 1]), alone_batch)),
                          alone_batch)
        assert alone[0] == together[i]


def test_logprobs_are_raw_log_softmax_packed_in_one_read():
    vocab = 40
    logits = fixed_logits(4, vocab, seed=9)
    seqs = [make_seq([1], [2], temperature=0.0),
            make_seq([1], [2, 5], seed=4, temperature=1.0, logprobs=True, top_logprobs=2, repetition_penalty=3.0),
            make_seq([1], [], temperature=0.0, logprobs=True),
            make_seq([1, 7], [7], seed=5, temperature=0.8, logprobs=True, top_logprobs=5, presence_penalty=1.5)]
    batch = build_sampling_batch(seqs, EOS, vocab)
    packed = sampler.sample_step(tensor(logits), batch)
    assert packed.dim() == 1 and packed.dtype == torch.float64   # ids are exact in float64
    host = sampler.read_to_host(packed)
    ids, logprobs = unpack(host, batch)
    assert len(host) == 4 + 3 * (1 + 2 * 5)      # ids, then 3 logprob rows of [lp, 5 ids, 5 lps]
    assert logprobs[0] is None
    ref = log_softmax(logits)
    for row, k in [(1, 2), (2, 0), (3, 5)]:
        lp = logprobs[row]
        assert lp.token_id == ids[row]
        assert lp.logprob == pytest.approx(ref[row, ids[row]], abs=1e-5)   # raw: before penalties, temperature
        assert [t for t, _ in lp.top] == np.argsort(-ref[row])[:k].tolist()
        np.testing.assert_allclose([v for _, v in lp.top], np.sort(ref[row])[::-1][:k], atol=1e-5)
    assert logprobs[2].token_id == int(np.argmax(logits[2])) and logprobs[2].top == []


def assert_same_fields(got, want, prefix: str = "") -> None:
    """Every field equal, arrays by value and dtype; nested dataclasses (the penalty plan) field by field."""
    for name in want.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        if hasattr(b, "__dataclass_fields__"):
            assert_same_fields(a, b, prefix + name + ".")
        elif isinstance(b, np.ndarray):
            assert np.array_equal(a, b) and np.asarray(a).dtype == b.dtype, prefix + name
        else:
            assert a == b, prefix + name


def test_builder_reuses_row_params_and_matches_a_fresh_build():
    """A steady step (same sequences, same order) reuses the row parameters; every field equals a
    fresh build, also after tokens were appended (steps, penalty counts, min_tokens masks move)."""
    seqs = [make_seq([5, 6, 7], [8], seed=1, temperature=0.7, top_p=0.9, presence_penalty=0.5),
            make_seq([9, 10], seed=2, min_tokens=3, stop_token_ids=[4]),
            make_seq([11], [12, 13], seed=3, repetition_penalty=1.3, logprobs=True, top_logprobs=2)]
    builder = SamplingBatchBuilder()
    builder.build(list(seqs), EOS, 32)
    kept = builder._rows
    for s in seqs:
        s.output_token_ids.append(14)
    got, want = builder.build(list(seqs), EOS, 32), build_sampling_batch(seqs, EOS, 32)
    assert builder._rows is kept
    assert_same_fields(got, want)
    builder.build(list(reversed(seqs)), EOS, 32)
    assert builder._rows is not kept       # another row order: rebuilt
