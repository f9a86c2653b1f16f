"""DSA Triton kernels vs their plain references, small shapes, float32 (interpreter on CPU, or a GPU):
indexer scores over the paged key cache (prefill windows and decode), scores + top-k in one pass with
-1 padding (sampled, fallback forced, ties, padded rows),
positions -> slots, sparse MLA (split + merge) with invalid and all-invalid rows; block sizes 16, 64."""

import numpy as np
import pytest
from triton_kernel_helpers import random_block_tables

from paddle_mla import runtime
from paddle_mla.attention.dsa import reference as ref
from paddle_mla.attention.dsa.key_window import KeyWindows
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.attention.native import gather_latent
from paddle_mla.tensor_api import torch

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
TOL = 1e-4 if DEV == "cpu" else 2e-2


def _t(a, dtype=None):
    x = torch.from_numpy(np.ascontiguousarray(a)).to(DEV)
    return x if dtype is None else x.to(dtype)


def _meta(rng, num_new, num_cached, page):
    num_new, num_cached = np.array(num_new, np.int32), np.array(num_cached, np.int32)
    tables, nb = random_block_tables(rng, num_new + num_cached, page)
    batch = StepBatch(token_ids=np.zeros(int(num_new.sum()), np.int64), num_new=num_new, num_cached=num_cached,
                      block_tables=tables, is_prefill=num_new > 1, sample_mask=np.ones(len(num_new), bool))
    meta = ForwardMeta.build(batch, page, DEV, KeyWindows(int(num_new.sum()) + 1, DEV))
    return meta, nb


def _index_inputs(rng, meta, nb, page, H=5, D=24):
    from paddle_mla.attention.dsa.index_kernels import index_scores  # noqa: F401  (imports Triton)

    T = meta.num_tokens
    cache = _t(rng.standard_normal((nb, page, 1, D)).astype(np.float32))
    q = _t(rng.standard_normal((T, H, D)).astype(np.float32))
    w = _t(rng.standard_normal((T, H)).astype(np.float32))
    return q, w, cache


def _ref_scores(q, w, cache, meta, width):
    out = np.full((meta.num_tokens, width), -np.inf, np.float32)
    s = 0
    for b in range(meta.num_reqs):
        n, c = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        if n == 0:
            continue
        keys = gather_latent(cache, meta.block_tables[b], n + c, meta.block_size)
        sc = ref.index_scores_ref(q[s:s + n], w[s:s + n], keys)
        ks = torch.zeros(n, dtype=torch.int64, device=DEV)
        ke = torch.arange(n, dtype=torch.int64, device=DEV) + c + 1
        out[s:s + n, :n + c] = ref.masked_scores_ref(sc, ks, ke).cpu().numpy()
        s += n
    return out


@pytest.mark.parametrize("heads", [5, 70], ids=["one_head_block", "two_head_blocks"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("lens", [([5, 0, 70, 1], [3, 9, 40, 100]), ([1, 1, 1], [1, 130, 17])], ids=["mixed", "decode"])
def test_index_scores_match_reference(page, lens, heads):
    from paddle_mla.attention.dsa.index_kernels import index_scores

    rng = np.random.default_rng(page)
    meta, nb = _meta(rng, *lens, page)
    q, w, cache = _index_inputs(rng, meta, nb, page, H=heads)
    width = meta.max_seqlen_k
    out = torch.full((meta.num_tokens + 2, width + 5), float("nan"), dtype=torch.float32, device=DEV)
    windows = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    got = index_scores(q, w, cache, meta.block_tables, meta.batch_id_per_token, meta.positions, width, out,
                       **windows).cpu().numpy()
    exp = _ref_scores(q, w, cache, meta, width)
    fin = np.isfinite(exp)          # the windows: written and equal; the rest is left untouched
    np.testing.assert_allclose(got[fin], exp[fin], atol=TOL, rtol=TOL)
    assert np.isnan(got[~fin]).all()


def _check_topk(got, scores, meta, K, padded: int = 0):
    """Each row: unique columns inside its window, -1 padded, whose values (the kernel's own written
    scores) are the window's K largest; padded rows (no request) all -1."""
    s = 0
    for b in range(meta.num_reqs):
        n, c = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        for i in range(n):
            window = scores[s + i, :c + i + 1]
            row = got[s + i]
            sel = row[row >= 0]
            assert len(sel) == min(K, len(window)) and (row[len(sel):] == -1).all()
            assert len(set(sel.tolist())) == len(sel) and (sel < len(window)).all()
            np.testing.assert_array_equal(np.sort(window[sel]), np.sort(window)[len(window) - len(sel):])
        s += n
    assert (got[s:s + padded] == -1).all()


def _with_padded_rows(meta, q, w, windows, pad: int):
    """``pad`` more rows of no request (batch id -1, as a graph's padding): windows of no key."""
    def cat(x, fill):
        return torch.cat([x, torch.full((pad,) + tuple(x.shape[1:]), fill, dtype=x.dtype, device=DEV)])
    win = {k: (cat(v, 0) if k != "cu_seqlens_k" else v) for k, v in windows.items()}
    return cat(meta.batch_id_per_token, -1), cat(meta.positions, 0), cat(q, 1.0), cat(w, 1.0), win


def _check_thresholds(scratch, sc, meta, K, margin, sample):
    """Each sampled row's published threshold: the top 24 bits of the key at rank ~ K/n x sample + margin
    sigmas of its evenly spaced sample, from the written scores (the sample kernel scores those keys
    again: bit-equal under the interpreter, within a rank of it on a GPU)."""
    from paddle_mla.attention.dsa.topk_select import candidate_capacity

    cap = candidate_capacity(K)
    bits = sc.view(np.int32)
    keys = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    thr = scratch[:, 2 * cap + 2].cpu().numpy()
    s = checked = 0
    for b in range(meta.num_reqs):
        nq, c = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        for i in range(nq):
            n = c + i + 1
            if n > cap:
                smp = np.sort(keys[s + i, (np.arange(sample) * n) // sample])[::-1]
                want = K * sample // n
                rank = min(max(want + int(margin * np.sqrt(np.float32(want + 1.0))) + 4, 1), sample)
                lo, hi = smp[min(rank, sample - 1)], smp[max(rank - 2, 0)]
                exact = smp[rank - 1] & ~0xFF
                assert thr[s + i] == exact if DEV == "cpu" else (lo & ~0xFF) <= thr[s + i] <= hi
                checked += 1
        s += nq
    assert checked


MIXED, DECODE = ([3, 0, 12, 1], [3, 9, 70, 100]), ([1, 1, 1, 1], [1, 130, 17, 6])
TOPK_CASES = [(MIXED, False, 3), (MIXED, False, -1000), (MIXED, False, 1000), (MIXED, True, 3),
              (DECODE, False, 3), (DECODE, True, 3)]


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("lens,ties,margin", TOPK_CASES,
                         ids=["mixed-sampled", "mixed-sample_short", "mixed-sample_over", "mixed-ties",
                              "decode-sampled", "decode-ties"])
def test_index_topk_matches_reference(lens, ties, margin, page):
    """Scores + top-k in one pass (sampled threshold, candidates appended by the score kernel, select)
    vs the plain references: rows with fewer keys than K (all of them, then -1), with no more than the
    candidate buffer (all buffered), with more (sampled threshold; a margin of -1000 or 1000 makes the
    sample keep too few or too many candidates, so the radix select over the whole window runs), ties
    at the k-th value (keys of few distinct values: many equal scores overflow the buffer, that
    fallback again), zero-length requests, padded rows of no key, prefill windows and decode
    positions, block sizes 16 and 64. Two calls on one workspace: the counts reset."""
    from paddle_mla.attention.dsa.index_kernels import index_topk
    from paddle_mla.attention.dsa.topk_select import TopkConfig, candidate_capacity, topk_scratch_shape

    rng = np.random.default_rng(7 + ties + page)
    meta, nb = _meta(rng, *lens, page)
    q, w, cache = _index_inputs(rng, meta, nb, page, H=3, D=16)
    if ties:    # keys and queries of few distinct values: the k-th score sits in a tie
        cache, q = torch.round(cache), torch.round(q)
    windows = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    pad, width, K = 2, meta.max_seqlen_k, 20    # candidate buffer 64: windows of 71 to 131 keys are sampled
    bids, positions, q, w, windows = _with_padded_rows(meta, q, w, windows, pad)
    T = meta.num_tokens + pad
    cfg = TopkConfig(sample=64, sample_block=16, margin=margin)
    fallbacks = torch.zeros(1, dtype=torch.int32, device=DEV)
    scratch = torch.zeros(topk_scratch_shape(T, K), dtype=torch.int32, device=DEV)
    for call in range(2):
        out = torch.full((T + 3, K), 99, dtype=torch.int64, device=DEV)
        scores = torch.full((T, width + 3), float("nan"), dtype=torch.float32, device=DEV)
        got = index_topk(q, w, cache, meta.block_tables, bids, positions, width, scores, K, out, **windows,
                         scratch=scratch, fallbacks=fallbacks, topk_cfg=cfg).cpu().numpy()
        sc = scores.cpu().numpy()
        exp = _ref_scores(q[:meta.num_tokens], w[:meta.num_tokens], cache, meta, width)
        fin = np.isfinite(exp)
        np.testing.assert_allclose(sc[:meta.num_tokens, :width][fin], exp[fin], atol=TOL, rtol=TOL)
        _check_topk(got, sc, meta, K, pad)
        if not ties:
            _check_thresholds(scratch, sc, meta, K, margin, cfg.sample)
        assert (out[T:] == 99).all()
        w = -w          # the reverse order on the same workspace
    cap = candidate_capacity(K)
    windows_past_buffer = [c + i + 1 for q, c in zip(meta.seq_lens_q, meta.num_cached) for i in range(q) if c + i + 1 > cap]
    assert windows_past_buffer    # so the sample decides for some rows
    if margin != 3:
        assert int(fallbacks.item()) > 0
    elif not ties:
        assert int(fallbacks.item()) == 0
    assert int(scratch[:, 2 * cap:2 * cap + 2].abs().sum()) == 0    # counts left at zero (graph replays)


def test_index_topk_extreme_values():
    """Signed zeros, +-inf, denormals and huge magnitudes keep float order through the int32 keys: two
    heads, q = +-10 e0 and w = +-1, so key (v, 0, ...) scores exactly 10 v (+-inf past 3.4e37)."""
    from paddle_mla.attention.dsa.index_kernels import index_topk
    from paddle_mla.attention.dsa.topk_select import TopkConfig

    rng = np.random.default_rng(9)
    page, D = 16, 16
    meta, nb = _meta(rng, [1], [63], page)
    vals = np.array([0.0, -0.0, 3e38, -3e38, 1e-42, -1e-42, 2e37, -2e37, 1.0, -1.0, 2.5, -2.5], np.float32)
    keys = np.zeros((nb, page, 1, D), np.float32)
    keys[..., 0] = rng.choice(vals, (nb, page, 1))
    qv = np.zeros((1, 2, D), np.float32)
    qv[0, 0, 0], qv[0, 1, 0] = 10.0, -10.0
    q, w, cache = _t(qv), _t(np.array([[1.0, -1.0]], np.float32)), _t(keys)
    width = meta.max_seqlen_k
    exp = _ref_scores(q, w, cache, meta, width)
    assert np.isinf(exp).any() and (np.abs(exp) < 1e-38).any()
    for K, margin in ((1, 3), (5, 3), (5, -1000), (30, 3)):
        scores = torch.zeros(1, width, dtype=torch.float32, device=DEV)
        got = index_topk(q, w, cache, meta.block_tables, meta.batch_id_per_token, meta.positions, width, scores, K,
                         torch.zeros(1, K, dtype=torch.int64, device=DEV),
                         topk_cfg=TopkConfig(sample=64, sample_block=16, margin=margin)).cpu().numpy()
        sc = scores.cpu().numpy()
        big = np.abs(exp) > 1e-30     # denormals may flush to zero on a GPU
        np.testing.assert_array_equal(sc[big], exp[big])
        _check_topk(got, sc, meta, K)


@pytest.mark.parametrize("page", [16, 64])
def test_positions_to_slots(page):
    from paddle_mla.attention.dsa.index_kernels import positions_to_slots

    rng = np.random.default_rng(4)
    meta, nb = _meta(rng, [3, 1, 2], [50, 90, 0], page)
    pos = np.stack([rng.integers(-1, 53, 9), rng.integers(-1, 91, 9), rng.integers(-1, 53, 9),
                    rng.integers(-1, 91, 9), rng.integers(-1, 2, 9), np.full(9, -1)]).astype(np.int64)
    pos_t = _t(pos)
    got = positions_to_slots(pos_t, meta.batch_id_per_token, meta.block_tables, page,
                             torch.zeros(6, 9, dtype=torch.int64, device=DEV)).cpu().numpy()
    bids = meta.batch_id_per_token.cpu().numpy()
    for t in range(6):
        exp = ref.positions_to_slots_ref(pos_t[t], meta.block_tables[int(bids[t])], page).cpu().numpy()
        np.testing.assert_array_equal(got[t], exp)


@pytest.mark.parametrize("splits", [0, 3, 8], ids=["auto", "split3", "split8"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("topk", [7, 40, 100])
def test_sparse_mla_matches_reference(page, topk, splits):
    from paddle_mla.attention.dsa.sparse_mla import sparse_mla, sparse_mla_ref

    rng = np.random.default_rng(topk + page)
    T, H, C, R, nb = 5, 3, 24, 8, 6
    cache = _t(rng.standard_normal((nb, page, 1, C + R)).astype(np.float32))
    slots = rng.integers(0, nb * page, (T, topk)).astype(np.int64)
    slots[1, topk // 2:] = -1      # a row with fewer keys
    slots[2, :] = -1               # no valid key: zeros, not NaN
    slots[3, ::3] = -1
    slots_t = _t(slots)
    q_lat = _t(rng.standard_normal((T, H, C)).astype(np.float32))
    q_pe = _t(rng.standard_normal((T, H, R)).astype(np.float32))
    part_o = torch.zeros(T, H, 8, C, dtype=torch.float32, device=DEV)
    part_lse = torch.zeros(T, H, 8, dtype=torch.float32, device=DEV)
    out = torch.full((T, H, C), float("nan"), dtype=torch.float32, device=DEV)
    got = sparse_mla(q_lat, q_pe, cache, slots_t, 0.3, part_o, part_lse, out, num_splits=splits).cpu().numpy()
    exp = sparse_mla_ref(q_lat, q_pe, cache, slots_t, 0.3).cpu().numpy()
    assert np.isfinite(got).all() and (got[2] == 0).all()
    np.testing.assert_allclose(got, exp, atol=TOL, rtol=TOL)
