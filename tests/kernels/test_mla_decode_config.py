"""Host side of the ``mla_decode`` CUDA op (CPU): the launch config per head count, its overrides,
the shared-memory budget of every instantiated config against an SM90 block's 227 KB (the same
layout formula as custom_ops/mla_decode_kernel.cuh), and the CPU fallbacks (the op refuses, the
backend keeps Triton)."""

import pytest

from paddle_mla.ops import mla_decode as op

SM90_SMEM = 227 * 1024
PITCH = 576 + 8


def _up(x):
    return (x + 127) // 128 * 128


def _smem(rb, cs, bn, nst):
    """Bytes of mla_decode_kernel.cuh's SplitLayout (Q rows, the key stages, the score exchange), or of
    mla_decode_wgmma.cuh's WgLayout for the warpgroup kernel (Q and two 64 x 576 swizzled tiles, P
    fragments, row scalars, alignment slack)."""
    if (rb, cs, bn, nst) == op.WARPGROUP:
        return 3 * 64 * 576 * 2 + 8192 + 1024 + 1024
    if (rb, cs, bn, nst) == op.NARROW:   # two key tiles, Q and P^T of 16 heads, maxima and sums, barriers, slack
        return 2 * 64 * 576 * 2 + 16 * 576 * 2 + 16 * 64 * 2 + 3 * 4 * 16 * 4 + 6 * 8 + 1024
    kv = _up(16 * rb * PITCH * 2)
    red = kv + nst * _up(bn * PITCH * 2)
    return red + (_up(cs * 16 * rb * (bn + 4) * 4) if cs > 1 else 0)


@pytest.mark.parametrize("heads,groups", [(1, 1), (16, 1), (17, 1), (20, 1), (64, 1), (65, 2), (100, 2), (128, 2)])
def test_launch_config_by_heads(heads, groups):
    c = op.launch_config(heads, 132)
    narrow = heads <= 16   # the narrow kernel's 16-head programs, else 64-head ones
    assert (c.row_blocks, c.col_splits, c.block_n, c.stages) == (op.NARROW if narrow else op.WARPGROUP)
    assert c.heads_per_program == (16 if narrow else 64) and c.head_groups(heads) == groups
    assert c.programs == 132 // groups   # one program per SM over all head groups
    f = op.launch_config(heads, 132, fp8=True)   # FP8 rows: the 64-head kernel at every head count
    assert (f.row_blocks, f.col_splits, f.block_n, f.stages) == op.WARPGROUP
    if heads > 16:
        assert f == c   # the same 64-head config
    else:   # what the split plan reads is the same, so one plan serves both caches
        plan = lambda x: (x.block_n, x.programs, x.min_tiles, min(heads, x.heads_per_program))  # noqa: E731
        assert plan(f) == plan(c)
    assert op.launch_config(heads, 132, row_blocks=1, col_splits=4, block_n=32, stages=4).row_blocks == 1


def test_every_instantiated_config_fits_an_sm90_block():
    for rb, cs, bn, nst in op.SUPPORTED:
        assert _smem(rb, cs, bn, nst) <= SM90_SMEM, (rb, cs, bn, nst)
        assert (576 // 16) % cs == 0 and (512 // cs) % 16 == 0 and bn % 16 == 0


def test_overrides_and_env(monkeypatch):
    assert op.launch_config(128, 132, row_blocks=4, col_splits=2, block_n=32, stages=3).block_n == 32
    assert op.launch_config(16, 132, programs=7).programs == 7
    monkeypatch.setenv("PADDLE_MLA_CUDA_DECODE_CFG", "min_tiles=8")
    assert op.launch_config(16, 132).min_tiles == 8
    with pytest.raises(ValueError, match="no kernel"):
        op.launch_config(16, 132, block_n=128)   # the warpgroup kernel takes 64-token tiles only


def test_cpu_falls_back_to_triton(monkeypatch):
    from paddle_mla.attention.backend import MLADims
    from paddle_mla.attention.triton_mla import cuda_decode
    from paddle_mla.attention.triton_mla.backend import TritonMLABackend
    from paddle_mla.platform import runtime
    from paddle_mla.platform.tensor_api import torch

    assert cuda_decode.unavailable_reason(512, 576, torch.bfloat16, "cpu") == "not on a GPU"
    monkeypatch.setattr(cuda_decode, "interpreting", lambda: False)   # past the device check: the dims decide
    assert cuda_decode.unavailable_reason(256, 320, torch.bfloat16, "cuda").startswith("dims kv_lora_rank 256")
    assert cuda_decode.unavailable_reason(512, 576, torch.float16, "cuda").startswith("dtype")
    assert cuda_decode.unavailable_reason(512, 576, torch.bfloat16, "cuda", block_size=12).startswith(
        "cache block_size 12")
    if not runtime.supports_triton_on("cpu")[0]:
        pytest.skip("the triton_mla backend needs Triton on this CPU (TRITON_INTERPRET=1)")
    dims = MLADims(num_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                   softmax_scale=192 ** -0.5)
    be = TritonMLABackend(dims, 4, 256, 64, "cpu", torch.float32)
    assert be.cuda is None and be.ws.programs == be.cfg.programs


@pytest.mark.parametrize("bad,message", [
    ({}, "no CUDA kernels"),
    ({"q": ((2, 16, 576), "float32")}, "q and out must be bf16, kv_cache bf16 or float8 e4m3"),
    ({"kv": ((4, 16, 1, 512), "bfloat16")}, "kv_cache must be [num_blocks, page, 1, 576]"),
    ({"kv": ((4, 16, 1, 576), "float8_e4m3fn")}, "kv_cache must be [num_blocks, page, 1, 576] bf16 or"),
    ({"kv": ((4, 16, 1, 592), "float8_e4m3fn")}, "no CUDA kernels"),    # FP8 rows pass the checks
    ({"kv": ((4, 16, 1, 592), "float32")}, "kv_cache must be"),
    ({"out": ((2, 8, 512), "bfloat16")}, "out must be [B, H, 512]"),
    ({"bt": ((2, 3), "int64")}, "block_tables must be int32"),
    ({"lens": ((1,), "int32")}, "fewer rows than batch"),
    ({"po": ((4, 16, 256), "float32")}, "partial_out must be fp32 [rows, >= H, 512]"),
])
def test_both_bindings_refuse_bad_inputs_with_the_shared_checks(bad, message):
    """The torch and Paddle bindings describe their tensors and call one validation
    (mla_decode_args in custom_ops/mla_decode_cuda.h); on a CPU build valid inputs end at the
    missing CUDA kernels."""
    from paddle_mla.ops import build
    from paddle_mla.platform.tensor_api import torch

    ops = build.load_ops()
    if ops is None or ops.with_cuda:
        pytest.skip("needs the CPU build of the custom ops")
    spec = {"q": ((2, 16, 576), "bfloat16"), "kv": ((4, 16, 1, 576), "bfloat16"), "bt": ((2, 3), "int32"),
            "lens": ((2,), "int32"), "out": ((2, 16, 512), "bfloat16"), "po": ((4, 16, 512), "float32"), **bad}
    t = {name: torch.zeros(*shape, dtype=getattr(torch, dtype)) for name, (shape, dtype) in spec.items()}
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        ops.mla_decode(t["q"], t["kv"], t["bt"], t["lens"], i32(2), i32(3), i32(3), i32(1), t["out"], t["po"],
                       torch.zeros(4, 16, 1), 2, 0.1, 4, 32, 1, 4, 4)


@pytest.mark.parametrize("bad,splits,message", [
    ({}, 1, "no CUDA kernels"),
    ({}, 4, "no CUDA kernels"),
    ({"ql": ((2, 16, 576), "bfloat16")}, 1, "q_lat must be [T, H, 512]"),
    ({"qp": ((2, 8, 64), "bfloat16")}, 1, "q_pe must be [T, H, 64]"),
    ({"kv": ((4, 16, 1, 512), "bfloat16")}, 1, "kv_cache must be [num_blocks, page, 1, 576]"),
    ({"slots": ((2, 256), "int32")}, 1, "slots must be int64"),
    ({"out": ((2, 16, 512), "float32")}, 1, "must be bf16"),
    ({"po": ((16,), "float32")}, 4, "the partial workspaces hold fewer"),
    ({}, 9, "every split must hold a key"),
    ({}, 2, "the splits must cover the top-k"),
])
def test_both_bindings_refuse_bad_sparse_inputs_with_the_shared_checks(bad, splits, message):
    """mla_sparse: one validation (mla_sparse_args in custom_ops/mla_sparse_cuda.h) behind both
    bindings; valid inputs on a CPU build end at the missing CUDA kernels."""
    from paddle_mla.ops import build
    from paddle_mla.platform.tensor_api import torch

    ops = build.load_ops()
    if ops is None or ops.with_cuda:
        pytest.skip("needs the CPU build of the custom ops")
    spec = {"ql": ((2, 16, 512), "bfloat16"), "qp": ((2, 16, 64), "bfloat16"), "kv": ((4, 16, 1, 576), "bfloat16"),
            "slots": ((2, 256), "int64"), "out": ((2, 16, 512), "bfloat16"), "po": ((2 * 16 * 4 * 512,), "float32"),
            **bad}
    t = {name: torch.zeros(*shape, dtype=getattr(torch, dtype)) for name, (shape, dtype) in spec.items()}
    split_len = 256 if splits == 1 else 64
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        ops.mla_sparse(t["ql"], t["qp"], t["kv"], t["slots"], t["out"], t["po"], torch.zeros(2 * 16 * 4), 2, splits,
                       split_len, 0.1)
