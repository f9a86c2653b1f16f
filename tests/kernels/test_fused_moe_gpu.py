"""Triton fused MoE on the GPU vs the plain-tensor routed reference: fp32 (IEEE dots), bf16 and
FP8 w8a8 (128x128 weight blocks, per-token-group activations), M in {1, 83, 128, 2048}, experts
empty or full, explicit launch configs and token chunks, CUDA-graph capture and replay, bitwise
determinism, and int64 row offsets past 2^31 elements. Run by scripts/gpu_check.sh; skipped on CPU.
Failure messages carry the case (dims, M, pattern, config) and the measured error."""

import numpy as np
import pytest
from helpers.fused_moe_cases import expert_weights, routing

from paddle_mla.platform import runtime
from paddle_mla.models.fused_moe.reference import (act_qdq_reference, act_quant_reference, dequant_block_fp8,
                                                   quant_block_fp8_reference, routed_moe_reference)
from paddle_mla.platform.tensor_api import torch

pytestmark = [pytest.mark.gpu, pytest.mark.triton]

DEV = "cuda"
E, TOP_K, N, K = 64, 6, 256, 512
M_LIST = [1, 83, 128, 2048]


def _case(M, pattern="random", e=E, top_k=TOP_K, n=N, k=K, seed=0, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    wg, wu, wd = (torch.from_numpy(w).to(DEV, dtype) for w in expert_weights(rng, e, n, k, scale=0.05))
    x = torch.from_numpy(rng.standard_normal((M, k)).astype(np.float32)).to(DEV, dtype)
    ids, w = routing(pattern, M, e, top_k, seed)
    return x, wg, wu, wd, torch.from_numpy(ids).to(DEV), torch.from_numpy(w).to(DEV)


def _fused(x, wg, wu, wd, ids, w, config=None, chunk=8192, fp8_scales=None):
    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    ws = MoEWorkspace(x.shape[0], ids.shape[1], wg.shape[0], wg.shape[1], x.shape[1], x.dtype, DEV,
                      fp8=fp8_scales is not None, chunk_tokens=chunk)
    extra = {}
    if fp8_scales is not None:
        extra = dict(w_gate_scale=fp8_scales[0], w_up_scale=fp8_scales[1], w_down_scale=fp8_scales[2],
                     act_quant=act_quant_reference)
    return fused_moe(x, wg, wu, wd, ids, w, ws, config=config, **extra)


def _rel(got, ref) -> float:
    got, ref = got.float(), ref.float()
    assert torch.isfinite(got).all(), "non-finite values in the fused output"
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty", "one_token_per_expert_skew"])
@pytest.mark.parametrize("M", M_LIST)
def test_fp32_matches_reference(M, pattern):
    case = _case(M, pattern, seed=M)
    err = _rel(_fused(*case), routed_moe_reference(*case))
    assert err < 1e-5, f"fp32 E={E} top{TOP_K} N={N} K={K} M={M} {pattern}: rel err {err:.2e}"


@pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty"])
@pytest.mark.parametrize("M", M_LIST)
def test_bf16_matches_reference(M, pattern):
    case = _case(M, pattern, seed=M, dtype=torch.bfloat16)
    ref = routed_moe_reference(*[t.float() if t.dtype == torch.bfloat16 else t for t in case])
    err = _rel(_fused(*case), ref)
    assert err < 1e-2, f"bf16 E={E} top{TOP_K} N={N} K={K} M={M} {pattern}: rel err {err:.2e} vs the fp32 reference"


def test_every_expert_full_bf16():
    case = _case(300, "all_full", e=8, top_k=8, dtype=torch.bfloat16)
    ref = routed_moe_reference(*[t.float() if t.dtype == torch.bfloat16 else t for t in case])
    err = _rel(_fused(*case), ref)
    assert err < 1e-2, f"all 8 experts full, M=300: rel err {err:.2e}"


def _fp8_case(M, pattern, e, top_k, n, k, seed):
    x, wg, wu, wd, ids, w = _case(M, pattern, e, top_k, n, k, seed)
    qs = [quant_block_fp8_reference(t) for t in (wg, wu, wd)]
    deq = [dequant_block_fp8(q, s) for q, s in qs]
    got = _fused(x.to(torch.bfloat16), *[q for q, _ in qs], ids, w, fp8_scales=[s for _, s in qs])
    ref = routed_moe_reference(x.to(torch.bfloat16).float(), *deq, ids, w, act_qdq=act_qdq_reference)
    return got, ref


@pytest.mark.parametrize("pattern", ["random", "two_full_rest_empty"])
@pytest.mark.parametrize("M", M_LIST)
def test_fp8_matches_dequantized_reference(M, pattern):
    got, ref = _fp8_case(M, pattern, E, TOP_K, N, K, seed=M)
    err = _rel(got, ref)
    assert err < 2e-2, f"fp8 E={E} top{TOP_K} N={N} K={K} M={M} {pattern}: rel err {err:.2e} vs dequantized reference"


@pytest.mark.parametrize("cfg", [
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3, QUANT_GROUP=64),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3, QUANT_GROUP=64),
    dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=4, QUANT_GROUP=128)])
@pytest.mark.parametrize("M", [1, 83, 2048])
def test_fp8_quant_groups_and_configs(M, cfg):
    """The intermediate quantized per 64 columns (gate+up BLOCK_N 64, down K tiles of 64) or 128,
    against the dequantized reference that quantizes it in the same groups (the input per 128). With
    per-128 groups in the reference, a per-64 kernel differs by two independent e4m3 roundings of the
    intermediate: 2.1-2.2e-2 on the H100 (2026-11-24), not a kernel error."""
    x, wg, wu, wd, ids, w = _case(M, "random", seed=M + 5)
    qs = [quant_block_fp8_reference(t) for t in (wg, wu, wd)]
    deq = [dequant_block_fp8(q, s) for q, s in qs]
    got = _fused(x.to(torch.bfloat16), *[q for q, _ in qs], ids, w, config=cfg, chunk=700,
                 fp8_scales=[s for _, s in qs])
    group = cfg["QUANT_GROUP"]
    ref = routed_moe_reference(x.to(torch.bfloat16).float(), *deq, ids, w, act_qdq=act_qdq_reference,
                               act_qdq_inter=lambda h: act_qdq_reference(h, group))
    err = _rel(got, ref)
    assert err < 2e-2, f"fp8 M={M} config {cfg} (700-token chunks): rel err {err:.2e} vs dequantized reference"


def test_fp8_v3_dims():
    """V3 expert dims (N=2048, K=7168), top-4 of 8 experts (the reference dequantizes to fp32)."""
    got, ref = _fp8_case(83, "random", 8, 4, 2048, 7168, seed=1)
    err = _rel(got, ref)
    assert err < 2e-2, f"fp8 V3 dims M=83: rel err {err:.2e}"


@pytest.mark.parametrize("cfg", [
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=2),
    dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, GROUP_M=16, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)])
def test_configs_and_chunks_bf16(cfg):
    case = _case(2048, "random", seed=9, dtype=torch.bfloat16)
    ref = _fused(*case)
    err = _rel(_fused(*case, config=cfg, chunk=700), ref)
    assert err < 1e-2, f"config {cfg} with 700-token chunks vs the default config: rel err {err:.2e}"


def test_cuda_graph_replay_and_determinism():
    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    x, wg, wu, wd, ids, w = _case(64, "random", seed=3, dtype=torch.bfloat16)
    ws = MoEWorkspace(64, TOP_K, E, N, K, torch.bfloat16, DEV)
    eager = [fused_moe(x, wg, wu, wd, ids, w, ws) for _ in range(3)]
    assert all(torch.equal(eager[0], e) for e in eager[1:]), "fused MoE is not bitwise deterministic"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fused_moe(x, wg, wu, wd, ids, w, ws)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fused_moe(x, wg, wu, wd, ids, w, ws)
    x2, _, _, _, ids2, w2 = _case(64, "one_token_per_expert_skew", seed=4, dtype=torch.bfloat16)
    x.copy_(x2)
    ids.copy_(ids2)
    w.copy_(w2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_moe(x, wg, wu, wd, ids, w, ws)), "graph replay with new routing != eager"


def test_int64_offsets_past_2_pow_31():
    """40000 tokens x top-8 x K=7168 in one chunk: pair * K passes 2^31 (int32 offsets would wrap)."""
    M, e, top_k, n, k = 40000, 8, 8, 128, 7168
    x, wg, wu, wd, ids, w = _case(M, "all_full", e, top_k, n, k, seed=5, dtype=torch.bfloat16)
    out = _fused(x, wg, wu, wd, ids, w, chunk=M)
    tail = slice(M - 64, M)
    ref = routed_moe_reference(x[tail].float(), wg.float(), wu.float(), wd.float(), ids[tail], w[tail])
    err = _rel(out[tail], ref)
    assert err < 1e-2, f"last 64 of {M} tokens (pair offsets up to {M * top_k * k:.2e}): rel err {err:.2e}"


def test_layer_auto_picks_triton_on_gpu(monkeypatch):
    from paddle_mla.models.moe import MoEExec

    monkeypatch.delenv("PADDLE_MLA_MOE", raising=False)
    ex = MoEExec(runtime.device_string("gpu"), torch.bfloat16)
    assert ex.impl == "triton"
    case = _case(83, "random", seed=6, dtype=torch.bfloat16)
    ref = routed_moe_reference(*[t.float() if t.dtype == torch.bfloat16 else t for t in case])
    err = _rel(ex.run(*case), ref)
    assert err < 1e-2, f"MoEExec auto on the GPU: rel err {err:.2e}"


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_tiny_model_triton_moe_matches_reference_moe(tmp_path, monkeypatch, arch):
    """The whole tiny model on the GPU in fp32, its MoE layers run by the fused kernels and by the
    routed reference: identical greedy tokens, first logits within 1e-4."""
    from helpers.model_harness import run_greedy

    from paddle_mla.models import load_model, make_tiny_model

    path = make_tiny_model(tmp_path / arch, arch=arch, seed=0)
    prompts = [[5, 17, 33, 2, 91, 64, 40, 8, 77, 12, 3], [44, 9, 81, 27, 70, 15]]
    got = {}
    for impl in ("triton", "reference"):
        monkeypatch.setenv("PADDLE_MLA_MOE", impl)
        model = load_model(str(path), torch.float32, DEV)
        assert model.moe_exec.impl == impl
        got[impl] = run_greedy(model, prompts, 12, block_size=4, seed=1, device=DEV, backend="native")
    for r in range(len(prompts)):
        np.testing.assert_allclose(got["triton"].first_logits[r], got["reference"].first_logits[r], atol=1e-4, rtol=0)
        assert got["triton"].tokens[r] == got["reference"].tokens[r], f"{arch} prompt {r}"
