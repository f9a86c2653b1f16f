"""The native MLA backend against a dense, non-absorbed numpy reference (explicit K/V from kv_b_proj).

Several requests with cached prefixes, block-boundary lengths, random physical block tables.
"""

import numpy as np
import pytest

from paddle_mla.attention.backend import MLADims, create_backend
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.platform.tensor_api import torch

DIMS = MLADims(num_heads=3, kv_lora_rank=24, qk_nope_head_dim=20, qk_rope_head_dim=12, v_head_dim=28,
               softmax_scale=32 ** -0.5 * 1.3)


def dense_reference(q_nope, q_pe, lat, w_kc, w_vc, cached, d: MLADims):
    """Explicit MLA: k = [c W_kc^T per head || k_pe], v = c W_vc, causal softmax (float64)."""
    c, k_pe = lat[:, :d.kv_lora_rank], lat[:, d.kv_lora_rank:]
    k_nope = np.einsum("kc,hnc->khn", c, w_kc)                       # [k, H, nope]
    v = np.einsum("kc,hcv->khv", c, w_vc)                            # [k, H, v]
    k = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None], (len(c), d.num_heads, d.qk_rope_head_dim))], -1)
    q = np.concatenate([q_nope, q_pe], -1)                           # [q, H, nope+R]
    s = np.einsum("qhd,khd->hqk", q, k) * d.softmax_scale
    qpos = cached + np.arange(len(q))
    s = np.where(np.arange(len(c))[None, None, :] <= qpos[None, :, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khv->qhv", p, v)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("case", [
    [(0, 5), (4, 1), (7, 9), (8, 8), (0, 1)],      # prefill, decode at a block start, chunk, boundary
    [(3, 1), (11, 1), (0, 12)],                     # decodes ending on block boundaries + a prefill
    [(16, 4)],                                      # a prefix cache hit of whole blocks
])
def test_native_matches_dense_reference(case, block_size):
    rng = np.random.default_rng(len(case) * 100 + block_size)
    d = DIMS
    H, D = d.num_heads, d.latent_dim
    cached = np.array([c for c, _ in case], dtype=np.int32)
    new = np.array([n for _, n in case], dtype=np.int32)
    per_req = int(((cached + new).max() + block_size - 1) // block_size)
    num_blocks = per_req * len(case) + 2
    tables = rng.permutation(num_blocks)[:per_req * len(case)].reshape(len(case), per_req).astype(np.int32)
    lat = [rng.standard_normal((c + n, D)).astype(np.float32) for c, n in case]
    cache = np.zeros((num_blocks, block_size, 1, D), dtype=np.float32)
    for r, (c, _) in enumerate(case):                  # the cached prefix is already in the cache
        for pos in range(c):
            cache[tables[r, pos // block_size], pos % block_size, 0] = lat[r][pos]
    T = int(new.sum())
    q_nope = rng.standard_normal((T, H, d.qk_nope_head_dim)).astype(np.float32)
    q_pe = rng.standard_normal((T, H, d.qk_rope_head_dim)).astype(np.float32)
    w_kc = (rng.standard_normal((H, d.qk_nope_head_dim, d.kv_lora_rank)) * 0.3).astype(np.float32)
    w_vc = (rng.standard_normal((H, d.kv_lora_rank, d.v_head_dim)) * 0.3).astype(np.float32)
    new_lat = np.concatenate([lat[r][c:] for r, (c, _) in enumerate(case)])

    batch = StepBatch(token_ids=np.zeros(T, dtype=np.int64), num_new=new, num_cached=cached, block_tables=tables,
                      is_prefill=cached == 0, sample_mask=np.ones(len(case), dtype=bool))
    meta = ForwardMeta.build(batch, block_size, "cpu")
    backend = create_backend("native", dims=d, max_num_seqs=len(case), max_model_len=per_req * block_size,
                             block_size=block_size, device="cpu", dtype=torch.float32)
    kv = torch.from_numpy(cache.copy())
    t = torch.from_numpy
    out = backend.forward(t(q_nope), t(q_pe), t(new_lat), t(w_kc), t(w_vc), kv, meta).numpy()
    assert out.shape == (T, H, d.v_head_dim)

    start = 0
    kv_np = kv.numpy()
    for r, (c, n) in enumerate(case):
        ref = dense_reference(q_nope[start:start + n].astype(np.float64), q_pe[start:start + n].astype(np.float64),
                              lat[r].astype(np.float64), w_kc.astype(np.float64), w_vc.astype(np.float64), c, d)
        np.testing.assert_allclose(out[start:start + n], ref, atol=2e-5, rtol=1e-4)
        for pos in range(c + n):                       # the new latents were written at their slots
            np.testing.assert_array_equal(kv_np[tables[r, pos // block_size], pos % block_size, 0], lat[r][pos])
        start += n


def test_empty_step_returns_empty():
    backend = create_backend("native", dims=DIMS, max_num_seqs=1, max_model_len=8, block_size=4, device="cpu",
                             dtype=torch.float32)
    batch = StepBatch(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32),
                      np.zeros((0, 2), np.int32), np.zeros(0, bool), np.zeros(0, bool))
    meta = ForwardMeta.build(batch, 4, "cpu")
    z = torch.zeros
    out = backend.forward(z(0, 3, 20), z(0, 3, 12), z(0, 36), z(3, 20, 24), z(3, 24, 28), z(4, 4, 1, 36), meta)
    assert tuple(out.shape) == (0, 3, 28)
