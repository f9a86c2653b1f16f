"""Registers and spills of the decode stage-1 kernel per variant, compiled for sm_90 on a machine
without a GPU (Triton's bundled ptxas + cuobjdump). No device time; predicts what ncu will show.

    python -m benchmarks.profile.decode_registers_sm90 [--h 128] [--variants "dv_split=2;block_h=32"]

The pointer/stride arguments carry tt.divisibility=16 (as at run time with aligned tensors), otherwise
Triton generates no cp.async pipeline and the counts mislead. Triton versions differ a little from the
GPU machine's; compare variants with each other, not with absolute ncu numbers.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import tempfile

from paddle_mla.platform import runtime

runtime.select("torch")
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.harness.mla_cases import LORA, PAGE, ROPE, parse_variants  # noqa: E402
from paddle_mla.attention.triton_mla import decode  # noqa: E402
from paddle_mla.platform.triton_host import next_pow2  # noqa: E402

PTRS = ("Q", "KV", "BT", "SEQ", "NSPLIT", "CU_T", "SPLIT0", "TPP", "O", "PO", "PLSE", "ROW0", "NTOK")
PTR_TYPES = {"Q": "*bf16", "KV": "*bf16", "O": "*bf16", "PO": "*fp32", "PLSE": "*fp32"}
DIV16 = ("stride_qb", "stride_qh", "stride_kvb", "stride_kvs", "stride_bt", "stride_ob", "stride_oh",
         "stride_por", "stride_poh")


def compile_stage1(cfg, h: int):
    fn = decode._decode_stage1
    names = fn.arg_names
    constexprs = {"PAGE": PAGE, "LKV": LORA, "LR": ROPE, "BLOCK_B": 256, "BLOCK_KV": next_pow2(LORA),
                  "BLOCK_R": ROPE, "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "DV_SPLIT": cfg.dv_split,
                  "Q_IN_LOOP": bool(cfg.q_in_loop), "DOT_PREC": "tf32", "PDL": bool(cfg.pdl), "QG": 1}
    sig = {}
    for n in names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in PTRS:
            sig[n] = PTR_TYPES.get(n, "*i32")
        elif n == "sm_scale_log2":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in PTRS + DIV16}
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def res_usage(kernel) -> str:
    cuobjdump = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))[0]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    return f"regs {m.group(1)}, stack {m.group(2)} B, local {m.group(4)} B, shared {m.group(3)} B" if m else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--variants", default="dv_split=2;dv_split=4;block_h=32;dv_split=2,block_n=32,num_stages=3")
    a = ap.parse_args()
    for over in parse_variants(a.variants):
        cfg = decode.decode_config(a.h, programs=1, **over)
        try:
            k = compile_stage1(cfg, a.h)
            shared = k.metadata.shared
            print(f"h={a.h} {over or 'default'}: {res_usage(k)} (triton shared {shared} B)", flush=True)
        except Exception as e:  # noqa: BLE001  (a variant that does not fit is a result)
            print(f"h={a.h} {over or 'default'}: failed {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
