"""Routed MoE: a plain-tensor reference (CPU, the native path, the oracle of the kernels) and the
Triton fused MoE (align -> grouped GEMM gate+up with silu*mul -> grouped GEMM down with the routing
weights -> sum over top-k), bf16/fp16/fp32 and FP8 w8a8 with 128x128 weight blocks.

Modules (import them directly; importing this package does not import Triton):
  reference.routed_moe_reference, reference.dequant_block_fp8
  align.moe_align                    (Triton)
  kernels.fused_moe, kernels.MoEWorkspace (Triton)
  configs.get_config                 (launch configs kept as JSON data, tuned by benchmarks.kernels.tune_fused_moe)
"""
