"""FP8 routed experts: a checkpoint whose experts are block-scaled FP8, kept FP8 by the loader.

CPU: the MoE layer dequantizes them once (the reference path) and the model equals the one loaded
with the experts dequantized by the loader. GPU: kept FP8 with 128x128 blocks, the MoE layer runs
the fused w8a8 kernels and matches the fp32 reference on the dequantized experts (activation
quant mirrored)."""

import json

import numpy as np
import pytest
from test_loader import _quantize_blocks

from paddle_mla.models.fp8 import Fp8Weight
from paddle_mla.models.safetensors_io import save_file
from paddle_mla.models.tiny import tiny_config, tiny_weights
from paddle_mla.platform.tensor_api import torch


def _fp8_expert_checkpoint(path, block, shared=False, **dims):
    """The tiny V3 config (``dims`` overriding its sizes) with every routed expert weight in FP8
    (``shared``: the shared experts' too, as DeepSeek-V3's checkpoint has them)."""
    cfg = dict(tiny_config("deepseek_v3", 512, 0, 1), **dims)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block),
                                  "activation_scheme": "dynamic"}
    tensors, raw = {}, {}
    for name, w in tiny_weights(cfg, 3).items():
        if ".mlp.experts." in name or (shared and ".mlp.shared_experts." in name):
            tensors[name], tensors[name + "_scale_inv"] = _quantize_blocks(w, block)
            raw[name] = "F8_E4M3"
        else:
            tensors[name] = w
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, path / "model.safetensors", raw)
    return path


def test_fp8_experts_run_dequantized_on_cpu(tmp_path):
    from helpers.model_harness import run_greedy

    from paddle_mla.models.arch import load_arch
    from paddle_mla.models.deepseek import CausalLM
    from paddle_mla.models.loader import load_model, load_weights
    from paddle_mla.models.moe import MoE

    path = _fp8_expert_checkpoint(tmp_path / "fp8", (16, 16))
    arch = load_arch(path)
    w = load_weights(path, arch, torch.float32, "cpu", keep_fp8=True, expert_fp8=True, progress=False)
    assert isinstance(w["model.layers.1.mlp.experts.gate"], Fp8Weight)            # kept by the loader ...
    kept = CausalLM(arch, w, "cpu", torch.float32)
    moes = [layer.mlp for layer in kept.layers if isinstance(layer.mlp, MoE)]
    assert moes and all(not m.fp8 and m.w_gate.dtype == torch.float32 for m in moes)   # ... dequantized by the layer
    deq = load_model(str(path), torch.float32, "cpu", quantization="none", progress=False)
    prompts = [[3, 9, 27, 81, 243, 100, 7], [11, 12, 13]]
    a, b = run_greedy(kept, prompts, 4, block_size=4), run_greedy(deq, prompts, 4, block_size=4)
    for x, y in zip(a.first_logits, b.first_logits):
        assert np.isfinite(x).all()
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    assert a.tokens == b.tokens


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [5, 300])
@pytest.mark.parametrize("shared_fp8", [False, True])
def test_fp8_experts_kept_on_gpu_match_dequantized_reference(tmp_path, tokens, shared_fp8):
    from paddle_mla.platform import runtime
    from paddle_mla.models.fp8 import fp8_kernels_available
    from paddle_mla.models.fused_moe.reference import act_qdq_reference, routed_moe_reference
    from paddle_mla.models.loader import load_model
    from paddle_mla.models.moe import route

    ok, why = fp8_kernels_available("gpu")
    if not ok:
        pytest.skip(why)
    dev = runtime.device_string("gpu")
    path = _fp8_expert_checkpoint(tmp_path / "fp8", (128, 128), shared_fp8, hidden_size=256,
                                  moe_intermediate_size=256, intermediate_size=256)
    model = load_model(str(path), torch.bfloat16, dev, quantization="fp8", progress=False)
    model.reserve_moe_workspace(512)                   # the engine's start-up: the FP8 workspace
    moe = model.layers[1].mlp
    assert moe.exec.impl == "triton" and moe.fp8
    assert isinstance(moe.w_gate, Fp8Weight) and moe.w_gate.weight.dtype == torch.float8_e4m3fn
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(tokens, 256, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
    out = moe.forward(x).to(torch.float32)
    # FP8 shared experts join the FP8 stacks (moe.fold_shared_experts) as rows E..; bf16 ones stay
    # apart. 5 tokens run them folded, 300 apart (MoE.folds_shared) over the stacks' rows
    assert moe.shared_pieces == (1 if shared_fp8 else 0)
    pieces = moe.shared_pieces if moe.folds_shared(tokens) else 0
    assert pieces == (1 if shared_fp8 and tokens == 5 else 0)
    ids, weights = route(moe.spec, x, moe.gate_w, moe.bias, pieces)
    deq = [w.dequantize(torch.float32) for w in (moe.w_gate, moe.w_up, moe.w_down)]
    # the fp32 reference on the dequantized experts, with the w8a8 activation quant mirrored (as
    # tests/kernels/test_fused_moe_gpu.py): what is left is bf16 rounding and summation order
    ref = routed_moe_reference(x.to(torch.float32), *deq, ids, weights, act_qdq=act_qdq_reference)
    if not pieces:
        ref = ref + moe.shared.forward(x).to(torch.float32)
    rel = float((out - ref).norm() / ref.norm())
    assert torch.isfinite(out).all() and rel <= 2e-2, rel
