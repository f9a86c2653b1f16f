"""The fused RMSNorm (+ residual add) Triton kernel vs the plain-tensor form it replaces on GPUs.

Under TRITON_INTERPRET=1 on CPU (float32/float16, the interpreter has no bfloat16) and on a GPU
(bf16 too). The kernel rounds at the same points as the plain form (the sum to the model dtype, the
normalised row to the model dtype, the product with the weight); only the fp32 reduction order
differs, so 16-bit outputs may differ by one unit in the last place and fp32 outputs by rounding.
"""

import numpy as np
import pytest

from paddle_mla.platform import runtime

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
DTYPES = ["float32", "float16"] + (["bfloat16"] if DEV != "cpu" else [])


@pytest.fixture(scope="module")
def mods():
    from paddle_mla.models import fused_ops, fused_kernels

    return fused_ops, fused_kernels


def _ulp(dtype_name: str) -> float:
    return {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype_name]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 64), (3, 4, 100), (33, 2048)])
def test_kernel_matches_plain_rms_norm(mods, dtype_name, shape):
    norm, kern = mods
    from paddle_mla.platform.tensor_api import torch

    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(sum(shape))
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 3).to(DEV).to(dtype)
    d = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(DEV).to(dtype)
    w = torch.from_numpy(rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)).to(DEV).to(dtype)
    _, y = kern.rms_norm_kernel_call(x, None, w, 1e-6)
    ref = norm._rms_norm_plain(x, w, 1e-6)
    tol = 2 * _ulp(dtype_name) * float(ref.abs().max()) + 1e-6
    assert y.dtype == dtype and y.shape == x.shape
    assert float((y.float() - ref.float()).abs().max()) <= tol
    h, y2 = kern.rms_norm_kernel_call(x, d, w, 1e-6)
    assert torch.equal(h, x + d)   # the residual sum rounds exactly as ``x + d`` does
    ref2 = norm._rms_norm_plain(x + d, w, 1e-6)
    assert float((y2.float() - ref2.float()).abs().max()) <= 2 * _ulp(dtype_name) * float(ref2.abs().max()) + 1e-6


def test_empty_rows(mods):
    _, kern = mods
    from paddle_mla.platform.tensor_api import torch

    x = torch.zeros(0, 16, device=DEV)
    h, y = kern.rms_norm_kernel_call(x, x, torch.ones(16, device=DEV), 1e-6)
    assert y.shape == (0, 16) and h.shape == (0, 16)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("heads", [0, 1, 3, 20])   # 0: a [T, D] input (k_pe)
def test_rope_kernel_matches_plain_rope(mods, dtype_name, interleave, heads):
    _, kern = mods
    from paddle_mla.models.arch import RopeSpec
    from paddle_mla.models.deepseek import Rope
    from paddle_mla.platform.tensor_api import torch

    dtype = getattr(torch, dtype_name)
    T, D = 9, 16
    rope = Rope(RopeSpec(dim=D, theta=10000.0, rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                         mscale=1.0, mscale_all_dim=1.0, interleave=interleave), DEV)
    rng = np.random.default_rng(heads)
    width = (heads or 1) * (D + 8)
    # a strided view, as q_pe is of q: rows of (nope 8 || rope 16) per head
    full = torch.from_numpy(rng.standard_normal((T, width)).astype(np.float32) * 2).to(DEV).to(dtype)
    x = full.view(T, heads, D + 8)[:, :, 8:] if heads else full[:, 8:]
    cos, sin = rope.cos_sin(torch.arange(100, 100 + T, device=DEV))
    got = kern.rope_kernel_call(x, cos, sin, interleave)
    want = rope.apply(x.cpu(), cos.cpu(), sin.cpu()).to(DEV)   # on CPU tensors apply() runs the plain form
    assert got.shape == x.shape and got.is_contiguous() and got.dtype == dtype
    tol = 2 * _ulp(dtype_name) * float(want.abs().max()) + 1e-6
    assert float((got.float() - want.float()).abs().max()) <= tol


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", [(5, 4, 16, 8), (3, 3, 32, 8), (2, 20, 128, 64), (1, 64, 128, 64)])  # T, H, D, rope
def test_indexer_kernel_matches_plain(mods, dtype_name, shape):
    """The DSA indexer's fused RoPE (q, in place) + LayerNorm/RoPE (k) against the plain form
    ``Indexer.project`` runs on CPU; (3, 3, 32, 8) has a rest of 24 dims (not a power of two)."""
    _, kern = mods
    import torch.nn.functional as F

    from paddle_mla.models.indexer import rope_half_split
    from paddle_mla.platform.tensor_api import torch

    T, H, D, R = shape
    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(D + H)

    def rand(*s, scale=2.0, shift=0.0):
        return torch.from_numpy(rng.standard_normal(s).astype(np.float32) * scale + shift).to(DEV).to(dtype)

    q, k = rand(T, H, D), rand(T, D, shift=0.7)
    nw, nb = rand(D, scale=0.3, shift=1.0), rand(D, scale=0.1)
    ang = torch.from_numpy(rng.uniform(-3, 3, (T, R // 2)).astype(np.float32)).to(DEV)
    cos, sin = ang.cos(), ang.sin()
    want_q = rope_half_split(q.cpu().float(), cos.cpu(), sin.cpu(), R)
    kn = F.layer_norm(k.cpu().float(), [D], nw.cpu().float(), nb.cpu().float(), 1e-6).to(dtype).float()
    want_k = rope_half_split(kn, cos.cpu(), sin.cpu(), R)
    got_q, got_k = kern.indexer_qk_call(q, k, cos, sin, R, nw, nb, 1e-6)
    assert got_q.data_ptr() == q.data_ptr() and got_k.shape == k.shape and got_k.dtype == dtype
    for got, want in ((got_q, want_q), (got_k, want_k)):
        tol = 2 * _ulp(dtype_name) * float(want.abs().max()) + 1e-6
        assert float((got.cpu().float() - want).abs().max()) <= tol


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("shape", [(7, 1, 24, 16), (5, 16, 128, 64), (3, 3, 20, 8)])   # T, H, nope, rope
def test_rope_kernel_splits_mla_q(mods, dtype_name, interleave, shape):
    """q [T, H, nope + rope] -> (q_nope contiguous, q_pe roped) in one kernel, as ``Rope.split_apply``'s
    plain form: the nope part bit for bit (a copy), the rope part as the rope kernel's."""
    _, kern = mods
    from paddle_mla.models.arch import RopeSpec
    from paddle_mla.models.deepseek import Rope
    from paddle_mla.platform.tensor_api import torch

    T, H, N, D = shape
    dtype = getattr(torch, dtype_name)
    rope = Rope(RopeSpec(dim=D, theta=10000.0, interleave=interleave), DEV)
    rng = np.random.default_rng(N + H)
    q = torch.from_numpy(rng.standard_normal((T, H, N + D)).astype(np.float32) * 2).to(DEV).to(dtype)
    cos, sin = rope.cos_sin(torch.arange(7, 7 + T, device=DEV))
    nope, pe = kern.rope_kernel_call(q[..., N:], cos, sin, interleave, N)
    want_nope, want_pe = rope.split_apply(q.cpu(), N, cos.cpu(), sin.cpu())   # CPU tensors: the plain form
    assert nope.is_contiguous() and pe.is_contiguous() and nope.shape == (T, H, N) and pe.shape == (T, H, D)
    assert torch.equal(nope.cpu(), want_nope)
    tol = 2 * _ulp(dtype_name) * float(want_pe.abs().max()) + 1e-6
    assert float((pe.cpu().float() - want_pe.float()).abs().max()) <= tol


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("rank_rope", [(512, 64), (32, 16), (24, 8)])
def test_mla_latent_kernel_matches_plain(mods, dtype_name, interleave, rank_rope):
    """kv_a's output -> rms_norm(compressed kv) || rope(k_pe) in one kernel, against the plain form
    ``MLAAttention._latent`` runs on CPU (rank 24: not a power of two)."""
    norm, kern = mods
    from paddle_mla.models.arch import RopeSpec
    from paddle_mla.models.deepseek import Rope
    from paddle_mla.platform.tensor_api import torch

    rank, D = rank_rope
    T = 11
    dtype = getattr(torch, dtype_name)
    rope = Rope(RopeSpec(dim=D, theta=10000.0, interleave=interleave), DEV)
    rng = np.random.default_rng(rank)
    # a strided view, as kv_a's output is when the step's rows are cut (attention split by rows)
    full = torch.from_numpy(rng.standard_normal((T, rank + D + 8)).astype(np.float32) * 2).to(DEV).to(dtype)
    x = full[:, :rank + D]
    w = torch.from_numpy(rng.uniform(0.5, 1.5, rank).astype(np.float32)).to(DEV).to(dtype)
    cos, sin = rope.cos_sin(torch.arange(3, 3 + T, device=DEV))
    got = kern.mla_latent_call(x, w, 1e-6, cos, sin, interleave)
    xc, wc = x.cpu(), w.cpu()
    want = torch.cat([norm._rms_norm_plain(xc[:, :rank], wc, 1e-6), rope.apply(xc[:, rank:], cos.cpu(), sin.cpu())], -1)
    assert got.shape == (T, rank + D) and got.is_contiguous() and got.dtype == dtype
    for a, b in ((got.cpu()[:, :rank], want[:, :rank]), (got.cpu()[:, rank:], want[:, rank:])):
        tol = 2 * _ulp(dtype_name) * float(b.abs().max()) + 1e-6
        assert float((a.float() - b.float()).abs().max()) <= tol
