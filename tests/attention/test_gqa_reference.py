"""``append_attention_reference`` against a dense numpy oracle on unpaged data (float64).

Two calls per case, as the engine makes them: the first appends each request's prefix (a prefill
step), the second appends the rest (chunks, decodes, zero-length rows, graph-padding tokens) and
attends over cached + new keys read back from the paged cache. The oracle ropes with complex
numbers and softmaxes each request's full unpaged sequence with the contract's mask.
"""

import numpy as np
import pytest

from paddle_mla.attention import gqa_reference
from paddle_mla.attention.gqa_reference import append_attention_reference, write_kv
from paddle_mla.platform.tensor_api import torch


def rope_table(max_pos: int, rot_dim: int, theta: float = 10000.0) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, rot_dim, 2) / rot_dim)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], -1)


def rope_complex(x: np.ndarray, pos: np.ndarray, rot_dim: int, neox: bool, theta: float = 10000.0) -> np.ndarray:
    """x [L, H, D] at positions pos [L]: each rotated pair as one complex number times e^{i pos f}."""
    half = rot_dim // 2
    idx1 = np.arange(half) if neox else np.arange(0, rot_dim, 2)
    idx2 = idx1 + half if neox else idx1 + 1
    f = 1.0 / theta ** (np.arange(0, rot_dim, 2) / rot_dim)
    z = (x[..., idx1] + 1j * x[..., idx2]) * np.exp(1j * pos[:, None, None] * f[None, None, :])
    out = x.astype(np.float64).copy()
    out[..., idx1], out[..., idx2] = z.real, z.imag
    return out


def dense_oracle(q, k, v, cached: int, scale: float, n_swa: int, window: int, sink: int):
    """One request: q [q, Hq, D] (roped, positions cached..), full k, v [L, Hkv, D] -> [q, Hq, D]."""
    Hq, Hkv = q.shape[1], k.shape[1]
    g = Hq // Hkv
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) * scale
    p_pos = cached + np.arange(len(q))[:, None]
    j = np.arange(len(k))[None, :]
    full = j <= p_pos
    swa = full & ((j < sink) | (j > p_pos - window))
    is_swa = (np.arange(Hq) // g >= Hkv - n_swa)[:, None, None]
    s = np.where(np.where(is_swa, swa[None], full[None]), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, vv)


def tensors(*arrays, dtype=None):
    return [torch.from_numpy(np.ascontiguousarray(a if dtype is None else a.astype(dtype))) for a in arrays]


def call(q, k, v, kc, vc, tables, q_lens, k_lens, positions, cs, **kw):
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    bid = np.repeat(np.arange(len(q_lens)), q_lens).astype(np.int32)
    pad = q.shape[0] - len(bid)                                # graph padding: tokens past cu[-1]
    bid = np.concatenate([bid, np.zeros(pad, np.int32)])
    positions = np.concatenate([positions, np.zeros(pad, np.int64)])
    out = torch.full(q.shape, float("nan"), dtype=torch.float32)
    qt, kt, vt = tensors(q, k, v, dtype=np.float32)
    tt, bidt, post, cst = tensors(tables, bid, positions, cs.astype(np.float32))
    return append_attention_reference(qt, kt, vt, kc, vc, tt, cu, np.asarray(k_lens, np.int32), bidt, post, cst, out,
                                      **kw).numpy()


CASES = [   # (cached prefix, new tokens) per request
    [(0, 5), (4, 1), (7, 9), (8, 8), (0, 1)],
    [(3, 1), (11, 1), (0, 0), (0, 12), (13, 1)],      # decodes on block edges, a zero-length row
    [(16, 4), (25, 1)],
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("hq,hkv,d,rot,neox", [(3, 3, 12, 12, True), (4, 2, 10, 6, False),
                                               (6, 2, 14, 14, False), (9, 3, 6, 4, True)])
@pytest.mark.parametrize("block_size,head_wise,swa", [(4, False, None), (16, False, None), (4, True, None),
                                                      (4, True, (1, 5, 2)), (16, False, (2, 3, 0))])
@pytest.mark.parametrize("q_chunk", [512, 3], ids=["whole", "chunked_queries"])
def test_reference_matches_dense_oracle(case, hq, hkv, d, rot, neox, block_size, head_wise, swa, q_chunk, monkeypatch):
    monkeypatch.setattr(gqa_reference, "_Q_CHUNK", q_chunk)    # 3: requests split over query chunks
    reqs = CASES[case]
    n_swa, window, sink = swa if swa else (0, 0, 0)
    n_swa = min(n_swa, hkv)
    rng = np.random.default_rng(case * 1000 + hq * 10 + block_size)
    B = len(reqs)
    total = [c + n for c, n in reqs]
    per_req = -(-max(total) // block_size)
    num_blocks = per_req * B + 3
    if head_wise:   # each KV head its own permutation of physical blocks
        tables = np.stack([rng.permutation(num_blocks)[:per_req * B].reshape(B, per_req) for _ in range(hkv)], 1)
    else:
        tables = rng.permutation(num_blocks)[:per_req * B].reshape(B, per_req)
    tables = tables.astype(np.int32)
    Q = [rng.standard_normal((t, hq, d)) for t in total]
    K = [rng.standard_normal((t, hkv, d)) for t in total]
    V = [rng.standard_normal((t, hkv, d)) for t in total]
    cs = rope_table(64, rot)
    kc = torch.full((hkv, num_blocks, block_size, d), float("nan"), dtype=torch.float32)
    vc = torch.full((hkv, num_blocks, block_size, d), float("nan"), dtype=torch.float32)
    scale = d ** -0.5 * 1.1
    kw = dict(softmax_scale=scale, neox=neox, rot_dim=rot, num_swa_heads=n_swa, window=window, sink=sink)

    def step(spans, pad=0):
        """spans: (start, length) of each request's tokens this step."""
        q_lens = np.array([n for _, n in spans])
        take = lambda X: np.concatenate([X[r][s:s + n] for r, (s, n) in enumerate(spans)] +  # noqa: E731
                                        [np.zeros((pad,) + X[0].shape[1:])])
        pos = np.concatenate([np.arange(s, s + n) for s, n in spans]).astype(np.int64)
        k_lens = [s + n for s, n in spans]
        return call(take(Q), take(K), take(V), kc, vc, tables, q_lens, k_lens, pos, cs, **kw), q_lens

    step([(0, c) for c, _ in reqs])                          # prefixes into the cache
    if head_wise and n_swa:
        # SWA heads drop the blocks no query of step 2 can see: their slots are -1 and their
        # physical blocks are poisoned, so any read of them would show up as NaN.
        for r, (c, n) in enumerate(reqs):
            for blk in range(per_req):
                lo, hi = blk * block_size, (blk + 1) * block_size - 1
                if n and lo >= sink and hi <= c - window:
                    for g in range(hkv - n_swa, hkv):
                        kc[g, int(tables[r, g, blk])] = float("nan")
                        tables[r, g, blk] = -1
    out, q_lens = step([(c, n) for c, n in reqs], pad=2)
    assert out.shape[0] == int(q_lens.sum()) + 2 and not np.isnan(out).any()
    assert np.all(out[int(q_lens.sum()):] == 0), "graph-padding tokens must come back as zeros"
    row = 0
    for r, (c, n) in enumerate(reqs):
        if n == 0:
            continue
        pos_all = np.arange(c + n)
        q_r = rope_complex(Q[r][c:], pos_all[c:], rot, neox)
        k_r = rope_complex(K[r], pos_all, rot, neox)
        want = dense_oracle(q_r, k_r, V[r], c, scale, n_swa, window, sink)
        np.testing.assert_allclose(out[row:row + n], want, rtol=1e-4, atol=1e-5)
        row += n


def test_cache_layout_and_minus_one_skipped():
    """k lands at [head, block, offset]; a -1 slot of a head-wise table is not written."""
    hkv, d, bs = 2, 4, 2
    kc, vc = torch.zeros(hkv, 3, bs, d), torch.zeros(hkv, 3, bs, d)
    tables = torch.from_numpy(np.array([[[2, 0], [-1, 1]]], dtype=np.int32))     # head 1 has no block 0
    k = torch.from_numpy(np.arange(3 * hkv * d, dtype=np.float32).reshape(3, hkv, d) + 1)
    bid = torch.from_numpy(np.zeros(3, np.int32))
    write_kv(kc, vc, k, k * 2, tables, bid, torch.from_numpy(np.arange(3, dtype=np.int64)))
    kn, vn, k = kc.numpy(), vc.numpy(), k.numpy()
    np.testing.assert_array_equal(kn[0, 2, 0], k[0, 0])
    np.testing.assert_array_equal(kn[0, 2, 1], k[1, 0])
    np.testing.assert_array_equal(kn[0, 0, 0], k[2, 0])
    np.testing.assert_array_equal(kn[1, 1, 0], k[2, 1])
    np.testing.assert_array_equal(vn[1, 1, 0], 2 * k[2, 1])
    assert np.count_nonzero(kn) == 4 * d and np.count_nonzero(vn) == 4 * d, "a -1 slot was written"


def test_visible_key_without_block_is_an_error():
    tables = np.array([[[0], [-1]]], dtype=np.int32)
    kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
    with pytest.raises(ValueError, match="no block"):
        call(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), kc, vc, tables, np.array([1]), [1],
             np.zeros(1, np.int64), rope_table(4, 2), softmax_scale=1.0, neox=True, rot_dim=2)
