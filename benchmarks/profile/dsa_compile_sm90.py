"""Compile every DSA Triton kernel for sm_90 on a machine without a GPU (Triton's bundled ptxas), so a
kernel that does not compile is found here rather than in a device call. Prints shared memory per
kernel variant. No device time; the local Triton may differ a little from the GPU machine's.

    python -m benchmarks.profile.dsa_compile_sm90
"""

from __future__ import annotations

import argparse
import os

from paddle_mla.platform import runtime

runtime.select("torch")
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from paddle_mla.attention.dsa import index_kernels as ik, sparse_mla as sm, topk_select as ts  # noqa: E402

WINDOW = {"batch_ids": "*i32", "positions": "*i64", "ks": "*i32", "ke": "*i32", "cu_k": "*i32"}


def compile_sm90(fn, constexprs: dict, ptrs: dict, floats=(), warps: int = 8, stages: int = 2) -> None:
    sig = {n: "constexpr" if n in constexprs else ptrs.get(n, "fp32" if n in floats else "i32") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    print(f"{fn.__name__} {constexprs}: shared {k.metadata.shared} B")


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    topk_ptrs = dict(WINDOW, scores="*fp32", out="*i64", scratch="*i32", fallbacks="*i32")
    for uw in (False, True):
        for sem in ("acq_rel", "relaxed"):
            compile_sm90(ts._candidates_kernel, dict(USE_WINDOW=uw, BLOCK=1024, CAP=4096, SAMPLE=1024,
                                                     THRESHOLD_DIGITS=3, SEM=sem), topk_ptrs, warps=4)
        for short, stats in ((False, False), (True, False), (True, True)):
            compile_sm90(ts._select_kernel, dict(USE_WINDOW=uw, BLOCK=4096, BLOCK_K=1024, CAP=4096, SHORT=short,
                                                 STATS=stats), dict(topk_ptrs, paths="*i32"), warps=16)
        for one in (True, False):
            compile_sm90(ik._index_score_kernel, dict(PAGE=64, USE_WINDOW=uw, ONE_HEAD_BLOCK=one, BLOCK_H=64,
                                                      BLOCK_D=128, BLOCK_N=64),
                         dict(WINDOW, q="*bf16", w="*fp32", cache="*bf16", tables="*i32", out="*fp32"))
    for direct in (False, True):
        compile_sm90(sm._sparse_partial_kernel, dict(DIRECT=direct, BLOCK_H=64, BLOCK_C=512, BLOCK_R=64, BLOCK_N=64,
                                                     NUM_STAGES=2),
                     dict(q_lat="*bf16", q_pe="*bf16", cache="*bf16", slots="*i64", part_o="*fp32", part_lse="*fp32",
                          out="*bf16"), floats=("sm_scale_log2",))
    compile_sm90(sm._merge_kernel, dict(BLOCK_S=8, BLOCK_C=512), dict(part_o="*fp32", part_lse="*fp32", out="*bf16"))
    compile_sm90(ik._pos_to_slot_kernel, dict(PAGE=64, BLOCK_K=1024),
                 dict(pos="*i64", batch_ids="*i32", tables="*i32", out="*i64"))


if __name__ == "__main__":
    main()
