"""Benchmark: a full-size DeepSeek model, tensor-parallel (optionally expert-parallel), dummy-loaded.

``--arch v3``: the published V3 config (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, 256 routed
experts of 2048 top-8 + 1 shared, noaux_tc, first 3 layers dense 18432, vocab 129280, FP8 128x128
block scales) with ``num_hidden_layers`` cut to ``--layers`` (default 19: what fits 2 H200s);
``--arch v32``: the same with the V3.2 indexer dims and the dsa backend; ``--arch v2``: the published
DeepSeek-V2 config (236B: hidden 5120, 128 heads, 160 routed experts of 1536 top-6 + 2 shared,
group-limited greedy routing, 60 layers, bf16 as published), whole (``--layers`` default 60).
``--weights``: ``published`` (V3 FP8, V2 bf16), ``fp8`` (V3's 128x128 block-scaled e4m3 applied to
every linear: V2's bf16 weights do not fit 4 80-GB cards) or ``auto`` (published when one rank's
share of it fits 80% of this card, else fp8). ``--ep``: routed experts whole on the ranks
(``parallel.expert_parallel``). ``load_format: dummy`` (each rank makes its own shards on its GPU:
nothing is written, nothing travels); triton_mla (dsa for v32), CUDA graphs, bf16 activations.
One engine, then:
  1. start-up: load time (rank 0's weight making), engine start; per-GPU memory: rank 0's
     profile (weights, activations, CUDA-graph pools, KV cache) and nvidia-smi's used memory;
  2. decode steps (``forward_step`` + greedy sample + its one host read, as the engine runs them;
     random block tables over a cache of random values) at ``--batches`` x ``--contexts``;
  3. prefill steps: ``--prefills`` (e.g. 8x1024 = 8 prompts of 1024 tokens in one step);
  4. ``--e2e N``: ``paddle-mla bench``'s measurement (``run_once``) of N random requests for each
     ``--e2e-shapes`` (input x output tokens, default 1024x1024): output tok/s, TTFT, TPOT;
  5. the roofline, and, when ``--layers`` cuts the model, an EXTRAPOLATION to ``--to-layers`` (the
     published depth) on ``--to-tp`` (8) GPUs.
Roofline of a decode step per GPU: (the FP8/bf16 weight bytes it reads: every non-expert weight of
its shard, and of its routed experts' shards the fraction a batch of B picks at uniform routing,
1 - (1 - k/E)^B, + the latent cache of the batch, which every rank reads whole; under ``dsa`` only the
top-k rows of it, plus the whole indexer key cache) / the copy bandwidth measured here. The issue's simpler
figure, all weight bytes / (GPUs x bandwidth), is printed too.
EXTRAPOLATED step = the roofline at ``--to-layers`` layers / ``--to-tp`` GPUs divided by the efficiency
measured here (roofline / measured at ``--layers`` on ``--tp`` GPUs). It assumes that efficiency carries
over (all-reduces over 8 GPUs cost more than over 2; nothing of it was run).

    NCCL_NVLS_ENABLE=0 python -m benchmarks.e2e.fullsize [--arch v3|v32|v2] [--layers N] [--tp 2] [--ep]
        [--weights auto|published|fp8]
        [--batches 1,16,64] [--contexts 1024,8192] [--prefills 8x1024,1x8192] [--e2e 64]
        [--e2e-shapes 1024x1024,8192x1024] [--json out.json]
    python -m benchmarks.e2e.fullsize --smoke      (CPU, tiny dims, gloo: the code path)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.checkpoints import dummy_model_dir  # noqa: E402
from benchmarks.harness.batches import PAGE, decode_batch  # noqa: E402
from benchmarks.harness.dims import SMOKE_MOE, V2, V3, V32  # noqa: E402
from benchmarks.harness.kernel_profile import kernel_table  # noqa: E402
from benchmarks.harness.models import greedy_step, time_steps  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from paddle_mla.attention.forward_meta import StepBatch  # noqa: E402
from paddle_mla.cli.bench.runner import run_once, summarize  # noqa: E402
from paddle_mla.cli.bench.workloads import build_requests, make_workload  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.models.arch import parse_arch  # noqa: E402
from paddle_mla.models.dummy_weights import checkpoint_layout  # noqa: E402
from paddle_mla.models.sharding import checkpoint_shard  # noqa: E402

GIB = 2 ** 30
_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1}


def rank_bytes(cfg: dict, tp: int) -> tuple[float, float]:
    """(bytes of one rank's non-routed-expert weights, of its routed-expert weights), as held (the
    loader keeps FP8 as FP8; kv_b_proj becomes bf16 absorbed weights: counted at 2 bytes), from the
    dummy layout and the loader's own shard rule."""
    arch = parse_arch(cfg)
    layout = checkpoint_layout(arch)
    dense = experts = 0.0
    for name, (shape, dt) in layout.items():
        base = name[: -len("_scale_inv")] if name.endswith("_scale_inv") else name
        full = layout[base][0]
        shard = checkpoint_shard(base, full, arch, 0, tp)
        frac = 1.0 if shard is None else shard.size / full[shard.dim]
        n = float(np.prod(shape)) * (2 if name.endswith("kv_b_proj.weight") else _BYTES[dt]) * frac
        if ".mlp.experts." in name:
            experts += n
        else:
            dense += n
    return dense, experts


def roofline_s(cfg: dict, tp: int, batch: int, context: int, bw: float) -> tuple[float, float]:
    """(per-GPU roofline of a decode step, the issue's all-FP8-bytes / (tp x bw)), seconds."""
    dense, experts = rank_bytes(cfg, tp)
    k, e = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    touched = 1.0 - (1.0 - k / e) ** batch
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    if "index_topk" in cfg:   # dsa: the top-k latent rows, and every indexer key (bf16, as the cache holds them)
        per_row = min(context, cfg["index_topk"]) * latent * 2 + context * cfg["index_head_dim"] * 2
    else:
        per_row = context * latent * 2
    kv = batch * cfg["num_hidden_layers"] * per_row
    total_dense, total_experts = rank_bytes(cfg, 1)
    return (dense + experts * touched + kv) / bw, (total_dense + total_experts) / (tp * bw)


ARCHS = {"v3": (V3, 19), "v32": (V32, 19), "v2": (V2, 60)}   # published config, default --layers


def with_weights(cfg: dict, weights: str, tp: int, card_bytes: int) -> dict:
    """``cfg`` in the weight format asked for: ``published``, ``fp8`` (V3's block-scaled e4m3 on
    every linear) or ``auto`` (published when one rank's share fits 80% of the card, else fp8)."""
    fp8 = dict(cfg, quantization_config=V3["quantization_config"])
    if weights == "published" or "quantization_config" in cfg:
        return cfg
    if weights == "fp8":
        return fp8
    return cfg if sum(rank_bytes(cfg, tp)) <= 0.8 * card_bytes else fp8


def gpu_used_gib() -> list[float]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return [int(x) / 1024 for x in out.split()]
    except (OSError, subprocess.SubprocessError):
        return []


def prefill_batch(num_blocks: int, n: int, length: int, vocab: int, seed: int = 1) -> StepBatch:
    per = -(-length // PAGE)
    rng = np.random.default_rng(seed)
    return StepBatch(token_ids=rng.integers(2, vocab, n * length).astype(np.int64),
                     num_new=np.full(n, length, np.int32), num_cached=np.zeros(n, np.int32),
                     block_tables=rng.permutation(num_blocks)[: n * per].reshape(n, per).astype(np.int32),
                     is_prefill=np.ones(n, bool), sample_mask=np.ones(n, bool))


def main() -> None:
    # a run stopped by `timeout` (SIGTERM) prints where rank 0 was: a slow start and a hang look alike
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="v3", choices=sorted(ARCHS))
    ap.add_argument("--layers", type=int, default=0,
                    help="default: v3/v32 19 (3 dense + 16 MoE: ~95 GB of weights per H200 at TP=2), v2 60 (all)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--ep", action="store_true", help="expert parallel: routed experts whole on the ranks")
    ap.add_argument("--weights", default="auto", choices=["auto", "published", "fp8"])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--prefills", default="8x1024,1x8192")
    ap.add_argument("--e2e", type=int, default=0, help="requests per --e2e-shapes run, through paddle-mla bench's code")
    ap.add_argument("--e2e-shapes", default="1024x1024", help="input x output tokens, comma-separated")
    ap.add_argument("--e2e-repeat", type=int, default=1,
                    help="runs of each e2e workload; the last is reported (2: the first compiles what it meets)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--to-layers", type=int, default=0, help="default: the published depth")
    ap.add_argument("--to-tp", type=int, default=8)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--profile", action="store_true",
                    help="also a kernel table (torch.profiler) of each decode step: where the step's time goes")
    ap.add_argument("--dsa-sparse-only", action="store_true",
                    help="v32: every step sparse, as before dsa ran the extend rows that fit the top-k dense "
                         "(A/B of that rule)")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, gloo, native backend: the code path")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    prefills = [tuple(map(int, p.split("x"))) for p in args.prefills.split(",") if p]
    published, default_layers = ARCHS[args.arch]
    args.layers = args.layers or default_layers
    args.to_layers = args.to_layers or published["num_hidden_layers"]
    cfg = dict(published, num_hidden_layers=args.layers)
    if args.smoke:
        cfg.update(SMOKE_MOE, q_lora_rank=48, n_group=2, topk_group=1, first_k_dense_replace=1,
                   quantization_config=dict(V3["quantization_config"], weight_block_size=[16, 16]),
                   **({"index_topk": 16, "index_n_heads": 8, "index_head_dim": 32} if args.arch == "v32" else {}))
    gpu = not args.smoke
    if gpu:
        cfg = with_weights(cfg, args.weights, args.tp, runtime.gpu_memory_info()[1])
    path = dummy_model_dir(tempfile.mkdtemp(prefix="bench_fullsize_"), cfg)
    device = runtime.device_string("gpu" if gpu else "cpu")
    bw = copy_bandwidth(device) if gpu else 1e11
    runtime.empty_cache()      # the copy's 2 GiB go back before the engine sizes its cache
    shapes = [tuple(map(int, s.split("x"))) for s in args.e2e_shapes.split(",") if s]
    longest = max(contexts + [ln for _, ln in prefills] + [i + o for i, o in shapes]) + PAGE
    tokens = max([8192] + [n * ln for n, ln in prefills])
    backend = ("dsa" if args.arch == "v32" else "triton_mla") if gpu else "native"
    if args.dsa_sparse_only and (args.arch != "v32" or args.tp != 1):
        ap.error("--dsa-sparse-only: --arch v32 at --tp 1 (it sets rank 0's backend only)")
    t = time.perf_counter()
    llm = LLM(config_from_dict({
        "model": str(path), "load_format": "dummy", "runtime": "torch", "device": "gpu" if gpu else "cpu",
        "dtype": "bfloat16" if gpu else "float32", "quantization": "fp8" if gpu else "auto",
        "attention": {"backend": backend}, "cuda_graph": gpu, "max_model_len": longest,
        "cache": {"block_size": PAGE, "num_blocks": "auto" if gpu else 4096,
                  "gpu_memory_utilization": args.gpu_memory_utilization},
        "scheduler": {"max_num_seqs": max(batches + [args.e2e]), "max_num_batched_tokens": tokens,
                      "enable_chunked_prefill": True},
        "parallel": {"tensor_parallel_size": args.tp, "expert_parallel": args.ep}}))
    start_s = time.perf_counter() - t
    runner = llm.runner
    if args.dsa_sparse_only:
        runner.backend.dense_max_context = 0
    prof = runner.memory_profile
    out = dict(arch=args.arch, layers=args.layers, tp=args.tp, ep=args.ep, fp8="quantization_config" in cfg,
               device=runtime.device_name() if gpu else "cpu",
               copy_bw_gbs=bw / 1e9, load_s=runner.load_s, engine_start_s=start_s,
               num_blocks=runner.limits.num_blocks, gpu_used_gib=gpu_used_gib(), decode=[], prefill=[])
    if prof is not None:
        out["memory_gib"] = {k: getattr(prof, k) / GIB for k in ("weights", "activations", "graph_pools", "kv_cache")}
    title = {"v32": "DeepSeek-V3.2 (dsa)", "v3": "DeepSeek-V3", "v2": "DeepSeek-V2"}[args.arch]
    weights = "FP8 block-scaled" if out["fp8"] else "bf16"
    print(f"# {title} dims, {args.layers} of {args.to_layers} layers, {weights}, load_format: dummy, TP={args.tp}"
          f"{' + EP' if args.ep else ''}, "
          f"{out['device']}{' SMOKE (tiny dims, CPU)' if args.smoke else ''}\n")
    print(f"load (rank 0 makes its shards) {runner.load_s:.1f} s; engine start {start_s:.1f} s; "
          f"copy bandwidth {bw / 1e9:.0f} GB/s; KV blocks {out['num_blocks']} x {PAGE} tokens")
    if prof is not None:
        print("rank-0 memory GiB: " + ", ".join(f"{k} {v:.1f}" for k, v in out["memory_gib"].items())
              + f"; nvidia-smi used per GPU: {', '.join(f'{g:.1f}' for g in out['gpu_used_gib'])}")
    # random values in the indexer key caches too: all-zero keys tie every score, and the top-k's
    # sampled threshold then misses on every row (the exact fallback: ~150 us a layer at 32k)
    for cache in runner.kv_caches + list(getattr(runner, "index_caches", [])):
        cache.normal_(0.0, 1.0)
    print("\n| batch | context | step ms | tok/s | roofline ms (per GPU) | of roofline |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for ctx in contexts:
        for b in batches:
            if b * -(-ctx // PAGE) > out["num_blocks"]:
                print(f"| {b} | {ctx} | does not fit the KV cache | | | |")
                continue
            s = time_steps(runner, decode_batch(out["num_blocks"], b, ctx), args.iters)
            roof, _ = roofline_s(cfg, args.tp, b, ctx, bw)
            out["decode"].append(dict(batch=b, context=ctx, step_ms=s * 1e3, roofline_ms=roof * 1e3))
            print(f"| {b} | {ctx} | {s * 1e3:.2f} | {b / s:,.0f} | {roof * 1e3:.2f} | {roof / s:.0%} |", flush=True)
            if args.profile and gpu:   # CUDA activity only
                out["decode"][-1]["kernels"] = profile_step(runner, decode_batch(out["num_blocks"], b, ctx))
    print("\n| prefill | tokens | step ms | tok/s |\n| --- | ---: | ---: | ---: |")
    for n, ln in prefills:
        s = time_steps(runner, prefill_batch(out["num_blocks"], n, ln, cfg["vocab_size"]), max(2, args.iters // 3))
        out["prefill"].append(dict(requests=n, length=ln, step_ms=s * 1e3))
        print(f"| {n} x {ln} | {n * ln} | {s * 1e3:.1f} | {n * ln / s:,.0f} |", flush=True)
    out["e2e"] = []
    for n_in, n_out in shapes if args.e2e else []:
        w = make_workload("random", {"num_prompts": args.e2e, "input_len": n_in, "output_len": n_out})
        reqs = build_requests(w, llm.tokenizer, GenerationRequest, SamplingParams, llm.max_model_len)
        for _ in range(args.e2e_repeat):
            r = run_once(llm, reqs, 0)
        sm = summarize([r])
        out["e2e"].append(dict(requests=args.e2e, input_len=n_in, output_len=n_out, elapsed_s=r.elapsed_s,
                               output_tok_s=r.output_tokens_per_s, ttft_ms_p50=sm["ttft_ms_p50"],
                               tpot_ms_p50=sm["tpot_ms_p50"]))
        print(f"\npaddle-mla bench's run_once, {args.e2e} x {n_in}-in / {n_out}-out: "
              f"{r.output_tokens_per_s:,.0f} output tok/s, TTFT p50 {sm['ttft_ms_p50']:.0f} ms, "
              f"TPOT p50 {sm['tpot_ms_p50']:.1f} ms, {r.elapsed_s:.1f} s", flush=True)
    # before close(): the 2026-11-24 run was stopped by its time limit while the engine closed, and
    # lost this part (it was computed afterwards from the printed figures, with this same function)
    if args.layers < args.to_layers:
        extrapolate(out, cfg, args, bw)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    llm.close()


def profile_step(runner, batch) -> dict:
    """profile_kernels' kernel table of one decode step as the engine runs it (graph replays included)."""

    t = kernel_table(greedy_step(runner, batch), 5)
    print(f"  kernels: {t['device_ms']:.3f} ms a step; "
          + "; ".join(f"{c} {ms:.3f}" for c, ms in t["categories"].items()))
    print("  top: " + "; ".join(f"{k['name'][:50]} x{k['calls']} {k['ms']:.3f}" for k in t["top_kernels"]), flush=True)
    return t


def extrapolate(out: dict, cfg: dict, args, bw: float) -> None:
    """Two labelled estimates of each measured decode step at ``to_layers`` on ``to_tp`` GPUs: the
    roofline there over the efficiency measured here (bytes-bound steps), and the measured time per
    layer times ``to_layers`` (latency-bound steps: per-layer launches and all-reduces do not shrink
    with more GPUs, so this bounds small batches from above)."""
    full = dict(cfg, num_hidden_layers=args.to_layers)
    dense, experts = rank_bytes(full, args.to_tp)
    kv_tok = args.to_layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    grow = args.to_layers / args.layers
    print(f"\n## EXTRAPOLATED (not run): {args.to_layers} layers on {args.to_tp} GPUs, from the figures above\n")
    print(f"weights per GPU (computed from the layout): {(dense + experts) / GIB:.1f} GiB "
          f"(measured here: {out.get('memory_gib', {}).get('weights', float('nan')):.1f} GiB at {args.layers} layers, "
          f"TP={args.tp}); latent cache {kv_tok / 1024:.1f} KiB per token on every GPU")
    print("\n| batch | context | measured ms (here) | of roofline (here) | roofline ms, extrapolated shape | "
          "issue's roofline ms (all weight bytes / GPUs x bw) | EXTRAPOLATED ms: roofline / efficiency | "
          "EXTRAPOLATED ms: per-layer time x layers | EXTRAPOLATED tok/s (range) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in out["decode"]:
        eff = d["roofline_ms"] / d["step_ms"]
        roof, issue = roofline_s(full, args.to_tp, d["batch"], d["context"], bw)
        step, per_layer = roof / eff, d["step_ms"] / 1e3 * grow
        d["extrapolated"] = dict(roofline_ms=roof * 1e3, issue_roofline_ms=issue * 1e3, step_ms=step * 1e3,
                                 per_layer_bound_ms=per_layer * 1e3)
        print(f"| {d['batch']} | {d['context']} | {d['step_ms']:.2f} | {eff:.0%} | {roof * 1e3:.2f} | "
              f"{issue * 1e3:.2f} | {step * 1e3:.1f} | {per_layer * 1e3:.1f} | "
              f"{d['batch'] / per_layer:,.0f} - {d['batch'] / step:,.0f} |")
    for p in out["prefill"]:   # compute-bound: layers x measured / (GPU ratio), if the FLOPs split evenly
        ms = p["step_ms"] * grow * args.tp / args.to_tp
        p["extrapolated_ms"] = ms
        print(f"prefill {p['requests']} x {p['length']}: EXTRAPOLATED {ms:.0f} ms "
              f"({p['requests'] * p['length'] / ms * 1e3:,.0f} tok/s), "
              f"if the work splits evenly over {args.to_tp} GPUs")


if __name__ == "__main__":
    main()
