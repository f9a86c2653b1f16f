"""Benchmark: the ``append_attention`` CUDA op (GQA, paged head-major K/V) on the GPU, same process.

Decode (one new token per request, the op's split-KV path with ``decode_only``): achieved bandwidth
(unique bytes: K + V of the context, q, the new k/v, out) against the measured device copy
bandwidth (the default register-O tensor-core decode; its 3-stage variant, the WMMA kernel and the
CUDA-core kernel in the last columns), and time against SGLang's Triton GQA decode kernel
``decode_attention_fwd`` (grouped) on
the same values in its token-major layout, at its best over split counts. SGLang's file comes only
from the git-ignored ./third_party/sglang_decode (scripts/fetch_sglang_kernel.sh). Our time includes
the op's RoPE and cache write of the step's token; SGLang's does not. The "deterministic" column is
the same step under ``deterministic: true`` (``batch_invariant``, keys in the engine's fixed segments:
``deterministic_split_tokens(s)``), and its ratio to the default decode: the mode's attention cost.
Prefill: one request of S new tokens, causal, against ``scaled_dot_product_attention`` with the
flash backend on the same (non-paged) data, K/V expanded to the query heads outside the timing.

  python -m benchmarks.kernels.gqa_attention [--b 32,64] [--s 8192,16384] [--group 4,8]
      [--prefill 8192] [--json out.json]
  ncu of one case: ncu -k regex:decode_mma --launch-skip 1 --launch-count 1 ...
      python -m benchmarks.kernels.gqa_attention --ncu decode --b 32 --s 8192 --group 4
      (--ncu prefill --prefill 8192 --group 4: regex:prefill_tc)
Targets: decode >= 85% of copy bandwidth and >= 1.2x SGLang; prefill >= 0.8x SDPA flash.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA events, triton.testing and SDPA: the benchmark runs on PyTorch

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.harness import anchors  # noqa: E402
from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, median_us  # noqa: E402
from paddle_mla.attention.backend import deterministic_split_tokens  # noqa: E402
from paddle_mla.ops import append_attention as op  # noqa: E402

HKV, D, PAGE = 8, 128, 64
SG_SPLITS = (1, 2, 4, 8, 16, 32)
VARIANTS = (("mma3_graph_us", "PADDLE_MLA_GQA_TC_STAGES=3"), ("wmma_graph_us", "PADDLE_MLA_GQA_TC_KERNEL=wmma"),
            ("cudacore_graph_us", "PADDLE_MLA_GQA_TC=0"))


def rope_table(n, rot):
    inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, device="cuda", dtype=torch.float32) / rot)
    ang = torch.arange(n, device="cuda", dtype=torch.float32)[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.sin()], -1).contiguous()


def decode_case(b, s, group, sg_fwd, ncu=False):
    """b requests with s - 1 cached tokens each and one new token, 64-token pages in random order."""
    hq, pages = HKV * group, -(-s // PAGE)
    g = torch.Generator(device="cuda").manual_seed(0)
    nb = b * pages
    kc = torch.randn(HKV, nb, PAGE, D, device="cuda", generator=g).to(torch.bfloat16)
    vc = torch.randn(HKV, nb, PAGE, D, device="cuda", generator=g).to(torch.bfloat16)
    tables = torch.randperm(nb, device="cuda", generator=g).to(torch.int32).view(b, pages)
    q = torch.randn(b, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(b, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(b, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    cu = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    ids = torch.arange(b, dtype=torch.int32, device="cuda")
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    pos = torch.full((b,), s - 1, dtype=torch.int64, device="cuda")
    cs = rope_table(s, D)
    out = torch.empty_like(q)
    ws = torch.empty(op.workspace_numel(b, hq, D), dtype=torch.float32, device="cuda")
    scale = D ** -0.5
    fn = lambda: op.append_attention(q, k, v, kc, vc, tables, cu, lens, ids, pos, cs, out,  # noqa: E731
                                     softmax_scale=scale, neox=True, rot_dim=D, workspace=ws, decode_only=True)
    fn()
    if ncu:   # one more call for the profiler (ncu --launch-skip 1), nothing timed
        fn()
        torch.cuda.synchronize()
        return {}
    t = median_us(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    t_graph = median_us(graph.replay)
    nbytes = 2 * b * s * HKV * D * 2 + 2 * b * hq * D * 2 + 2 * b * HKV * D * 2
    row = {"b": b, "s": s, "group": group, "us": t, "graph_us": t_graph, "gbs": nbytes / (t_graph * 1e-6) / 1e9}
    # The deterministic mode on the same data, as the engine runs it with max_model_len s: fixed key
    # segments (none when one holds the row), the dims-split block, then the merge.
    split = deterministic_split_tokens(s)
    inv = lambda: op.append_attention(q, k, v, kc, vc, tables, cu, lens, ids, pos, cs, out,  # noqa: E731
                                      softmax_scale=scale, neox=True, rot_dim=D, workspace=ws, decode_only=True,
                                      batch_invariant=True, invariant_split=split if s > split else 0)
    inv()
    inv_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(inv_graph):
        inv()
    row["invariant_graph_us"] = median_us(inv_graph.replay)
    # The other decode kernels on the same data (the op reads these variables per call): the register-O
    # kernel with 3 stages, the WMMA tensor-core kernel, and the CUDA-core kernel.
    for key, env in VARIANTS:
        name, value = env.split("=")
        os.environ[name] = value
        try:
            fn()
            variant = torch.cuda.CUDAGraph()
            with torch.cuda.graph(variant):
                fn()
            row[key] = median_us(variant.replay)
        finally:
            del os.environ[name]
    if sg_fwd is None:
        return row
    # SGLang on the same values: token-major buffers [slots, Hkv, D], one slot per token, roped q as ours sees it
    kbuf = kc.permute(1, 2, 0, 3).reshape(nb * PAGE, HKV, D).contiguous()
    vbuf = vc.permute(1, 2, 0, 3).reshape(nb * PAGE, HKV, D).contiguous()
    tok = torch.arange(s, device="cuda")
    kv_indices = (tables[:, tok // PAGE].to(torch.int64) * PAGE + tok % PAGE).to(torch.int32).flatten()
    kv_indptr = torch.arange(b + 1, device="cuda", dtype=torch.int32) * s
    qr = rope_q(q, cs[s - 1])
    o = torch.empty_like(q)
    best = (float("inf"), None)
    for ns in SG_SPLITS:
        logits = torch.empty(b, hq, ns, D, dtype=torch.float32, device="cuda")
        lse = torch.empty(b, hq, ns, dtype=torch.float32, device="cuda")
        nsplit = torch.full((b,), ns, dtype=torch.int32, device="cuda")
        sg = lambda: sg_fwd(qr, kbuf, vbuf, o, kv_indptr, kv_indices, logits, lse, nsplit, ns, scale)  # noqa: E731
        t_sg = median_us(sg)
        if t_sg < best[0]:
            best = (t_sg, ns)
    row.update(sglang_us=best[0], sglang_splits=best[1], speedup=best[0] / t_graph, rel_err=rel_err(out, o))
    return row


def rope_q(q, cs_row):
    """q roped at one position (neox, full rotary) in fp32, back to bf16: what the op's kernel sees."""
    half = D // 2
    c, s = cs_row[:half], cs_row[half:]
    x = q.float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(q.dtype)


def prefill_case(s, group, ncu=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hq, pages = HKV * group, -(-s // PAGE)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(s, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(s, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(s, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    kc = torch.zeros(HKV, pages, PAGE, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    tables = torch.arange(pages, dtype=torch.int32, device="cuda").view(1, pages)
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    lens = torch.tensor([s], dtype=torch.int32, device="cuda")
    ids = torch.zeros(s, dtype=torch.int32, device="cuda")
    pos = torch.arange(s, dtype=torch.int64, device="cuda")
    cs = rope_table(s, D)
    cs[:, : D // 2], cs[:, D // 2:] = 1.0, 0.0   # identity rope: SDPA sees the same q and k
    out = torch.empty_like(q)
    ws = torch.empty(op.workspace_numel(1, hq, D), dtype=torch.float32, device="cuda")
    fn = lambda: op.append_attention(q, k, v, kc, vc, tables, cu, lens, ids, pos, cs, out,  # noqa: E731
                                     softmax_scale=D ** -0.5, neox=True, rot_dim=D, workspace=ws)
    if ncu:
        fn()
        fn()
        torch.cuda.synchronize()
        return {}
    t = median_us(fn)
    qs = q.transpose(0, 1).unsqueeze(0)
    ks = k.repeat_interleave(group, 1).transpose(0, 1).unsqueeze(0).contiguous()
    vs = v.repeat_interleave(group, 1).transpose(0, 1).unsqueeze(0).contiguous()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        t_sdpa = median_us(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
    flops = 4 * hq * D * s * (s + 1) / 2
    return {"s": s, "group": group, "us": t, "sdpa_us": t_sdpa,
            "tflops": flops / (t * 1e-6) / 1e12,
            "sdpa_tflops": flops / (t_sdpa * 1e-6) / 1e12, "ratio": t_sdpa / t,
            "rel_err": rel_err(out, ref[0].transpose(0, 1))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", default="32,64")
    ap.add_argument("--s", default="8192,16384")
    ap.add_argument("--group", default="4,8")
    ap.add_argument("--prefill", default="8192")
    ap.add_argument("--no-sglang", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--ncu", choices=("decode", "prefill"), default=None,
                    help="two untimed calls of the first case (for ncu --launch-skip 1 --launch-count 1)")
    args = ap.parse_args()
    ints = lambda x: [int(v) for v in x.split(",") if v]  # noqa: E731
    assert op.implementation(on_gpu=True) == "custom_op", "the CUDA append_attention op did not build"
    if args.ncu == "decode":
        decode_case(ints(args.b)[0], ints(args.s)[0], ints(args.group)[0], None, ncu=True)
        return
    if args.ncu == "prefill":
        prefill_case(ints(args.prefill)[0], ints(args.group)[0], ncu=True)
        return
    sg_fwd, sg_src = (None, "skipped") if args.no_sglang else anchors.load(anchors.SGLANG_DECODE)
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth() / 1e9
    meta = {"gpu": props.name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "copy_gbs": copy_gbs, "sglang": sg_src, "command": " ".join(sys.argv)}
    print(f"# {props.name}, {meta['date']}, torch {torch.__version__}; copy bandwidth {copy_gbs:.0f} GB/s; "
          f"SGLang: {sg_src}")
    print("\n## decode (bf16, 8 KV heads, head_dim 128, 64-token pages)\n")
    print("| b | s | group | µs | graph µs | GB/s | % copy | SGLang µs (splits) | speedup | rel err "
          "| graph µs: 3 stages | WMMA | CUDA-core | deterministic µs (x default) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    decode_rows = []
    for b in ints(args.b):
        for s in ints(args.s):
            for group in ints(args.group):
                r = decode_case(b, s, group, sg_fwd)
                decode_rows.append(r)
                sg = f"{r['sglang_us']:.0f} ({r['sglang_splits']}) | {r['speedup']:.2f}x | {r['rel_err']:.1e}" \
                    if "sglang_us" in r else "- | - | -"
                print(f"| {b} | {s} | {group} | {r['us']:.0f} | {r['graph_us']:.0f} | {r['gbs']:.0f} | "
                      f"{100 * r['gbs'] / copy_gbs:.0f}% | {sg} | {r['mma3_graph_us']:.0f} | "
                      f"{r['wmma_graph_us']:.0f} | {r['cudacore_graph_us']:.0f} | {r['invariant_graph_us']:.0f} "
                      f"({r['invariant_graph_us'] / r['graph_us']:.2f}x) |", flush=True)
    print("\n## prefill (bf16, causal, one request)\n")
    print("| s | group | µs | TFLOPS | SDPA flash µs | SDPA TFLOPS | ours / SDPA speed | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    prefill_rows = []
    for s in ints(args.prefill):
        for group in ints(args.group):
            r = prefill_case(s, group)
            prefill_rows.append(r)
            print(f"| {s} | {group} | {r['us']:.0f} | {r['tflops']:.0f} | {r['sdpa_us']:.0f} | "
                  f"{r['sdpa_tflops']:.0f} | {r['ratio']:.2f}x | {r['rel_err']:.1e} |", flush=True)
    path = args.json or (os.path.join(os.environ["OUT"], "bench_gqa_attention.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"meta": meta, "decode": decode_rows, "prefill": prefill_rows}, f, indent=1)


if __name__ == "__main__":
    main()
