"""Fused MoE (routed experts of one layer) against SGLang's Triton fused MoE, same process, GPU.

For V2-Lite (E=64, top-6, N=1408, K=2048) and V3 (E=256, top-8, N=2048, K=7168) shapes, bf16
and FP8 (w8a8, 128x128 weight blocks), at M in {1, 16, 64, 256, 4096, 16384} tokens with
uniformly random distinct experts per token: median µs (CUDA-graph replay, L2 flushed by
do_bench) of ours (align + gate/up GEMM + down GEMM + top-k sum, + the input quantization for
FP8) and of SGLang 0.5.3's sequence (benchmarks.harness.moe_cases.SGLangMoE: same align, its
kernel and configs), the ratio SGLang/ours (> 1: ours faster), and at M <= 64 the share of the
memory roofline (bytes of the touched expert weights / measured copy bandwidth). The two
outputs are compared (relative error) so a wrong kernel cannot post a fast time.

  python3 -m benchmarks.kernels.fused_moe [--quick] [--json out.json]
SGLang's files come from scripts/fetch_sglang_fused_moe.sh (./third_party, git-ignored).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
import traceback

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs and triton.testing: the benchmark runs on PyTorch

import torch  # noqa: E402

from benchmarks.harness.dims import MOE_SHAPES  # noqa: E402
from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.moe_cases import (Env, SGLangMoE, act_quant_fn, bench_us, copy_bandwidth_gbs,  # noqa: E402
                                          device_name, load_sglang, make_inputs, make_weights, touched_weight_bytes)
from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe, get_config  # noqa: E402

FULL_M = (1, 16, 64, 256, 4096, 16384)
QUICK_M = (16, 4096)


def run_shape(key, fp8, ms, sg, bw, rows, quant):
    shape = MOE_SHAPES[key]
    wts = make_weights(shape, fp8)
    ws = MoEWorkspace(max(ms), shape.top_k, shape.E, shape.N, shape.K, Env.dtype, Env.device, fp8=fp8)
    scales = dict(w_gate_scale=wts.s_gate, w_up_scale=wts.s_up, w_down_scale=wts.s_down, act_quant=quant) if fp8 else {}
    dtype = "fp8" if fp8 else "bf16"
    for M in ms:
        row = dict(shape=shape.name, dtype=dtype, M=M)
        try:
            x, ids, w = make_inputs(shape, M)

            def ours():
                return fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws, **scales)

            row["config"] = get_config(min(M, ws.chunk), shape.E, shape.N, shape.K, shape.top_k,
                                       "fp8_w8a8" if fp8 else "bf16", device_name())
            row["ours_us"] = bench_us(ours)
            if M <= 64:
                roof = touched_weight_bytes(shape, ids, fp8) / (bw * 1e9) * 1e6
                row["roofline_us"] = roof
                row["pct_roofline"] = 100.0 * roof / row["ours_us"]
            if sg is not None:
                ref = SGLangMoE(sg, shape, wts, M)
                row["sglang_config"] = ref.config
                row["sglang_us"] = bench_us(lambda: ref(x, ids, w))
                row["ratio"] = row["sglang_us"] / row["ours_us"]
                row["rel_err_vs_sglang"] = rel_err(ours(), ref(x, ids, w))
        except Exception as e:  # noqa: BLE001  (one failing point must not hide the others)
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        rows.append(row)
        print(fmt(row), flush=True)
    del wts, ws
    if not Env.smoke:
        torch.cuda.empty_cache()


def fmt(r) -> str:
    def f(k, spec):
        return format(r[k], spec) if k in r else "-"
    if "error" in r:
        return f"| {r['shape']} | {r['dtype']} | {r['M']} | ERROR: {r['error'][:160]} |"
    return (f"| {r['shape']} | {r['dtype']} | {r['M']} | {f('ours_us', '.1f')} | {f('sglang_us', '.1f')} | "
            f"{f('ratio', '.2f')} | {f('pct_roofline', '.0f')} | {f('rel_err_vs_sglang', '.1e')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"M in {QUICK_M} only (about a minute)")
    ap.add_argument("--m", default=None, help="comma-separated token counts (default: the full list)")
    ap.add_argument("--shapes", default="v2lite,v3")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="check this tool's code paths on CPU (TRITON_INTERPRET=1, tiny shape, fp16, M 1 and 16)")
    args = ap.parse_args()
    if args.smoke:
        Env.set_smoke()
        args.m, args.shapes, args.dtypes = "1,16", "tiny", "bf16"
    ms = tuple(int(m) for m in args.m.split(",")) if args.m else (QUICK_M if args.quick else FULL_M)
    t0 = time.time()
    sg, sg_source = load_sglang()
    quant, quant_name = act_quant_fn()
    bw = copy_bandwidth_gbs()
    print(f"# fused MoE vs SGLang — {device_name()}, torch {torch.__version__}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"SGLang: {sg_source if sg else 'NOT RUN: ' + sg_source}")
    print(f"FP8 activation quantizer (both sides): {quant_name}")
    print(f"copy bandwidth {bw:.0f} GB/s; times are CUDA-graph replays, median µs; ratio = SGLang / ours")
    print("\n| shape | dtype | M | ours µs | SGLang µs | ratio | % mem roofline | rel err vs SGLang |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for key in args.shapes.split(","):
        for dtype in args.dtypes.split(","):
            run_shape(key, dtype == "fp8", ms, sg, bw, rows, quant)
    bad = [r for r in rows if "error" in r or r.get("rel_err_vs_sglang", 0) > 3e-2]
    print(f"\n{len(rows)} points, {len(bad)} failed or disagree with SGLang (rel err > 3e-2); {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=device_name(), copy_gbs=bw, sglang=sg_source, quantizer=quant_name,
                           rows=rows), fh, indent=1, default=str)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
