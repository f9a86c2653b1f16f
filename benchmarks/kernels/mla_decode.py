"""Benchmark: paddle_mla's MLA decode (Triton, and the SM90 CUDA op) vs SGLang's Triton decode kernel and
FlashInfer's MLA decode, same process, same data.

bf16, d = kv_lora 512 + rope 64 = 576, dv = 512, 64-token pages in random block order. Times are
``triton.testing.do_bench`` medians (it flushes L2 between runs) of the per-layer kernels (stage 1 +
stage 2); the per-step plan kernel is timed separately. GB/s counts unique bytes (KV + Q + O);
TFLOPS = b*h*s*2*(576+512)/t. SGLang (``decode_attention_fwd``, grouped) is taken at its best over
split counts {1,2,4,...,64}, from ./third_party/sglang_decode (scripts/fetch_sglang_kernel.sh).
FlashInfer's MLA decode (``BatchMLAPagedAttentionWrapper``, its "fa3" Hopper kernel) is the CUDA op's
anchor, from ./third_party/flashinfer (scripts/fetch_flashinfer.sh; benchmarks/harness/flashinfer_mla.py).

  python -m benchmarks.kernels.mla_decode [--b 1,16,64,128] [--h 16,128] [--s 1024,4096,16384,32768]
      [--variants "block_n=32;block_n=64,num_stages=3"] [--json out.json]
  python -m benchmarks.kernels.mla_decode --preset variants    (the register/split variants against today's
                                                                config and SGLang, < 4 min)
  python -m benchmarks.kernels.mla_decode --preset b1          (h=16 pipeline depth / merge variants)
  python -m benchmarks.kernels.mla_decode --preset targets     (the decode target points; split caps at b=1)
  python -m benchmarks.kernels.mla_decode --preset cuda        (the SM90 CUDA op at its target points)
Writes JSON to $OUT/bench_mla_decode.json when OUT is set. Every variant gets its own row (µs, graph
µs, TB/s, TFLOPS, registers/spills, workspace MiB, ratio to the default config and to SGLang). The default
config is the backend's Triton one; where the ``mla_decode`` CUDA op can run (SM90, built with
CUDA), it is timed on the same case as well (its own plan and config, ``cuda_decode.CudaDecode``),
with its graph µs, TFLOPS, % of copy bandwidth and speedups over ours-Triton and SGLang. The default
config is the backend's: ``decode_config(h, small_batch=True)`` at b <= decode.SMALL_BATCH (variants apply on
top; ``small_batch=0`` selects the large-batch config), with the backend's split cap
(``decode.split_cap``; the variant key ``max_splits=N`` sets another).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

from paddle_mla.platform import runtime

runtime.select("torch")  # triton.testing and CUDA events: the benchmark runs on PyTorch

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.harness import anchors, flashinfer_mla  # noqa: E402
from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.mla_cases import D, LORA, PAGE, SCALE, make_decode_case, parse_variants, run_cuda  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, median_us  # noqa: E402
from paddle_mla.attention.triton_mla import decode  # noqa: E402

SG_SPLITS = (1, 2, 4, 8, 16, 32, 64)
# (heads, batches, contexts, variants): today's config (always first), each variant and
# SGLang in one process; docs/triton_decode_notes.md says what each variant is
PRESETS = {
    # the spill-free / low-spill h=128 configs of the offline sm_90 compile (benchmarks.profile.decode_registers_sm90)
    "variants": [
        ("128", "64,128", "4096",
         "dv_split=2;block_h=32;block_h=32,dv_split=2;dv_split=4,block_n=32,num_stages=3;"
         "block_h=32,block_n=32,num_stages=3"),
        ("128", "128", "16384", "dv_split=2;block_h=32;block_h=32,dv_split=2;dv_split=4,block_n=32,num_stages=3"),
        ("16", "1,128", "4096", "dv_split=2;dv_split=4,waves=3;num_warps=8"),
    ],
    # h=16: deeper cp.async pipelines (num_stages 5 -> 2 KV tiles in flight per program, 8 with
    # block_n 16 -> 3; today's 3 stages keep one), the split merge in one step (merge_splits) and
    # stage 2 launched early through programmatic dependent launch (pdl)
    # the decode target points today: b=1 (and b=4) with the backend's split cap (decode_plan.split_cap:
    # min(programs, 64) + 1) against the old caps 32 (the engine's before) and none
    # (512: programs + 1, the default of 2279a37), and fewer, longer splits (min_tiles=2); b >= 64 at
    # the default only (the cap does not bind there)
    "targets": [
        ("16", "1", "1024,4096,16384,32768", "max_splits=32;max_splits=512;min_tiles=2"),
        ("16", "4", "4096,16384", "max_splits=32;max_splits=512"),
        ("128", "1", "4096,16384", "max_splits=32;max_splits=512"),
        ("16,128", "64,128", "4096,16384", ""),
    ],
    # the CUDA op's target points: h=128 b>=64 -> TFLOPS; h=16 b>=64 -> % of copy; b=1 -> graph µs
    "cuda": [
        ("128", "64,128", "4096,16384", ""),
        ("16", "64,128", "4096", ""),
        ("16,128", "1", "4096", ""),
    ],
    "b1": [
        ("16", "1,16,64,128", "1024,4096,16384",
         "small_batch=0;num_stages=5;num_stages=5,merge_splits=64;num_stages=5,merge_splits=64,pdl=1;"
         "num_stages=8,block_n=16;num_stages=5,num_warps=8,waves=1"),
    ],
}


def run_ours(case, h, cfg_override):
    cache, tables, q, lens = case
    b = q.shape[0]
    # the backend's choice: batches of <= SMALL_BATCH rows run the small-batch config (variants apply on top)
    over = {"small_batch": b <= decode.SMALL_BATCH, **cfg_override}
    max_splits = over.pop("max_splits", 0)   # a workspace setting, not a launch one: the backend's cap unless given
    cfg = decode.decode_config(h, **over)
    ws = decode.alloc_decode_workspace(b, h, LORA, max_splits or decode.split_cap(cfg.programs), "cuda",
                                       programs=cfg.programs)
    out = torch.empty(b, h, LORA, dtype=torch.bfloat16, device="cuda")
    decode.build_decode_plan(lens, b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    t_plan = median_us(lambda: decode.build_decode_plan(lens, b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles))
    fn = lambda: decode.mla_decode(q, cache, tables, lens, out, ws, LORA, SCALE, cfg)
    handle = fn()
    splits = ws.num_kv_splits[:b].float().mean().item()
    regs = (getattr(handle, "n_regs", None), getattr(handle, "n_spills", None))
    t = median_us(fn)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()  # how the engine runs decode: one replay per step
    with torch.cuda.graph(graph):
        fn()
    t_graph = median_us(graph.replay)
    return t, t_plan, out.clone(), splits, cfg, regs, t_graph, ws.nbytes


def run_flashinfer(fi, case, h):
    """FlashInfer's MLA decode on the case: (µs, graph µs of its run, out, backend); its plan is
    host-side, once a step, so neither time holds it."""
    from benchmarks.harness.flashinfer_mla import FlashInferMla

    anchor = FlashInferMla(fi, case, h, SCALE)
    anchor.run()
    t = median_us(anchor.run)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        anchor.run()
    return t, median_us(graph.replay), anchor.out.clone(), anchor.backend


def run_sglang(sg_fwd, case, h):
    cache, tables, q, _ = case
    b, s = q.shape[0], tables.shape[1] * PAGE
    tok = torch.arange(s, device="cuda")
    kv_indices = (tables[:, tok // PAGE].to(torch.int64) * PAGE + tok % PAGE).to(torch.int32).flatten()
    kv_indptr = torch.arange(b + 1, device="cuda", dtype=torch.int32) * s
    kbuf = cache.view(-1, 1, D)
    vbuf = kbuf[..., :LORA]
    o = torch.empty(b, h, LORA, dtype=torch.bfloat16, device="cuda")
    best = (float("inf"), None, None)
    for ns in SG_SPLITS:
        if ns > 1 and s // ns < 64:
            continue
        logits = torch.empty(b, h, ns, LORA, dtype=torch.float32, device="cuda")
        lse = torch.empty(b, h, ns, dtype=torch.float32, device="cuda")
        nsplit = torch.full((b,), ns, dtype=torch.int32, device="cuda")

        def fn(logits=logits, lse=lse, nsplit=nsplit, ns=ns):
            sg_fwd(q, kbuf, vbuf, o, kv_indptr, kv_indices, logits, lse, nsplit, ns, SCALE)

        t = median_us(fn)
        if t < best[0]:
            best = (t, ns, o.clone())
    return best


def run_case(b, h, s, variants, sg_fwd, copy_gbs, cuda_variants=(), fi=None):
    """Every variant (the default first) and SGLang on one case: (summary row, per-variant rows)."""
    case = make_decode_case(b, h, s)
    uniq = b * s * D * 2 + b * h * D * 2 + b * h * LORA * 2
    flops = b * h * s * 2 * (D + LORA)
    res, failed = [], {}
    for v in variants:
        try:
            res.append((*run_ours(case, h, v), v))
        except Exception as e:  # noqa: BLE001  (a tuning variant may not fit: report it)
            failed[json.dumps(v)] = repr(e)[:200]
    if not res or res[0][8] != {}:  # the default config failed: nothing to report
        print(json.dumps({"b": b, "h": h, "s": s, "failed": failed}), flush=True)
        return None, []
    best = min(res, key=lambda r: r[0])
    t, t_plan, out, splits, cfg, regs, t_graph, ws_bytes, _ = res[0]
    row = {"b": b, "h": h, "s": s, "us": t, "gbs": uniq / (t * 1e-6) / 1e9,
           "tflops": flops / (t * 1e-6) / 1e12, "plan_us": t_plan, "mean_splits": splits,
           "cfg": cfg.__dict__, "regs_spills": regs, "graph_us": t_graph, "ws_mib": ws_bytes / 2**20,
           "best_us": best[0], "best_variant": best[8],
           "variants": {json.dumps(r[8]): [round(r[0], 2), r[5]] for r in res}, "failed": failed}
    osg = None
    if sg_fwd is not None and b * s * D >= 2**31:
        row["sg_note"] = "SGLang's int32 KV offsets overflow at this size (illegal address)"
    elif sg_fwd is not None:
        ts, ns, osg = run_sglang(sg_fwd, case, h)
        row.update(sg_us=ts, sg_splits=ns, speedup=ts / t, rel_err_vs_sg=rel_err(out, osg))
    cuda = run_cuda(case, h)
    if cuda is not None:
        tc, tcg, tcl, oc = cuda
        row.update(cuda_us=tc, cuda_graph_us=tcg, cuda_graph_layer_us=tcl, cuda_tflops=flops / (tc * 1e-6) / 1e12,
                   cuda_pct_copy=100 * uniq / (tc * 1e-6) / 1e9 / copy_gbs, cuda_vs_triton=t / tc,
                   cuda_rel_err_vs_triton=rel_err(oc, out))
        if osg is not None:
            row.update(cuda_vs_sglang=row["sg_us"] / tc, cuda_rel_err_vs_sg=rel_err(oc, osg))
        if fi is not None:
            try:
                tf, tfg, of, backend = run_flashinfer(fi, case, h)
                row.update(fi_us=tf, fi_graph_us=tfg, fi_backend=backend, cuda_vs_fi=tf / tc,
                           cuda_graph_vs_fi=tfg / tcl, cuda_rel_err_vs_fi=rel_err(oc, of))
            except Exception as e:  # noqa: BLE001  (the anchor's failure is reported, not fatal)
                row["fi_error"] = repr(e)[:300]
        row["cuda_variants"] = {}
        for v in cuda_variants:   # launch-config variants of the CUDA op, beside its default
            try:
                tv, tvg, tvl, ov = run_cuda(case, h, v)
                row["cuda_variants"][json.dumps(v)] = [round(tv, 2), round(tvg, 2), round(tvl, 2), rel_err(ov, out)]
            except Exception as e:  # noqa: BLE001  (a variant may not exist for this head count)
                row["cuda_variants"][json.dumps(v)] = repr(e)[:160]
    vrows = []
    for r in res:
        vt = r[0]
        vr = {"b": b, "h": h, "s": s, "variant": r[8], "us": vt, "graph_us": r[6], "tbs": uniq / (vt * 1e-6) / 1e12,
              "pct_copy": 100 * uniq / (vt * 1e-6) / 1e9 / copy_gbs, "tflops": flops / (vt * 1e-6) / 1e12,
              "regs_spills": r[5], "mean_splits": r[3], "ws_mib": r[7] / 2**20, "vs_default": t / vt,
              "rel_err_vs_default": rel_err(r[2], out)}
        if osg is not None:
            vr.update(vs_sglang=row["sg_us"] / vt, rel_err_vs_sg=rel_err(r[2], osg))
        vrows.append(vr)
        print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in vr.items()}), flush=True)
    print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
    return row, vrows


def print_tables(rows, vrows, copy_gbs):
    print()
    print("| b | h | s | µs | graph µs | GB/s | % copy | TFLOPS | splits | SGLang µs (splits) | speedup | rel err "
          "| best variant µs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "sg_us" in r:
            sg = f"{r['sg_us']:.1f} ({r['sg_splits']}) | {r['speedup']:.2f}x | {r['rel_err_vs_sg']:.1e}"
        else:
            sg = ("int32 overflow" if "sg_note" in r else "missing") + " | - | -"
        print(f"| {r['b']} | {r['h']} | {r['s']} | {r['us']:.1f} | {r['graph_us']:.1f} | {r['gbs']:.0f} | "
              f"{100 * r['gbs'] / copy_gbs:.0f}% | {r['tflops']:.0f} | {r['mean_splits']:.1f} | {sg} | "
              f"{r['best_us']:.1f} {json.dumps(r['best_variant']) if r['best_variant'] else ''} |")
    cuda_rows = [r for r in rows if "cuda_us" in r]
    if cuda_rows:
        print()
        print("CUDA op (SM90) beside ours-Triton, SGLang and FlashInfer (speedups > 1: the CUDA op is faster; "
              "graph: plan + decode / the decode alone, a layer's share):")
        print("| b | h | s | CUDA µs | CUDA graph µs | TFLOPS | % copy | Triton µs | vs Triton | SGLang µs | vs SGLang "
              "| FlashInfer µs (graph) | vs FlashInfer (graph) | rel err vs Triton / SGLang / FlashInfer |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in cuda_rows:
            sg = (f"{r['sg_us']:.1f} | {r['cuda_vs_sglang']:.2f}x" if "cuda_vs_sglang" in r else "- | -")
            fi = (f"{r['fi_us']:.1f} ({r['fi_graph_us']:.1f}) | {r['cuda_vs_fi']:.2f}x ({r['cuda_graph_vs_fi']:.2f}x)"
                  if "fi_us" in r else "- | -")
            errs = " / ".join(f"{r[k]:.1e}" if k in r else "-" for k in
                              ("cuda_rel_err_vs_triton", "cuda_rel_err_vs_sg", "cuda_rel_err_vs_fi"))
            print(f"| {r['b']} | {r['h']} | {r['s']} | {r['cuda_us']:.1f} | {r['cuda_graph_us']:.1f} / "
                  f"{r['cuda_graph_layer_us']:.1f} | {r['cuda_tflops']:.0f} | {r['cuda_pct_copy']:.0f}% | "
                  f"{r['us']:.1f} | "
                  f"{r['cuda_vs_triton']:.2f}x | {sg} | {fi} | {errs} |")
        for r in cuda_rows:
            if r.get("fi_error"):
                print(f"FlashInfer failed at b={r['b']} h={r['h']} s={r['s']}: {r['fi_error']}")
            if r.get("cuda_variants"):
                print(f"CUDA variants b={r['b']} h={r['h']} s={r['s']} [µs, graph µs, graph µs of the decode alone, "
                      f"rel err vs Triton]: {json.dumps(r['cuda_variants'])}")
    print()
    print("Per variant ({} = today's config; vs default / vs SGLang > 1 means faster):")
    print("| b | h | s | variant | µs | graph µs | TB/s | % copy | TFLOPS | regs, spills | splits | workspace MiB "
          "| vs default | vs SGLang | rel err vs SGLang |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in vrows:
        sg = (f"{r['vs_sglang']:.2f}x | {r['rel_err_vs_sg']:.1e}" if "vs_sglang" in r
              else f"- | (vs default {r['rel_err_vs_default']:.1e})")
        print(f"| {r['b']} | {r['h']} | {r['s']} | {json.dumps(r['variant'])} | {r['us']:.1f} | {r['graph_us']:.1f} | "
              f"{r['tbs']:.2f} | {r['pct_copy']:.0f}% | {r['tflops']:.0f} | {r['regs_spills']} | "
              f"{r['mean_splits']:.1f} "
              f"| {r['ws_mib']:.1f} | {r['vs_default']:.2f}x | {sg} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", default="1,16,64,128")
    ap.add_argument("--h", default="16,128")
    ap.add_argument("--s", default="1024,4096,16384,32768")
    ap.add_argument("--variants", default="", help="';'-separated decode_config overrides, timed besides the default")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="named sets of (h, b, s, variants) instead of --h/--b/--s/--variants")
    ap.add_argument("--no-sglang", action="store_true")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer's MLA decode (the CUDA op's anchor)")
    ap.add_argument("--cuda-variants", default="", help="';'-separated CUDA op launch_config overrides")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ints = lambda x: [int(v) for v in x.split(",") if v]
    groups = PRESETS[args.preset] if args.preset else [(args.h, args.b, args.s, args.variants)]
    sg_fwd, sg_src = (None, "skipped") if args.no_sglang else anchors.load(anchors.SGLANG_DECODE)
    fi, fi_src = (None, "skipped") if args.no_flashinfer else flashinfer_mla.load()
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth() / 1e9
    meta = {"gpu": props.name, "sms": props.multi_processor_count, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "triton": triton.__version__, "copy_gbs": copy_gbs, "sglang": sg_src,
            "flashinfer": fi_src,
            "command": " ".join(sys.argv)}
    print(f"# {props.name}, {meta['date']}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"# device copy bandwidth (read+write): {copy_gbs:.0f} GB/s; SGLang: {sg_src}; FlashInfer: {fi_src}")
    t_start = time.time()
    rows, vrows = [], []
    for hs, bs_, ss, vtext in groups:
        variants = parse_variants(vtext)
        for h in ints(hs):
            for b in ints(bs_):
                for s in ints(ss):
                    if b * s * D * 2 > 12e9:
                        continue
                    row, vr = run_case(b, h, s, variants, sg_fwd, copy_gbs, parse_variants(args.cuda_variants)[1:], fi)
                    if row is not None:
                        rows.append(row)
                        vrows.extend(vr)
                    torch.cuda.empty_cache()
                    print(f"# b={b} h={h} s={s} done at {time.time() - t_start:.0f} s", flush=True)
    print_tables(rows, vrows, copy_gbs)
    dest = args.json or (os.path.join(os.environ["OUT"], "bench_mla_decode.json") if os.environ.get("OUT") else None)
    if dest:
        with open(dest, "w") as f:
            json.dump({"meta": meta, "rows": rows, "variant_rows": vrows}, f, indent=1)


if __name__ == "__main__":
    main()
