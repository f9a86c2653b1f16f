"""DSA Triton kernels vs their plain references, small shapes, float32 (interpreter on CPU, or a GPU):
indexer scores over the paged key cache (prefill windows and decode), top-k with -1 padding,
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


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("lens", [([5, 0, 70, 1], [3, 9, 40, 100]), ([1, 1, 1], [1, 130, 17])], ids=["mixed", "decode"])
def test_index_scores_match_reference(page, lens):
    from paddle_mla.attention.dsa.index_kernels import index_scores

    rng = np.random.default_rng(page)
    meta, nb = _meta(rng, *lens, page)
    q, w, cache = _index_inputs(rng, meta, nb, page)
    width = meta.max_seqlen_k
    out = torch.zeros(meta.num_tokens + 2, width + 5, dtype=torch.float32, device=DEV)
    windows = {} if meta.is_decode_only else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
    got = index_scores(q, w, cache, meta.block_tables, meta.batch_id_per_token, meta.positions, width, out,
                       **windows).cpu().numpy()
    exp = _ref_scores(q, w, cache, meta, width)
    assert np.array_equal(np.isinf(got), np.isinf(exp))
    fin = np.isfinite(exp)
    np.testing.assert_allclose(got[fin], exp[fin], atol=TOL, rtol=TOL)


def test_topk_pads_with_minus_one_and_matches_reference():
    from paddle_mla.attention.dsa.index_kernels import topk_positions

    rng = np.random.default_rng(3)
    s = rng.standard_normal((4, 20)).astype(np.float32)
    s[0, 3:] = -np.inf          # 3 keys < topk
    s[1, :] = -np.inf           # no key at all
    scores = _t(s)
    got = topk_positions(scores, 6, torch.zeros(8, 6, dtype=torch.int64, device=DEV)).cpu().numpy()
    exp = ref.topk_ref(scores, 6).cpu().numpy()
    assert (got[1] == -1).all() and sorted(got[0][:3]) == [0, 1, 2] and (got[0][3:] == -1).all()
    for g, e in zip(got, exp):
        assert set(g.tolist()) == set(e.tolist())


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


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("topk", [7, 40, 100])
def test_sparse_mla_matches_reference(page, topk):
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
    got = sparse_mla(q_lat, q_pe, cache, slots_t, 0.3, part_o, part_lse, out, 8).cpu().numpy()
    exp = sparse_mla_ref(q_lat, q_pe, cache, slots_t, 0.3).cpu().numpy()
    assert np.isfinite(got).all() and (got[2] == 0).all()
    np.testing.assert_allclose(got, exp, atol=TOL, rtol=TOL)
