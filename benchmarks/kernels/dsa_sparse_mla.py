"""DSA's sparse MLA side by side in one process, bf16, V3.2's top-2048: the SM90 CUDA op
(``sparse_config(cuda=True)``, custom_ops/mla_sparse_wgmma.cuh) against the Triton kernel on the same
inputs, and against the dense decode (the CUDA ``mla_decode`` op) over as many keys.

- decode rows (b = 1, 64, 128 at 128 heads; --heads adds counts): µs eager and in a CUDA graph,
  TFLOPS, and the gathered latent bytes over the measured copy rate (target: >= 85% of that bound);
  the dense decode over ``top-k`` keys a row (target: sparse never slower at b=1) and over the
  context;
- prefill rows (2048 and 4096 query rows of one request, each with its own top-k): TFLOPS (target
  >= 450).
Published anchors (no same-process kernel): FlashMLA's sparse decode 410 TFLOPS (FP8 cache, H800,
b=128, h=128, top-2048) and sparse prefill 640 TFLOPS (H800, bf16).

    python -m benchmarks.kernels.dsa_sparse_mla [--context 32768] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402

from benchmarks.harness.mla_cases import LORA, PAGE, SCALE, make_decode_case, run_cuda  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, graph_median_us, median_us  # noqa: E402
from paddle_mla.attention.dsa.sparse_mla import plan_splits, sparse_config, sparse_mla, sparse_mla_ref  # noqa: E402
from paddle_mla.attention.triton_mla import cuda_decode  # noqa: E402

ROW_BYTES = (LORA + 64) * 2


def _slots(tables, rows: int, topk: int, context: int, g, row_of=None):
    """Each query row's ``topk`` distinct positions of its request's ``context`` as cache slots."""
    pos = torch.stack([torch.randperm(context, device="cuda", generator=g)[:topk] for _ in range(rows)])
    req = torch.arange(rows, device="cuda") if row_of is None else row_of
    blocks = tables[req].to(torch.int64).gather(1, pos // PAGE)
    return (blocks * PAGE + pos % PAGE).contiguous()


def _sparse_runs(q, cache, slots, h: int, graph: bool, chunks=()) -> dict:
    """µs of the CUDA and Triton sparse MLA on one case (each at its own plan; ``chunks``: also the
    CUDA op at each of these forced chunk counts, as "cuda/N"), and their outputs."""
    rows = q.shape[0]
    q_lat, q_pe = q[..., :LORA].contiguous(), q[..., LORA:].contiguous()
    res = {}
    runs = [("cuda", sparse_config(h, cuda=True), 0), ("triton", sparse_config(h), 0)]
    runs += [(f"cuda/{c}", sparse_config(h, cuda=True), c) for c in chunks]
    for name, cfg, forced in runs:
        splits = plan_splits(rows, h, slots.shape[1], cfg, forced)[0]
        part_o = torch.empty(rows * h * splits * LORA, dtype=torch.float32, device="cuda")
        part_lse = torch.empty(rows * h * splits, dtype=torch.float32, device="cuda")
        out = torch.empty(rows, h, LORA, dtype=torch.bfloat16, device="cuda")
        fn = lambda: sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, cfg,  # noqa: E731
                                num_splits=forced)
        fn()
        res[name] = dict(us=median_us(fn), graph_us=graph_median_us(fn) if graph else None, splits=splits,
                         out=out.clone())
    return res


def _dense_us(b: int, h: int, context: int) -> float | None:
    """The CUDA dense decode of ``b`` rows of ``context`` keys in a CUDA graph: the decode alone, a
    layer's share (the engine plans once a step), as the sparse MLA's time has no plan either."""
    got = run_cuda(make_decode_case(b, h, context, seed=1), h)
    return None if got is None else got[2]


def decode_point(b: int, h: int, topk: int, context: int, bw: float, chunks=()) -> dict:
    g = torch.Generator(device="cuda").manual_seed(b + h)
    cache, tables, q, _ = make_decode_case(b, h, context)
    slots = _slots(tables, b, topk, context, g)
    runs = _sparse_runs(q, cache, slots, h, graph=True, chunks=chunks)
    ref = sparse_mla_ref(q[:2, :, :LORA], q[:2, :, LORA:], cache, slots[:2], SCALE)
    flops = b * h * topk * 2 * (LORA + 64 + LORA)
    bound_us = (b * topk * ROW_BYTES + b * h * (LORA + 64 + LORA) * 2) / bw * 1e6
    cu, tr = runs["cuda"], runs["triton"]
    return dict(kind="decode", b=b, h=h, topk=topk, context=context, cuda_us=cu["us"], cuda_graph_us=cu["graph_us"],
                cuda_splits=cu["splits"], triton_us=tr["us"], triton_graph_us=tr["graph_us"],
                vs_triton=tr["graph_us"] / cu["graph_us"], cuda_tflops=flops / (cu["graph_us"] * 1e-6) / 1e12,
                byte_bound_us=bound_us, of_byte_bound=bound_us / cu["graph_us"],
                dense_topk_graph_us=_dense_us(b, h, topk), dense_context_graph_us=_dense_us(b, h, context),
                max_err=float((cu["out"][:2].float() - ref).abs().max()),
                triton_max_err=float((tr["out"][:2].float() - ref).abs().max()),
                forced_chunks_graph_us={c: runs[f"cuda/{c}"]["graph_us"] for c in chunks})


def prefill_point(rows: int, h: int, topk: int, context: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    cache, tables, _, _ = make_decode_case(1, h, context)
    q = torch.randn(rows, h, LORA + 64, device="cuda", generator=g).to(torch.bfloat16)
    slots = _slots(tables, rows, topk, context, g, row_of=torch.zeros(rows, dtype=torch.int64, device="cuda"))
    runs = _sparse_runs(q, cache, slots, h, graph=False)
    ref = sparse_mla_ref(q[:2, :, :LORA], q[:2, :, LORA:], cache, slots[:2], SCALE)
    flops = rows * h * topk * 2 * (LORA + 64 + LORA)
    cu, tr = runs["cuda"], runs["triton"]
    return dict(kind="prefill", rows=rows, h=h, topk=topk, context=context, cuda_us=cu["us"], triton_us=tr["us"],
                vs_triton=tr["us"] / cu["us"], cuda_tflops=flops / (cu["us"] * 1e-6) / 1e12,
                triton_tflops=flops / (tr["us"] * 1e-6) / 1e12,
                max_err=float((cu["out"][:2].float() - ref).abs().max()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=32768, help="keys of each decode row's request")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--batches", default="1,64,128", help="decode rows")
    ap.add_argument("--heads", default="128", help="head counts, e.g. 128,64,16")
    ap.add_argument("--prefill-rows", default="2048,4096", help="prefill query rows ('' for none)")
    ap.add_argument("--chunks", default="", help="decode: also the CUDA op at these chunk counts, e.g. 1,2,4,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    why = cuda_decode.unavailable_reason(LORA, LORA + 64, torch.bfloat16, "cuda")
    if why:
        raise SystemExit(f"the CUDA sparse MLA cannot run here: {why}")
    bw = copy_bandwidth("cuda", 1 << 30)
    dev = torch.cuda.get_device_name()
    print(f"## Sparse MLA on {dev} (copy bandwidth {bw / 1e9:.0f} GB/s), top-{args.topk}", flush=True)
    rows = []
    for h in (int(x) for x in args.heads.split(",")):
        for b in (int(x) for x in args.batches.split(",")):
            r = decode_point(b, h, args.topk, args.context, bw, [int(c) for c in args.chunks.split(",") if c])
            rows.append(r)
            dense = r["dense_topk_graph_us"]
            print(f"- decode b={b} h={h}: CUDA {r['cuda_graph_us']:.1f} µs in a graph ({r['cuda_splits']} chunks, "
                  f"{r['cuda_tflops']:.0f} TFLOPS, {r['of_byte_bound']:.0%} of the byte bound "
                  f"{r['byte_bound_us']:.1f} µs), Triton {r['triton_graph_us']:.1f} µs ({r['vs_triton']:.2f}x); dense "
                  f"CUDA over {args.topk} keys {dense if dense is None else round(dense, 1)} µs, over "
                  f"{args.context} {r['dense_context_graph_us']:.1f} µs; max err {r['max_err']:.3g}", flush=True)
            if r["forced_chunks_graph_us"]:
                print("  forced chunks, graph µs: " + ", ".join(
                    f"{c}: {t:.1f}" for c, t in r["forced_chunks_graph_us"].items()), flush=True)
        for n in (int(x) for x in args.prefill_rows.split(",") if x):
            r = prefill_point(n, h, args.topk, max(args.topk * 4, 8192))
            rows.append(r)
            print(f"- prefill {n} rows h={h}: CUDA {r['cuda_us']:.0f} µs ({r['cuda_tflops']:.0f} TFLOPS), Triton "
                  f"{r['triton_us']:.0f} µs ({r['triton_tflops']:.0f} TFLOPS, {r['vs_triton']:.2f}x); max err "
                  f"{r['max_err']:.3g}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, copy_bw_gbs=bw / 1e9, points=rows), f, indent=1)


if __name__ == "__main__":
    main()
