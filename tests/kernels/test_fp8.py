"""FP8 block-scaled math on CPU: activation quant, block dequant, the w8a8 reference, the linear
dispatch, the Triton GEMM under the interpreter, and the quantization config rules.

Oracles are independent of the code under test: numpy float64 arithmetic and the e4m3 byte table
of ``safetensors_io`` (nearest-value encoding), not the tensor library's float8 cast.
"""

import os

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.config.schema import ConfigError, config_from_dict
from paddle_mla.models.fp8 import (
    FP8_MAX,
    Fp8Weight,
    dequant_blocks,
    fp8_kernels_available,
    linear,
    per_token_group_quant,
    per_token_group_quant_ref,
    w8a8_block_matmul_ref,
)
from paddle_mla.models.loader import resolve_keep_fp8
from paddle_mla.models.safetensors_io import E4M3_TABLE, dequant_fp8_blocks, encode_e4m3
from paddle_mla.platform.tensor_api import F, torch


def _np(t):
    return t.to(torch.float32).cpu().numpy().astype(np.float64)


def _random_fp8_weight(rng, n, k, block=(128, 128)):
    """e4m3 codes (numpy uint8) and positive block scales, as a checkpoint stores them."""
    w = rng.standard_normal((n, k)).astype(np.float32) * 100.0
    codes = encode_e4m3(w)
    scales = rng.uniform(1e-4, 3e-3, size=(-(-n // block[0]), -(-k // block[1]))).astype(np.float32)
    return codes, scales


def _fp8_tensor(codes):
    return torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("m,k,group", [(1, 128, 128), (7, 512, 128), (33, 96, 32)])
def test_group_quant_reference(m, k, group):
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.01, 50, size=(m, 1)).astype(np.float32)
    x[0, :group] = 0.0                                   # an all-zero group: scale floor, zero codes
    q, s = per_token_group_quant_ref(torch.from_numpy(x), group)
    assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (m, k)
    assert s.dtype == torch.float32 and tuple(s.shape) == (m, k // group)
    xg = x.astype(np.float64).reshape(m, k // group, group)
    want_s = np.maximum(np.abs(xg).max(-1) / FP8_MAX, 1e-10)
    np.testing.assert_allclose(_np(s), want_s, rtol=1e-6)
    # codes: nearest e4m3 value of x / scale (table oracle); ties are measure-zero for random data
    want_q = E4M3_TABLE[encode_e4m3((xg / _np(s)[..., None]).reshape(m, k).astype(np.float32))]
    np.testing.assert_array_equal(_np(q), want_q)
    assert np.abs(_np(q)).max() <= FP8_MAX and np.all(_np(q)[0, :group] == 0)
    # the round trip keeps e4m3's 3 mantissa bits: |error| <= 1/16 of the value (+ subnormal step)
    back = (_np(q).reshape(m, k // group, group) * _np(s)[..., None]).reshape(m, k)
    assert np.all(np.abs(back - x) <= np.abs(x) / 16 + np.repeat(_np(s), group, 1) * 2.0 ** -9)


def test_group_quant_picks_the_reference_for_cpu_tensors():
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32))
    q, s = per_token_group_quant(x)                      # kernel=None: CPU tensor -> reference
    rq, rs = per_token_group_quant_ref(x)
    assert q.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(_np(q), _np(rq))
    np.testing.assert_array_equal(_np(s), _np(rs))


def test_group_quant_rejects_ragged_k():
    with pytest.raises(ValueError, match="multiple of the group"):
        per_token_group_quant_ref(torch.zeros(2, 100), 128)
    with pytest.raises(ValueError, match="multiple of the group"):
        per_token_group_quant(torch.zeros(2, 100), 128, kernel=False)


@pytest.mark.parametrize("shape", [(200, 300), (128, 256), (37, 5), (3, 129, 127)])
def test_dequant_blocks_matches_numpy(shape):
    rng = np.random.default_rng(len(shape) + shape[-1])
    if len(shape) == 2:
        codes, scales = _random_fp8_weight(rng, *shape)
        want = dequant_fp8_blocks(E4M3_TABLE[codes], scales)
    else:                                                # experts [E, N, K] with [E, N/128, K/128] scales
        parts = [_random_fp8_weight(rng, *shape[1:]) for _ in range(shape[0])]
        codes, scales = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
        want = np.stack([dequant_fp8_blocks(E4M3_TABLE[c], s) for c, s in parts])
    got = dequant_blocks(_fp8_tensor(codes), torch.from_numpy(scales), (128, 128))
    np.testing.assert_array_equal(_np(got), want)
    w = Fp8Weight(_fp8_tensor(codes), torch.from_numpy(scales))
    assert w.shape == tuple(shape)
    np.testing.assert_array_equal(_np(w.dequantize()), want)


@pytest.mark.parametrize("m,n,k", [(1, 200, 256), (83, 576, 512), (5, 64, 128)])
def test_w8a8_reference_is_dequantized_matmul(m, n, k):
    rng = np.random.default_rng(n)
    codes, scales = _random_fp8_weight(rng, n, k)
    xq_codes = encode_e4m3(rng.standard_normal((m, k)).astype(np.float32) * 100)
    xs = rng.uniform(1e-3, 1e-2, size=(m, k // 128)).astype(np.float32)
    got = w8a8_block_matmul_ref(_fp8_tensor(xq_codes), torch.from_numpy(xs), _fp8_tensor(codes),
                                torch.from_numpy(scales), (128, 128))
    x = (E4M3_TABLE[xq_codes].astype(np.float64).reshape(m, -1, 128) * xs[..., None]).reshape(m, k)
    w = dequant_fp8_blocks(E4M3_TABLE[codes], scales).astype(np.float64)
    np.testing.assert_allclose(_np(got), x @ w.T, rtol=1e-4, atol=1e-4 * np.abs(x @ w.T).max())


def test_linear_dispatch_and_fp8_linear_error():
    rng = np.random.default_rng(3)
    codes, scales = _random_fp8_weight(rng, 300, 512)
    w = Fp8Weight(_fp8_tensor(codes), torch.from_numpy(scales))
    x = torch.from_numpy(rng.standard_normal((2, 3, 512)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(300).astype(np.float32))
    y = linear(x, w, bias)
    assert tuple(y.shape) == (2, 3, 300) and y.dtype == torch.float32
    wd = dequant_fp8_blocks(E4M3_TABLE[codes], scales).astype(np.float64)
    x2 = _np(x).reshape(6, 512)
    # the same activation quant, then dequantized matmul: only summation order differs
    xq, xs = per_token_group_quant_ref(x.reshape(6, 512), 128)
    xd = (_np(xq).reshape(6, 4, 128) * _np(xs)[..., None]).reshape(6, 512)
    np.testing.assert_allclose(_np(y).reshape(6, 300), xd @ wd.T + _np(bias), rtol=1e-5, atol=1e-4)
    # against unquantized activations: each |x - x_q| <= |x|/16 + the group's subnormal step
    bound = (np.abs(x2) / 16 + np.repeat(_np(xs), 128, 1) * 2.0 ** -9) @ np.abs(wd).T
    assert np.all(np.abs(_np(y).reshape(6, 300) - (x2 @ wd.T + _np(bias))) <= bound * (1 + 1e-5) + 1e-4)
    dense_w = torch.from_numpy(rng.standard_normal((7, 512)).astype(np.float32))
    np.testing.assert_array_equal(_np(linear(x, dense_w)), _np(F.linear(x, dense_w)))


_interpreted = pytest.mark.skipif(runtime.name() != "torch" or os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="the Triton interpreter needs runtime torch and TRITON_INTERPRET=1")


def _run_interpreted_gemm(m, n, k, block, split):
    from paddle_mla.models.fp8 import w8a8_gemm

    rng = np.random.default_rng(m + n + k)
    codes, scales = _random_fp8_weight(rng, n, k, block)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    xq, xs = per_token_group_quant_ref(x, block[1])
    out = torch.empty(m, n, dtype=torch.float32)
    w_q, w_s = _fp8_tensor(codes), torch.from_numpy(scales)
    plan = w8a8_gemm(xq, xs, w_q, w_s, out, block, split)
    want = _np(w8a8_block_matmul_ref(xq, xs, w_q, w_s, block))
    np.testing.assert_allclose(_np(out), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    return plan


@_interpreted
@pytest.mark.parametrize("m,n,k,block", [(1, 200, 256, (128, 128)), (83, 576, 384, (128, 128)),
                                         (17, 40, 64, (16, 16)), (128, 130, 128, (128, 128))])
def test_w8a8_triton_kernel_interpreted(m, n, k, block):
    """The GEMM's indexing (edge blocks, N/M tails, scale lookup) under the interpreter, which runs
    the fp8 dot exactly in wider precision, with the plan picked for the interpreter's 4 "SMs".
    (The quant kernel's float8 cast is wrong in the interpreter, so it is tested on the GPU only.)"""
    _run_interpreted_gemm(m, n, k, block, None)


@_interpreted
@pytest.mark.parametrize("m,n,k,block,split,want_split", [
    (1, 200, 512, (128, 128), 4, 4),      # one K block per chunk
    (3, 130, 640, (128, 128), 2, 2),      # 5 blocks in 2 chunks: 2 + 3 (K not a multiple of S * 128)
    (16, 64, 896, (128, 128), 3, 3),      # 7 blocks: 2 + 2 + 3
    (5, 96, 768, (128, 128), 4, 4),       # 6 blocks in 4: 1 + 2 + 1 + 2
    (33, 72, 256, (16, 16), 16, 16),      # every 16-wide block its own chunk; N, M edges
    (2, 40, 128, (128, 128), 8, 1),       # a single K block: capped to 1, the unsplit path
    (4, 64, 384, (128, 128), 9, 3),       # more chunks asked than K blocks: capped
])
def test_w8a8_split_k_interpreted(m, n, k, block, split, want_split):
    """Split-K: each chunk's fp32 partial into the workspace, summed by the reduce kernel."""
    plan = _run_interpreted_gemm(m, n, k, block, split)
    assert plan.split == want_split


def test_gemm_plan_split_k_choice():
    from paddle_mla.models.fp8_kernels import GEMM_TILES, SPLIT_K_MAX_M, gemm_plan

    # kv_a_proj at M = 1 on 132 SMs: 9 tiles of 16 x 64 -> ~3 programs per SM
    p = gemm_plan(1, 576, 7168, 128, 132)
    assert (p.tile.block_m, p.tile.block_n) == (16, 64)
    assert 2 * 132 <= 9 * p.split <= 4 * 132
    # o_proj at M = 1: 112 tiles -> split 4 (K = 128 blocks, 32 each)
    assert gemm_plan(1, 7168, 16384, 128, 132).split == 4
    # enough tiles already, a too-large M, or a single K block: no split
    assert gemm_plan(64, 18432 * 2, 7168, 128, 132).split == 1
    assert gemm_plan(SPLIT_K_MAX_M + 1, 576, 7168, 128, 132).split == 1
    assert gemm_plan(1, 576, 128, 128, 132).split == 1
    # split never exceeds the K blocks
    assert gemm_plan(1, 64, 512, 128, 132).split == 4
    # the tile table covers every M, in increasing order of max_m, prefill tiles 128 x 128
    assert [t.max_m for t in GEMM_TILES] == sorted(t.max_m for t in GEMM_TILES)
    assert (gemm_plan(4096, 7168, 2048, 128, 132).tile.block_m, gemm_plan(4096, 7168, 2048, 128, 132).tile.block_n) \
        == (128, 128)


def test_fp8_kernels_not_available_on_cpu():
    ok, why = fp8_kernels_available("cpu")
    assert not ok and "GPU" in why


def test_quantization_config():
    assert config_from_dict({}).quantization == "auto"
    assert config_from_dict({"quantization": "NONE"}).quantization == "none"
    with pytest.raises(ConfigError, match="'quantization' is 'int4'; allowed: one of 'auto', 'none', 'fp8'"):
        config_from_dict({"quantization": "int4"})
    with pytest.raises(ConfigError, match="'quantization: fp8' needs FP8 kernels.*GPU"):
        config_from_dict({"quantization": "fp8", "device": "cpu"})
    assert config_from_dict({"quantization": "fp8", "device": "gpu"}).quantization == "fp8"
    # at load time, on a CPU: auto and none dequantize; fp8 fails and says why
    assert resolve_keep_fp8("auto", "cpu") is False and resolve_keep_fp8("none", "cpu") is False
    with pytest.raises(ValueError, match="quantization: fp8 needs the FP8 kernels.*GPU"):
        resolve_keep_fp8("fp8", "cpu")
