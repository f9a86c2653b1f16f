"""DSA Triton kernels vs their plain references, small shapes, float32 (interpreter on CPU, or a GPU):
indexer scores over the paged key cache (prefill windows and decode), top-k with -1 padding,
positions -> slots, sparse MLA (split + merge) with invalid and all-invalid rows; block sizes 16, 64."""

import numpy as np
import pytest
from helpers.triton_kernel_helpers import random_block_tables

from paddle_mla.platform import runtime
from paddle_mla.attention.dsa import reference as ref
from paddle_mla.attention.dsa.key_window import KeyWindows
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.attention.native import gather_latent
from paddle_mla.platform.tensor_api import torch

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


def _window_scores(rng, meta, width, ties: bool):
    s = rng.standard_normal((meta.num_tokens, width)).astype(np.float32)
    if ties:    # few distinct values (zeros and negatives included): the k-th key sits in a tie
        s = np.round(s * 2) / 2
    return s


def _check_topk(got, scores, meta, K):
    """Each row: unique columns inside its window, -1 padded, whose values are the window's K largest."""
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


MIXED, DECODE = ([3, 0, 12, 1], [3, 9, 70, 100]), ([1, 1, 1, 1], [1, 130, 17, 6])


# the defaults (relaxed append, short select, 2-digit threshold) and the previous path
VARIANTS = [dict(), dict(append_sem="acq_rel", short_select=False, threshold_digits=3)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["default", "previous"])
@pytest.mark.parametrize("lens,ties,margin", [(MIXED, False, 3), (MIXED, False, -1000), (MIXED, False, 1000),
                                              (MIXED, True, 3), (DECODE, False, 3), (DECODE, True, 3)],
                         ids=["mixed-sampled", "mixed-sample_short", "mixed-sample_over", "mixed-ties",
                              "decode-sampled", "decode-ties"])
def test_topk_select_matches_reference(lens, ties, margin, variant):
    """Top-k selection vs sorting: rows with fewer keys than K (all of them, then -1), with no more than
    the candidate buffer (all buffered), with more (sampled threshold; a margin of -1000 or 1000 makes
    the sample keep too few or too many candidates, so the radix select over the whole window runs),
    ties at the k-th value (many equal keys overflow the buffer: that fallback again), zero-length
    requests, prefill windows and decode positions. Two calls on one workspace: the counts reset."""
    from paddle_mla.attention.dsa.topk_select import candidate_capacity, topk_scratch_shape, topk_select

    rng = np.random.default_rng(7 + ties)
    meta, _ = _meta(rng, *lens, 16)
    width, K = meta.max_seqlen_k, 20     # candidate buffer 64: windows of 71 to 131 keys are sampled
    scores = _window_scores(rng, meta, width, ties)
    windows = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    out = torch.full((meta.num_tokens + 3, K), 99, dtype=torch.int64, device=DEV)
    fallbacks = torch.zeros(1, dtype=torch.int32, device=DEV)
    scratch = torch.zeros(topk_scratch_shape(meta.num_tokens, K), dtype=torch.int32, device=DEV)
    for call in range(2):
        got = topk_select(_t(scores), K, out, meta.batch_id_per_token, meta.positions, **windows, scratch=scratch,
                          fallbacks=fallbacks, margin=margin, sample=64, **variant).cpu().numpy()
        _check_topk(got, scores, meta, K)
        scores = scores[:, ::-1].copy() if call == 0 else scores
    cap = candidate_capacity(K)
    windows_past_buffer = [c + i + 1 for q, c in zip(meta.seq_lens_q, meta.num_cached) for i in range(q)
                           if c + i + 1 > cap]
    assert windows_past_buffer    # so the sample decides for some rows
    if margin != 3:
        assert int(fallbacks.item()) > 0
    elif not ties:
        assert int(fallbacks.item()) == 0


def _bucket_row(rng, n, K, sign, above, kth_at, bucket_ulps):
    """A row of ``n`` scores whose k-th key's 24-bit bucket holds the keys ``bucket_ulps`` ulps below
    v = 3.0000458 (bits 0x404000C0: up to 192 ulps below stay in its bucket), times ``sign`` (negative
    keys order the other way); ``above`` keys far above it, the rest far below. Shuffled."""
    bucket = sign * (np.uint32(0x404000C0) - np.array(bucket_ulps, np.uint32)).view(np.float32)
    hi = (20 + rng.random(above)).astype(np.float32)
    lo = (-30 - rng.random(n - above - len(bucket))).astype(np.float32)
    row = np.concatenate([hi, bucket, lo])
    assert np.sort(row)[::-1][K - 1] == np.sort(bucket)[::-1][kth_at]   # the k-th key is the intended one
    return rng.permutation(row)


# (keys above the bucket, the bucket as ulps below v, the k-th key's index in it sorted descending, path)
BUCKETS = [(19, [0], 0, 0), (18, [0, 1], 1, 0), (19, [0, 1], 0, 1), (18, [0, 1, 2], 1, 2),
           (18, [0, 1, 2, 3], 1, 3), (19, [0, 0, 1], 0, 1), (18, [0, 0, 0], 1, 2), (18, [0, 0], 1, 0),
           (17, [0, 5, 5, 9], 2, 2), (17, [0, 5, 5, 5, 9], 2, 3), (19, [3, 3, 3, 3], 0, 1)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["default", "previous"])
def test_topk_select_bucket_paths(variant):
    """The select's paths after its 3rd radix digit, rows built so the k-th key's 24-bit bucket is
    taken whole, decided by its max or its min, or needs the 4th digit, with ties in the bucket and
    negative keys; each row checked against sorting, and with ``short_select`` each path counted."""
    from paddle_mla.attention.dsa.topk_select import topk_select

    rng = np.random.default_rng(11)
    K, n = 20, 50      # buffer 64 >= 50: every key is buffered, the select decides
    cases = [(sign,) + c for sign in (1, -1) for c in BUCKETS]
    meta, _ = _meta(rng, [1] * len(cases), [n - 1] * len(cases), 16)
    scores = np.stack([_bucket_row(rng, n, K, sign, above, kth, ulps) for sign, above, ulps, kth, _ in cases])
    counts = torch.zeros(4, dtype=torch.int32, device=DEV)
    short = variant.get("short_select", True)      # the default select is the short one
    stats = dict(path_counts=counts) if short else {}
    got = topk_select(_t(scores), K, torch.zeros(len(cases), K, dtype=torch.int64, device=DEV),
                      meta.batch_id_per_token, meta.positions, **variant, **stats).cpu().numpy()
    _check_topk(got, scores, meta, K)
    if short:
        want = np.bincount([c[-1] for c in cases], minlength=4)
        np.testing.assert_array_equal(counts.cpu().numpy(), want)


def test_topk_select_extreme_values():
    """Signed zeros, +-inf, denormals and huge magnitudes keep float order through the int32 keys."""
    from paddle_mla.attention.dsa.topk_select import topk_select

    rng = np.random.default_rng(9)
    meta, _ = _meta(rng, [1], [63], 16)
    vals = np.array([0.0, -0.0, np.inf, -np.inf, 1e-42, -1e-42, 3e38, -3e38, 1.0, -1.0, 2.5, -2.5], np.float32)
    scores = rng.choice(vals, (1, meta.max_seqlen_k)).astype(np.float32)
    for K, margin in ((1, 3), (5, 3), (5, -1000), (30, 3)):
        got = topk_select(_t(scores), K, torch.zeros(1, K, dtype=torch.int64, device=DEV),
                          meta.batch_id_per_token, meta.positions, margin=margin).cpu().numpy()
        _check_topk(got, scores, meta, K)


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


def test_cuda_sparse_plan_takes_whole_tiles(monkeypatch):
    """The CUDA op's plan (sparse_config(cuda=True)): chunks of whole 64-slot tiles that each hold a
    key; the count whose waves of one program an SM end first (V3.2's 128 heads: 16 chunks at b=1,
    one at b=64, where two would be two waves of half the tiles), one chunk once the rows fill the
    GPU; the merge workspace holds every step's chunks; the program shape is fixed."""
    from paddle_mla.attention.dsa import sparse_mla as sm

    monkeypatch.setattr(sm, "num_sms", lambda: 132)
    sm.partial_rows.cache_clear()      # it remembers its answers, which follow the SM count
    cfg = sm.sparse_config(128, cuda=True)
    for rows in (1, 2, 5, 64, 2048):
        for topk in (1, 63, 64, 100, 2048, 2049):
            n, split, block_n = sm.plan_splits(rows, 128, topk, cfg)
            assert block_n == 64 and split % 64 == 0 and (n - 1) * split < topk <= n * split
            assert n <= cfg.max_splits
    assert sm.plan_splits(1, 128, 2048, cfg)[0] == 16
    assert sm.plan_splits(32, 128, 2048, cfg)[0] == 2
    assert sm.plan_splits(64, 128, 2048, cfg)[0] == 1
    assert all(sm.plan_splits(rows, 128, 2048, cfg)[0] == 1 for rows in range(66, 3000, 7))
    for heads in (16, 64, 128):
        ws = sm.partial_rows(300, heads, 2048, cfg)
        assert all(rows * sm.plan_splits(rows, heads, 2048, cfg)[0] <= ws
                   for rows in range(1, 301) if sm.plan_splits(rows, heads, 2048, cfg)[0] > 1)
    sm.partial_rows.cache_clear()
    assert sm.plan_splits(1, 128, 2048, cfg, forced=1)[0] == 1
    with pytest.raises(ValueError, match="64 heads x 64 slots"):
        sm.sparse_config(128, cuda=True, block_n=32)
    # a Triton sweep's env keys leave the CUDA config's program shape alone; max_splits applies to both
    monkeypatch.setenv("PADDLE_MLA_DSA_CFG", "block_h=32,num_stages=1,max_splits=4")
    cuda, tri = sm.sparse_config(128, cuda=True), sm.sparse_config(128)
    assert (cuda.block_h, cuda.block_n, cuda.max_splits) == (64, 64, 4)
    assert (tri.block_h, tri.num_stages, tri.max_splits) == (32, 1, 4)
