"""Benchmark: the MLA extend (prefill) attention kernel vs SDPA's flash backend and SGLang's Triton
extend kernel, same process, same data.

MLA prefill attends in expanded form: q/k head dim 192 = 128 nope + 64 rope (k_pe one row per
token, shared by every head), v 128, causal. Ours reads exactly that (``prefill.extend_attention``
with ``k_b_shared``, as ``extend.ExtendWorkspace`` calls it). The anchors get the equivalent dense
problem: k_pe broadcast into [T, H, 192]; SDPA's flash backend in PyTorch needs one head dim for
q, k and v, so its v is zero-padded to 192 when 128 is refused (the "v padded" column says which).
SGLang: ``extend_attention_fwd`` of sglang 0.5.3 (no prefix), from ./third_party/sglang_extend
(scripts/fetch_sglang_extend.sh).

Times are ``triton.testing.do_bench`` medians. TFLOPS count the causal work actually needed:
b*h*s(s+1)/2 query-key pairs x 2 x (192 + 128); the GEMM peak is a bf16 8192^3 matmul in the same
process. The "prefix" case times the chunked path: 1024 new tokens over a 7168-token prefix, keys
in one launch vs chunks of 4096 / 2048 with the LSE merge (no anchor: SDPA's causal mask is
top-left aligned).

  python -m benchmarks.kernels.mla_prefill [--h 128,16] [--variants "block_n=128;num_stages=3"]
      [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.harness import anchors  # noqa: E402
from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.mla_cases import parse_variants  # noqa: E402
from benchmarks.harness.timing import gemm_rate, median_us  # noqa: E402
from paddle_mla.attention.triton_mla import prefill  # noqa: E402

NOPE, ROPE, DV = 128, 64, 128
DQK = NOPE + ROPE
CASES = [(1, 8192), (16, 1024)]          # (requests, tokens each): one long prompt, a batch of short ones
# the default first; 2 stages was the default before the 2026-11-24 sweep; reverse_m=0 won at 2 stages
DEFAULT_VARIANTS = "reverse_m=0;num_stages=2;num_stages=2,reverse_m=0;block_n=128,num_stages=2;block_m=64,num_warps=4"


def bench(fn):
    return median_us(fn, warmup=20, rep=100)


def make_case(b, s, h, prefix=0, seed=0):
    """Tensors in the layout ExtendWorkspace hands the kernel: q [T,H,192], k_nope [Tk,H,128],
    k_pe [Tk,64] (shared by the heads), v [Tk,H,128]; requests of s new tokens after ``prefix``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq, tk = b * s, b * (s + prefix)
    bf = torch.bfloat16
    q = torch.randn(tq, h, DQK, device="cuda", generator=g).to(bf)
    k_nope = torch.randn(tk, h, NOPE, device="cuda", generator=g).to(bf)
    k_pe = torch.randn(tk, ROPE, device="cuda", generator=g).to(bf)
    v = torch.randn(tk, h, DV, device="cuda", generator=g).to(bf)
    cu_q = torch.arange(b + 1, device="cuda", dtype=torch.int32) * s
    cu_k = torch.arange(b + 1, device="cuda", dtype=torch.int32) * (s + prefix)
    return q, k_nope, k_pe, v, cu_q, cu_k


def run_ours(case, s, scale, cfg_override, chunk=None):
    q, k_nope, k_pe, v, cu_q, cu_k = case
    tq, h, _ = q.shape
    tk = k_nope.shape[0]
    cfg = prefill.extend_config(NOPE, ROPE, DV, **cfg_override)
    out = torch.empty(tq, h, DV, device="cuda", dtype=torch.bfloat16)
    chunk = chunk or tk
    lse = torch.empty(tq, h, device="cuda", dtype=torch.float32) if chunk < tk else None

    def fn():
        for start in range(0, tk, chunk):
            n = min(chunk, tk - start)
            prefill.extend_attention(q[:, :, :NOPE], q[:, :, NOPE:], k_nope[start:start + n], k_pe[start:start + n],
                                     v[start:start + n], out, lse, cu_q, cu_k, s, scale, k_start=start, k_rows=n,
                                     merge=start > 0, k_b_shared=True, cfg=cfg)

    fn()
    return bench(fn), out.clone(), cfg


def dense_k(case):
    q, k_nope, k_pe, v, _, _ = case
    return torch.cat([k_nope, k_pe[:, None, :].expand(-1, k_nope.shape[1], -1)], dim=-1).contiguous()


def run_sdpa(case, b, s, scale):
    """SDPA, flash backend only: (µs, out [T,H,128], v padded?)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, _, _, v, _, _ = case
    h = q.shape[1]
    k = dense_k(case)
    bhsd = lambda x: x.view(b, s, h, x.shape[-1]).transpose(1, 2)
    for padded in (False, True):
        vv = torch.nn.functional.pad(v, (0, DQK - DV)) if padded else v
        fn = lambda vv=vv: torch.nn.functional.scaled_dot_product_attention(
            bhsd(q), bhsd(k), bhsd(vv), is_causal=True, scale=scale)
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = fn()
                t = bench(fn)
        except RuntimeError:
            if padded:
                raise
            continue
        return t, o.transpose(1, 2).reshape(b * s, h, -1)[..., :DV], padded
    raise AssertionError("unreachable")


def run_sglang(sg_fwd, case, s, scale):
    q, _, _, v, cu_q, _ = case
    k = dense_k(case)
    o = torch.empty(q.shape[0], q.shape[1], DV, device="cuda", dtype=torch.bfloat16)
    b = cu_q.shape[0] - 1
    kv_indptr = torch.zeros(b + 1, device="cuda", dtype=torch.int32)   # no prefix
    kv_indices = torch.zeros(1, device="cuda", dtype=torch.int32)
    fn = lambda: sg_fwd(q, k, v, o, k, v, cu_q, kv_indptr, kv_indices, None, True, None, s, scale)
    fn()
    return bench(fn), o.clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h", default="128,16")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="';'-separated extend_config overrides")
    ap.add_argument("--no-prefix", action="store_true", help="skip the chunked-prefix case")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sg_fwd, sg_src = anchors.load(anchors.SGLANG_EXTEND)
    props = torch.cuda.get_device_properties(0)
    peak = gemm_rate("cuda", 8192, torch.bfloat16) / 1e12   # the bf16 GEMM peak measured here
    meta = {"gpu": props.name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "triton": triton.__version__, "gemm_peak_tflops": peak, "sglang": sg_src, "command": " ".join(sys.argv)}
    print(f"# {props.name}, {meta['date']}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"# bf16 8192^3 GEMM: {peak:.0f} TFLOPS; SGLang: {sg_src}")
    variants = parse_variants(args.variants)
    rows = []
    for h in [int(x) for x in args.h.split(",") if x]:
        for b, s in CASES:
            case = make_case(b, s, h)
            scale = DQK ** -0.5
            flops = b * h * s * (s + 1) / 2 * 2 * (DQK + DV)
            tf = lambda t: flops / (t * 1e-6) / 1e12
            t_sdpa, o_sdpa, padded = run_sdpa(case, b, s, scale)
            t_sg, o_sg = run_sglang(sg_fwd, case, s, scale) if sg_fwd else (None, None)
            for v in variants:
                try:
                    t, o, cfg = run_ours(case, s, scale, v)
                except Exception as e:  # noqa: BLE001  (a tuning variant may not fit: report it)
                    print(json.dumps({"b": b, "s": s, "h": h, "variant": v, "failed": repr(e)[:200]}), flush=True)
                    continue
                row = {"b": b, "s": s, "h": h, "variant": v, "us": t, "tflops": tf(t),
                       "pct_gemm_peak": 100 * tf(t) / peak,
                       "sdpa_us": t_sdpa, "sdpa_tflops": tf(t_sdpa), "sdpa_v_padded": padded, "vs_sdpa": t_sdpa / t,
                       "rel_err_vs_sdpa": rel_err(o, o_sdpa), "cfg": cfg.__dict__}
                if t_sg is not None:
                    row.update(sglang_us=t_sg, sglang_tflops=tf(t_sg), vs_sglang=t_sg / t,
                               rel_err_vs_sglang=rel_err(o, o_sg))
                rows.append(row)
                print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
            del case
            torch.cuda.empty_cache()
        if not args.no_prefix:
            b, s, prefix = 1, 1024, 7168
            case = make_case(b, s, h, prefix=prefix)
            flops = b * h * s * (prefix + (s + 1) / 2) * 2 * (DQK + DV)
            base = None
            for chunk in (None, 4096, 2048):
                t, o, cfg = run_ours(case, s, DQK ** -0.5, {}, chunk=chunk)
                base = o if base is None else base
                row = {"b": b, "s": s, "prefix": prefix, "h": h, "chunk": chunk or b * (s + prefix), "us": t,
                       "tflops": flops / (t * 1e-6) / 1e12, "rel_err_vs_one_launch": rel_err(o, base)}
                rows.append(row)
                print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
            del case
            torch.cuda.empty_cache()
    print()
    print("| h | b x s | variant | µs | TFLOPS | % GEMM peak | SDPA flash µs (TFLOPS) | vs SDPA | SGLang µs "
          "| vs SGLang | rel err vs SDPA |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "prefix" in r:
            print(f"| {r['h']} | 1 x {r['s']} after {r['prefix']} | chunk {r['chunk']} | {r['us']:.1f} | "
                  f"{r['tflops']:.0f} | {100 * r['tflops'] / peak:.0f}% | - | - | - | - | "
                  f"{r['rel_err_vs_one_launch']:.1e} (vs one launch) |")
            continue
        sg = f"{r['sglang_us']:.1f} | {r['vs_sglang']:.2f}x" if "sglang_us" in r else "- | -"
        pad = ", v padded" if r["sdpa_v_padded"] else ""
        print(f"| {r['h']} | {r['b']} x {r['s']} | {json.dumps(r['variant'])} | {r['us']:.1f} | {r['tflops']:.0f} | "
              f"{r['pct_gemm_peak']:.0f}% | {r['sdpa_us']:.1f} ({r['sdpa_tflops']:.0f}{pad}) | {r['vs_sdpa']:.2f}x "
              f"| {sg} | {r['rel_err_vs_sdpa']:.1e} |")
    dest = args.json or (os.path.join(os.environ["OUT"], "bench_mla_prefill.json") if os.environ.get("OUT") else None)
    if dest:
        with open(dest, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
