"""DSA (DeepSeek-V3.2 sparse attention) benchmarks on the GPU (PyTorch runtime), against their targets:

1. ``[ks, ke)``: the one-launch Triton kernel vs the per-token Python loop (+ upload) it replaces,
   at 32k prefill tokens (target >= 100x);
2. sparse MLA decode (b=64, h=128, top-k 2048, context 32k) vs triton_mla dense decode at the same
   context (target >= 6x);
3. indexer decode score + top-k at 32k context (64 heads x 128): key bytes read / time vs the copy
   bandwidth (target >= 70%);
4. end to end (``--e2e``): decode step of a V3.2-dims 4-layer model (dsa) vs the dense V3-dims
   model (triton_mla), batch 64, CUDA graphs on both (``--no-graphs``: off on both) (target <= 0.5x).
``--indexer-ab`` times only item 3, today's top-k against its variants (relaxed append atomic, short
select, both), interleaved, min of 5, and prints a table (about 20 s after compiling on an H100).
``--sweep`` adds kernel config variants (sparse MLA heads/tile/warps/stages/splits, score tile,
top-k block), each with its time.
Anchor: FlashMLA sparse decode, 410 TFLOPS on H800 (FP8, b=128, h=128, top-k 2048).

    python -m benchmarks.kernels.dsa [--quick] [--e2e] [--json out.json]
    python -m benchmarks.kernels.dsa --e2e-only --e2e-batches 1,16,64      (the decode steps only)
``--cpu-smoke`` (with TRITON_INTERPRET=1) runs every path once at toy shapes on the CPU: a check of
the script itself, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402

from benchmarks.harness.mla_cases import SCALE  # noqa: E402
from benchmarks.harness.models import V3_STEP_MODELS, time_steps, v3_step_runner  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, median_us  # noqa: E402
from paddle_mla.attention.dsa.index_kernels import index_scores  # noqa: E402
from paddle_mla.attention.dsa.key_window import KeyWindows  # noqa: E402
from paddle_mla.attention.dsa.reference import key_window_ref  # noqa: E402
from paddle_mla.attention.dsa.sparse_mla import sparse_config, sparse_mla, sparse_mla_ref  # noqa: E402
from paddle_mla.attention.dsa.topk_select import topk_scratch_shape, topk_select  # noqa: E402
from paddle_mla.attention.triton_mla import decode  # noqa: E402

LORA, ROPE, PAGE = 512, 64, 64
DEV = "cuda"
DTYPE = torch.bfloat16


def bench(fn) -> float:
    return median_us(fn, cpu=DEV == "cpu")   # --cpu-smoke: run once


def sync() -> None:
    if DEV != "cpu":
        torch.cuda.synchronize()


def bench_key_windows(total_tokens: int) -> dict:
    reqs = 8
    num_new = np.full(reqs, total_tokens // reqs, np.int32)
    num_cached = (np.arange(reqs) * 1000).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(num_new + num_cached)]).astype(np.int32)
    cu_q = np.concatenate([[0], np.cumsum(num_new)]).astype(np.int32)
    dev = lambda a: torch.from_numpy(a).to(DEV)   # noqa: E731
    cu_q_d, cu_k_d, cached_d = dev(cu_q), dev(cu_k), dev(num_cached)
    kw = KeyWindows(total_tokens, DEV)
    t_kernel = bench(lambda: kw.compute(cu_q_d, cu_k_d, cached_d, None, total_tokens))

    def loop():
        ks, ke = key_window_ref(cu_k, num_cached, num_new)
        torch.from_numpy(ks).to(DEV), torch.from_numpy(ke).to(DEV)

    loop()
    sync()
    t0 = time.perf_counter()
    for _ in range(3):
        loop()
    sync()
    t_loop = (time.perf_counter() - t0) / 3 * 1e6
    ks, ke = key_window_ref(cu_k, num_cached, num_new)
    assert np.array_equal(kw.ks[:total_tokens].cpu().numpy(), ks) and np.array_equal(kw.ke.cpu().numpy(), ke)
    return dict(tokens=total_tokens, kernel_us=t_kernel, loop_us=t_loop, speedup=t_loop / t_kernel)


def _paged(b: int, s: int, d: int, g):
    pages = s // PAGE
    cache = torch.randn(b * pages, PAGE, 1, d, device=DEV, generator=g).to(DTYPE)
    tables = torch.randperm(b * pages, device=DEV, generator=g).to(torch.int32).view(b, pages)
    return cache, tables


SPARSE_SWEEP = [dict(block_h=16, block_n=32, num_warps=4, num_stages=1),
                dict(block_h=32, block_n=32, num_warps=4, num_stages=2),
                dict(block_h=32, block_n=64, num_warps=8, num_stages=2),
                dict(block_h=64, block_n=32, num_warps=8, num_stages=2),
                dict(block_h=64, block_n=64, num_warps=8, num_stages=1),
                dict(block_h=64, block_n=64, num_warps=8, num_stages=3),
                dict(block_h=64, block_n=64, num_warps=4, num_stages=2)]


def bench_sparse_decode(b: int, h: int, topk: int, s: int, sweep: bool) -> dict:
    g = torch.Generator(device=DEV).manual_seed(0)
    cache, tables = _paged(b, s, LORA + ROPE, g)
    pos = torch.stack([torch.randperm(s, device=DEV, generator=g)[:topk] for _ in range(b)])
    slots = (tables.to(torch.int64).gather(1, pos // PAGE) * PAGE + pos % PAGE).contiguous()
    q = torch.randn(b, h, LORA + ROPE, device=DEV, generator=g).to(DTYPE)
    q_lat, q_pe = q[..., :LORA].contiguous(), q[..., LORA:].contiguous()
    part_o = torch.empty(b, h, 16, LORA, dtype=torch.float32, device=DEV)
    part_lse = torch.empty(b, h, 16, dtype=torch.float32, device=DEV)
    out = torch.empty(b, h, LORA, dtype=DTYPE, device=DEV)
    flops = b * h * topk * 2 * (LORA + ROPE + LORA)
    cfg = sparse_config(h)
    t_sparse = bench(lambda: sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, cfg))
    variants = []
    if sweep:   # each variant at its automatic split count and at 4 / 8 / 16 splits
        want = sparse_mla_ref(q_lat[:4], q_pe[:4], cache, slots[:4], SCALE)
        for over in SPARSE_SWEEP:
            for splits in (0, 4, 8, 16):
                c = sparse_config(h, **over, max_splits=16)
                try:
                    t = bench(lambda: sparse_mla(q_lat, q_pe, cache, slots, SCALE, part_o, part_lse, out, c,
                                                 num_splits=splits))
                except Exception as e:   # noqa: BLE001  (a variant that does not compile is reported, not fatal)
                    variants.append(dict(over, splits=splits, error=str(e)[:120]))
                    continue
                err = float((out[:4].float() - want).abs().max())
                variants.append(dict(over, splits=splits, us=t, tflops=flops / (t * 1e-6) / 1e12, max_err=err))
    lens = torch.full((b,), s, dtype=torch.int32, device=DEV)
    dcfg = decode.decode_config(h)
    ws = decode.alloc_decode_workspace(b, h, LORA, 64, DEV)
    dense_out = torch.empty(b, h, LORA, dtype=DTYPE, device=DEV)
    decode.build_decode_plan(lens, b, ws, dcfg.block_n, dcfg.target_items, dcfg.min_tiles)
    t_dense = bench(lambda: decode.mla_decode(q, cache, tables, lens, dense_out, ws, LORA, SCALE, dcfg))
    gathered = b * topk * (LORA + ROPE) * 2
    return dict(b=b, h=h, topk=topk, context=s, config=str(cfg), sparse_us=t_sparse, dense_us=t_dense,
                speedup=t_dense / t_sparse, sparse_tflops=flops / (t_sparse * 1e-6) / 1e12,
                gathered_bytes=gathered, variants=variants)


def _index_decode_inputs(b: int, s: int, heads: int, dim: int):
    """A decode step's indexer inputs: b rows at context s (paged key cache, queries, head weights)."""
    g = torch.Generator(device=DEV).manual_seed(1)
    cache, tables = _paged(b, s, dim, g)
    q = torch.randn(b, heads, dim, device=DEV, generator=g).to(DTYPE)
    w = torch.randn(b, heads, device=DEV, generator=g)
    bids = torch.arange(b, dtype=torch.int32, device=DEV)
    positions = torch.full((b,), s - 1, dtype=torch.int64, device=DEV)
    return cache, tables, q, w, bids, positions


def bench_index_decode(b: int, s: int, heads: int, dim: int, topk: int, bw: float, sweep: bool) -> dict:
    cache, tables, q, w, bids, positions = _index_decode_inputs(b, s, heads, dim)
    width = 4 * s   # as a graphed decode step: the buffer is max_model_len wide, the rows s long
    scores = torch.empty(b, width, dtype=torch.float32, device=DEV)
    pos_out = torch.empty(b, topk, dtype=torch.int64, device=DEV)
    score = lambda **kw: index_scores(q, w, cache, tables, bids, positions, width, scores, **kw)   # noqa: E731
    scratch = torch.zeros(topk_scratch_shape(b, topk), dtype=torch.int32, device=DEV)
    fallbacks = torch.zeros(1, dtype=torch.int32, device=DEV)
    select = lambda **kw: topk_select(scores, topk, pos_out, bids, positions, scratch=scratch,   # noqa: E731
                                      fallbacks=fallbacks, **kw)
    t_score = bench(score)
    t_topk = bench(select)
    t_both = bench(lambda: (score(), select()))
    t_torch = bench(lambda: torch.topk(scores[:, :s], topk, dim=-1))
    key_bytes = b * s * dim * 2
    variants = []
    if sweep:
        for kw in (dict(num_stages=2), dict(num_stages=3), dict(num_stages=4), dict(num_stages=5),
                   dict(per_sm=8), dict(per_sm=24), dict(block_n=128), dict(num_warps=4)):
            t = min(bench(lambda: score(**kw)) for _ in range(2))
            variants.append(dict(kind="score", **kw, us=t, fraction_of_copy_bw=key_bytes / (t * 1e-6) / bw))
        score()
        topk_variants = (dict(), dict(select_warps=8), dict(candidate_warps=8), dict(candidate_warps=8, select_warps=8),
                         dict(threshold_digits=3), dict(block=2048), dict(segments=16), dict(segments=4))
        times = {i: [] for i in range(len(topk_variants))}
        for _ in range(3):      # interleaved repeats: single top-k timings varied by 1.7x in one process
            for i, kw in enumerate(topk_variants):
                fallbacks.zero_()
                times[i].append(bench(lambda: select(**kw)))
        for i, kw in enumerate(topk_variants):
            variants.append(dict(kind="topk", **kw, us_min=min(times[i]), us_all=times[i],
                                 sample_misses=int(fallbacks.item())))
    score()
    fallbacks.zero_()
    select()
    ref_vals = torch.topk(scores[:, :s], topk, dim=-1).values.sort(-1).values
    got_vals = scores[:, :s].gather(1, pos_out).sort(-1).values
    assert torch.equal(ref_vals, got_vals), "topk_select disagrees with torch.topk"
    return dict(b=b, context=s, score_us=t_score, topk_us=t_topk, torch_topk_us=t_torch, score_topk_us=t_both,
                topk_sample_misses=int(fallbacks.item()),
                score_fraction_of_copy_bw=key_bytes / (t_score * 1e-6) / bw,
                score_topk_fraction_of_copy_bw=key_bytes / (t_both * 1e-6) / bw, variants=variants)


_PREVIOUS = dict(append_sem="acq_rel", short_select=False, threshold_digits=3)   # the 2026-11-22 path
AB_VARIANTS = {"previous": _PREVIOUS, "relaxed": {**_PREVIOUS, "append_sem": "relaxed"},
               "short": {**_PREVIOUS, "short_select": True},
               "relaxed+short": {**_PREVIOUS, "append_sem": "relaxed", "short_select": True},
               "relaxed+short+2-digit sample (default)": dict()}


def bench_indexer_ab(b: int, s: int, heads: int, dim: int, topk: int, repeats: int = 5) -> dict:
    """--indexer-ab: the score kernel, and the top-k and score + top-k of each ``AB_VARIANTS`` entry, at
    one shape, interleaved, min of ``repeats`` (copy bandwidth too: the max of its repeats). Each
    variant's selection is checked against torch.topk by value; its short-select paths are counted."""
    cache, tables, q, w, bids, positions = _index_decode_inputs(b, s, heads, dim)
    scores = torch.empty(b, 4 * s, dtype=torch.float32, device=DEV)   # as a graphed step's buffer
    pos_out = torch.empty(b, topk, dtype=torch.int64, device=DEV)
    scratch = torch.zeros(topk_scratch_shape(b, topk), dtype=torch.int32, device=DEV)
    score = lambda: index_scores(q, w, cache, tables, bids, positions, 4 * s, scores)   # noqa: E731
    select = lambda **kw: topk_select(scores, topk, pos_out, bids, positions, scratch=scratch, **kw)   # noqa: E731
    score()
    ref_vals = torch.topk(scores[:, :s], topk, dim=-1).values.sort(-1).values
    checks, variants = {}, {}
    for name, kw in AB_VARIANTS.items():
        fallbacks, paths = torch.zeros(1, dtype=torch.int32, device=DEV), torch.zeros(4, dtype=torch.int32, device=DEV)
        stats = dict(path_counts=paths) if kw.get("short_select", True) else {}
        try:
            select(fallbacks=fallbacks, **kw, **stats)
        except Exception as e:   # noqa: BLE001  (a variant that does not compile is reported, the rest timed)
            print(f"variant {name} failed: {str(e)[:300]}")
            scratch.zero_()     # its candidate pass may have run: the counts must start at zero again
            continue
        variants[name] = kw
        cols = pos_out.sort(-1).values    # distinct columns inside the window, whose values are the top k
        exact = bool((cols[:, 1:] > cols[:, :-1]).all() and (cols[:, 0] >= 0).all() and (cols[:, -1] < s).all()
                     and torch.equal(scores[:, :s].gather(1, pos_out).sort(-1).values, ref_vals))
        checks[name] = dict(exact=exact, sample_misses=int(fallbacks.item()), paths=paths.tolist())
    # as timing.copy_bandwidth
    x = torch.empty((1 << 30) if DEV != "cpu" else (1 << 20), dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    times = {k: [] for k in ["copy", "score"] + [f"topk {n}" for n in variants] + [f"pair {n}" for n in variants]}
    for _ in range(repeats):
        times["copy"].append(bench(lambda: y.copy_(x)))
        times["score"].append(bench(score))
        for name, kw in variants.items():
            times[f"topk {name}"].append(bench(lambda: select(**kw)))
            times[f"pair {name}"].append(bench(lambda: (score(), select(**kw))))
    bw = 2 * x.numel() / (min(times["copy"]) * 1e-6)
    key_bytes = b * s * dim * 2
    best = {k: min(v) for k, v in times.items()}
    return dict(b=b, context=s, topk=topk, copy_bw_gbs=bw / 1e9, key_bytes=key_bytes, us_min=best, us_all=times,
                checks=checks,
                fraction_of_copy={k: key_bytes / (t * 1e-6) / bw for k, t in best.items() if k != "copy"})


def print_indexer_ab(r: dict) -> None:
    print(f"## indexer score + top-k A/B, b={r['b']} ctx {r['context']} top-{r['topk']}, "
          f"copy {r['copy_bw_gbs']:.0f} GB/s, "
          f"key bytes {r['key_bytes'] / 1e6:.1f} MB (min of {len(r['us_all']['score'])} interleaved repeats)")
    print(f"score kernel alone: {r['us_min']['score']:.1f} us ({r['fraction_of_copy']['score']:.1%} of copy)")
    print("| variant | top-k alone us | score + top-k us | % of copy (target >= 70%) | exact | sample misses | "
          "short paths [whole, max, min, 4th digit] |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, c in r["checks"].items():
        print(f"| {n} | {r['us_min'][f'topk {n}']:.1f} | {r['us_min'][f'pair {n}']:.1f} | "
              f"{r['fraction_of_copy'][f'pair {n}']:.1%} | {c['exact']} | {c['sample_misses']} | {c['paths']} |")


def bench_e2e(layers: int, batch: int, context: int, graphs: bool) -> dict:
    """Decode step times of the V3.2 dsa model and the dense V3 one (each on its default kernels: the
    SM90 CUDA ops where they serve), and of the dsa model with attention.cuda_decode off (its sparse
    MLA on Triton)."""
    out = {}
    runs = [(name, name, True) for name in V3_STEP_MODELS] + [("v32_dsa_triton_sparse", "v32_dsa", False)]
    for key, name, cuda in runs:
        runner, step = v3_step_runner(name, layers, batch, context, graphs, DEV, cuda_decode=cuda)
        out[key + "_step_ms"] = time_steps(runner, step, 10) * 1e3
        del runner, step
        torch.cuda.empty_cache()
    out.update(layers=layers, batch=batch, context=context, cuda_graphs=graphs,
               ratio=out["v32_dsa_step_ms"] / out["v3_dense_step_ms"])
    return out


def print_e2e(rows: list[dict]) -> None:
    for e in rows:
        print(f"- e2e {e['layers']} layers b={e['batch']} ctx {e['context']}: V3.2 dsa {e['v32_dsa_step_ms']:.2f} ms "
              f"vs V3 dense {e['v3_dense_step_ms']:.2f} ms: {e['ratio']:.2f}x (target at b=64 <= 0.5x; "
              f"CUDA graphs {'on' if e['cuda_graphs'] else 'off'}); dsa with the Triton sparse MLA "
              f"{e['v32_dsa_triton_sparse_step_ms']:.2f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (gpu_check.sh)")
    ap.add_argument("--e2e", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="kernel config variants (sparse MLA, score, top-k)")
    ap.add_argument("--no-graphs", action="store_true", help="e2e without CUDA graphs on either model")
    ap.add_argument("--e2e-batches", default="64", help="e2e decode batch sizes, e.g. 1,16,64")
    ap.add_argument("--e2e-only", action="store_true", help="only the e2e steps (implies --e2e)")
    ap.add_argument("--e2e-plain-indexer", action="store_true",
                    help="with --e2e-only: also the dsa step with the indexer's plain-tensor RoPE/LayerNorm "
                         "(A/B of its fused kernel)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--indexer-ab", action="store_true",
                    help="only the indexer score + top-k variants (topk_select's append_sem / short_select), A/B")
    args = ap.parse_args()
    global DEV, DTYPE
    ctx = 8192 if args.quick else 32768
    b, h, topk, tokens = 64, 128, 2048, 32768
    if args.cpu_smoke:
        DEV, DTYPE, ctx, b, h, topk, tokens = "cpu", torch.float32, 256, 2, 16, 64, 512
    if args.indexer_ab:
        r = bench_indexer_ab(b, ctx, 64 if DEV != "cpu" else 16, 128, topk, 5 if DEV != "cpu" else 1)
        print_indexer_ab(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
        return
    graphs = not args.no_graphs and DEV != "cpu"
    e2e = [bench_e2e(4 if DEV != "cpu" else 1, int(eb), ctx, graphs) for eb in args.e2e_batches.split(",")] \
        if args.e2e or args.e2e_only else []
    if args.e2e_only:
        print_e2e(e2e)
        if args.e2e_plain_indexer:
            from paddle_mla.models import indexer

            indexer.indexer_rope_norm = lambda *a, **k: None     # the plain form, as on CPU
            for eb, r in zip(args.e2e_batches.split(","), e2e):
                runner, step = v3_step_runner("v32_dsa", 4, int(eb), ctx, graphs, DEV)
                r["v32_dsa_plain_indexer_step_ms"] = time_steps(runner, step, 10) * 1e3
                print(f"- b={eb}: dsa with the plain indexer RoPE/LayerNorm "
                      f"{r['v32_dsa_plain_indexer_step_ms']:.2f} ms, "
                      f"fused {r['v32_dsa_step_ms']:.2f} ms", flush=True)
                del runner, step
                torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"e2e": e2e}, f, indent=1)
        return
    bw = copy_bandwidth(DEV, (1 << 30) if DEV != "cpu" else (1 << 20))
    res = {"device": torch.cuda.get_device_name() if DEV != "cpu" else "cpu (smoke)", "copy_bw_gbs": bw / 1e9,
           "key_windows": bench_key_windows(tokens),
           "sparse_decode": bench_sparse_decode(b, h, topk, ctx, args.sweep),
           "index_decode": bench_index_decode(b, ctx, 64 if DEV != "cpu" else 16, 128, topk, bw, args.sweep)}
    if e2e:
        res["e2e"] = e2e
    print(f"## DSA on {res['device']} (copy bandwidth {bw / 1e9:.0f} GB/s)")
    kw, sd, ix = res["key_windows"], res["sparse_decode"], res["index_decode"]
    print(f"- [ks, ke) at {kw['tokens']} tokens: kernel {kw['kernel_us']:.1f} us, Python loop {kw['loop_us']:.0f} us, "
          f"{kw['speedup']:.0f}x (target >= 100x)")
    print(f"- sparse decode b={sd['b']} h={sd['h']} topk {sd['topk']} ctx {sd['context']}: {sd['sparse_us']:.1f} us "
          f"({sd['sparse_tflops']:.0f} TFLOPS) vs dense triton_mla {sd['dense_us']:.1f} us: {sd['speedup']:.1f}x "
          "(target >= 6x; FlashMLA anchor 410 TFLOPS FP8 on H800)")
    print(f"- indexer decode ctx {ix['context']}: score {ix['score_us']:.1f} us "
          f"({ix['score_fraction_of_copy_bw']:.0%} of copy bw), score + top-k {ix['score_topk_us']:.1f} us "
          f"({ix['score_topk_fraction_of_copy_bw']:.0%}; target >= 70%); top-k alone {ix['topk_us']:.1f} us "
          f"(torch.topk over the same rows {ix['torch_topk_us']:.1f} us; rows whose sample missed: "
          f"{ix['topk_sample_misses']} of {ix['b']})")
    print(f"  sparse config {sd['config']}; gathered latent bytes {sd['gathered_bytes'] / 1e6:.0f} MB "
          f"= {sd['gathered_bytes'] / bw * 1e6:.0f} us at copy bandwidth")
    for v in sd["variants"] + ix["variants"]:
        print("  variant", json.dumps(v))
    print_e2e(e2e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
