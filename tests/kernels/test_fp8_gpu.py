"""FP8 Triton kernels on the GPU (sm_89+): activation quant vs its reference, the w8a8 block GEMM
vs the dequantizing reference at DeepSeek-V3 shapes, and a model loaded with FP8 weights kept."""

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.models.fp8 import (
    Fp8Weight,
    fp8_kernels_available,
    fp8_linear,
    per_token_group_quant,
    per_token_group_quant_ref,
    w8a8_block_matmul_ref,
    w8a8_gemm,
    w8a8_plan,
)
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dev():
    ok, why = fp8_kernels_available("gpu")
    if not ok:
        pytest.skip(why)
    return runtime.device_string("gpu")


def _rel(a, b):
    """Mean absolute error over mean absolute reference (the vLLM / SGLang FP8 test metric)."""
    a, b = a.to(torch.float32), b.to(torch.float32)
    return float((a - b).abs().mean() / b.abs().mean())


def _weight(n, k, dev, seed):
    torch.manual_seed(seed)
    w = (torch.randn(n, k, device=dev) * 0.05)
    br = -(-n // 128)
    bc = k // 128
    pad = torch.zeros(br * 128, k, device=dev)
    pad[:n] = w
    amax = pad.reshape(br, 128, bc, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / 448.0
    q = (pad.reshape(br, 128, bc, 128) / scale[:, None, :, None]).reshape(br * 128, k)[:n]
    return Fp8Weight(q.clamp(-448, 448).to(torch.float8_e4m3fn), scale.contiguous(), (128, 128), kernel=True), w


@pytest.mark.parametrize("m,k", [(1, 128), (83, 7168), (2048, 2048), (4096, 512)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_group_quant_kernel_matches_reference(dev, m, k, dtype):
    torch.manual_seed(m)
    x = (torch.randn(m, k, device=dev) * torch.rand(m, 1, device=dev) * 10).to(getattr(torch, dtype))
    x[0, :128] = 0
    q, s = per_token_group_quant(x, 128, kernel=True)
    rq, rs = per_token_group_quant_ref(x, 128)
    torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
    # same fp32 division and round-to-nearest-even cast: identical codes
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


@pytest.mark.parametrize("m", [1, 16, 64, 83, 512, 4096])
@pytest.mark.parametrize("n,k", [(2048, 7168), (7168, 2048), (576, 2048), (24576, 1536), (7168, 16384)])
def test_w8a8_gemm_matches_dequantized_reference(dev, m, n, k):
    w, _ = _weight(n, k, dev, seed=n + k)
    torch.manual_seed(m)
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    y = fp8_linear(x, w)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (m, n)
    xq, xs = per_token_group_quant_ref(x, 128)
    ref = w8a8_block_matmul_ref(xq, xs, w.weight, w.scale_inv, w.block)   # both operands dequantized, fp32
    # the target is 2e-2; only bf16 output rounding and summation order differ (~1e-3)
    assert _rel(y, ref) <= 1e-2
    # e4m3 activations themselves cost ~2.6% mean relative error on random data (3 mantissa
    # bits); the CPU tests bound that elementwise, here it is only kept from growing
    assert _rel(y, x.to(torch.float32) @ w.dequantize().transpose(0, 1)) <= 4e-2
    assert torch.isfinite(y.to(torch.float32)).all()


@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("n,k,split", [(576, 7168, 44), (2048, 7168, 12), (7168, 16384, 4), (130, 640, 3),
                                       (2048, 7168, 56)])
def test_w8a8_split_k_matches_dequantized_reference(dev, m, n, k, split):
    """Split-K forced (uneven chunks, an N edge, one K block per chunk): fp32 partials + reduce
    against the dequantize-both reference, and against the unsplit kernel."""
    w, _ = _weight(n, k, dev, seed=n + k + split)
    torch.manual_seed(m)
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    xq, xs = per_token_group_quant(x, 128, kernel=True)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    assert w8a8_gemm(xq, xs, w.weight, w.scale_inv, y, w.block, split).split == split
    y1 = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    assert w8a8_gemm(xq, xs, w.weight, w.scale_inv, y1, w.block, 1).split == 1
    ref = w8a8_block_matmul_ref(xq, xs, w.weight, w.scale_inv, w.block)
    assert _rel(y, ref) <= 1e-2            # the target is 2e-2; bf16 rounding + sum order only
    assert _rel(y, y1) <= 1e-2
    assert torch.isfinite(y.to(torch.float32)).all()


@pytest.mark.parametrize("m,n,k", [(1, 576, 7168), (16, 2048, 7168), (64, 7168, 2048)])
def test_fp8_linear_split_k_cuda_graph_replay_equals_eager(dev, m, n, k):
    """The auto plan splits K at decode sizes; its workspace is cached, so a captured graph replays
    it, and the reduce's fixed order makes replay bit-equal to eager (also across new inputs)."""
    if runtime.name() != "torch":
        pytest.skip("CUDA graphs of the Paddle runtime have not been run on a GPU")
    w, _ = _weight(n, k, dev, seed=m + n)
    assert w8a8_plan(m, n, k, w.block, torch.empty(1, device=dev)).split > 1
    torch.manual_seed(m)
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    graph = runtime.CudaGraph()
    out = graph.capture(lambda: fp8_linear(x, w))
    for seed in (1, 2):
        torch.manual_seed(seed)
        x.copy_(torch.randn(m, k, device=dev).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        eager = fp8_linear(x, w)
        assert torch.equal(out, eager)
        xq, xs = per_token_group_quant_ref(x, 128)
        assert _rel(out, w8a8_block_matmul_ref(xq, xs, w.weight, w.scale_inv, w.block)) <= 1e-2


def test_model_with_fp8_weights_kept(dev, tmp_path):
    """A tiny FP8 checkpoint (32x32 blocks) loaded with quantization fp8 runs the Triton kernels in
    every kept linear; it must agree with the same weights on the plain-tensor w8a8 reference path
    (same activation quant, so only summation order differs)."""
    from helpers.model_harness import run_greedy
    from test_loader import _copy_with, _fp8_checkpoint_tensors

    from paddle_mla.models import ensure_tiny_model, load_model

    tiny = ensure_tiny_model()
    fp8, raw, qcfg, _ = _fp8_checkpoint_tensors(tiny, (32, 32))    # the FP8 dot needs K blocks >= 32
    path = _copy_with(tiny, tmp_path / "fp8", fp8, raw, qcfg)
    kept = load_model(str(path), torch.float32, dev, quantization="fp8")
    assert isinstance(kept.layers[0].attn.o_proj, Fp8Weight) and kept.layers[0].attn.o_proj.kernel
    ref = load_model(str(path), torch.float32, dev, quantization="fp8")
    for layer in ref.layers:
        for w in vars(layer.attn).values():
            if isinstance(w, Fp8Weight):
                w.kernel = False
    prompts = [[3, 9, 27, 81, 243], [11, 12, 13]]
    a = run_greedy(kept, prompts, 4, block_size=4, device=dev)
    b = run_greedy(ref, prompts, 4, block_size=4, device=dev)
    for x, y in zip(a.first_logits, b.first_logits):
        assert np.abs(x - y).max() <= 1e-3 * np.abs(y).max()
    assert a.tokens == b.tokens
