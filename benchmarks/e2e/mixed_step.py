"""Mixed step (decodes + a prefill chunk) vs decode-only and chunk-only steps (GPU), against the target
mixed <= decode-only + 1.2 x chunk-only.

The dense DeepSeek-V3-dims model of ``benchmarks.e2e.decode`` (random bf16 weights, 4 layers), the
triton_mla backend, a paged latent cache of random values. Three steps, each timed through the
whole runner step (metadata, model, logits, greedy sampling with its one host read):
  decode  ``--decodes`` requests at ``--context`` tokens, one new token each (CUDA graph, and eager);
  chunk   one ``--chunk``-token prefill chunk after ``c`` cached tokens, for each c in ``--chunk-cached``;
  mixed   the decodes and the chunk in one step (decodes first, as the scheduler orders them).
Before the split, a mixed step re-expanded every decode row's whole context through kv_b_proj.
  short   the decodes plus ``--short-extends`` prefix-cache hits of ``--short-tokens`` new tokens over
          one shared ``--short-cached``-token prefix (the chunked shared-prefix workload), with the
          short rows absorbed (pseudo decode rows) and, for comparison, expanded.

    python -m benchmarks.e2e.mixed_step [--decodes 63 --context 8192 --chunk 512 --chunk-cached 0,7680]
``--cpu-smoke`` (with TRITON_INTERPRET=1) runs every step once at toy shapes on the CPU: a check of
the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.batches import mixed_batches, short_batch  # noqa: E402
from benchmarks.harness.dims import SMOKE_MLA, V3_DENSE  # noqa: E402
from benchmarks.harness.models import dense_v3_model, time_steps  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402


def step_time(runner: ModelRunner, batch, iters: int) -> float:
    return time_steps(runner, batch, iters, warmup=min(iters, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--decodes", type=int, default=63)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--chunk-cached", default="0,7680")
    ap.add_argument("--max-batched-tokens", type=int, default=8192,
                    help="scheduler.max_num_batched_tokens (sizes the extend workspace; engine default 8192)")
    ap.add_argument("--short-extends", type=int, default=15)
    ap.add_argument("--short-tokens", type=int, default=64)
    ap.add_argument("--short-cached", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    if args.cpu_smoke:
        dims, kind, dtype_name = dict(V3_DENSE, **SMOKE_MLA), "cpu", "float32"
        args.layers, args.decodes, args.context, args.chunk, args.chunk_cached, args.iters = 2, 3, 40, 12, "0,20", 1
        args.max_batched_tokens = 0
        args.short_extends, args.short_tokens, args.short_cached = 2, 5, 30
    else:
        dims, kind, dtype_name = V3_DENSE, "gpu", "bfloat16"
    device, dtype = runtime.device_string(kind), getattr(torch, dtype_name)
    cached_list = [int(c) for c in args.chunk_cached.split(",")]
    page = 64 if kind == "gpu" else 8
    step_tokens = max(args.decodes + args.chunk, args.decodes + args.short_extends * args.short_tokens,
                      args.max_batched_tokens)
    chunk_blocks = args.decodes * -(-args.context // page) + -(-(max(cached_list) + args.chunk) // page)
    short_own = -(-(args.short_cached % page + args.short_tokens) // page)
    num_blocks = chunk_blocks + args.short_cached // page + args.short_extends * short_own + 1
    model, _ = dense_v3_model(args.layers, device, dtype, dims)
    ecfg = config_from_dict({
        "device": kind, "dtype": dtype_name, "attention": {"backend": "triton_mla"}, "cuda_graph": kind == "gpu",
        "cache": {"block_size": page, "num_blocks": num_blocks},
        "scheduler": {"max_num_seqs": args.decodes + max(args.short_extends, 1), "max_num_batched_tokens": step_tokens,
                      "enable_chunked_prefill": True},
        "max_model_len": max(args.context, max(cached_list) + args.chunk,
                             args.short_cached + args.short_tokens) + page})
    runner = ModelRunner(ecfg, model=model)
    for cache in runner.kv_caches:
        cache.normal_(0.0, 1.0)
    graphs = runner.graphs
    rows = []
    for cached in cached_list:
        dec, chk, mixed = mixed_batches(args.decodes, args.context, args.chunk, cached, page, num_blocks)
        t_dec_graph = step_time(runner, dec, args.iters) if graphs is not None else None
        runner.graphs = None
        t_dec = step_time(runner, dec, args.iters)
        t_chunk = step_time(runner, chk, args.iters)
        t_mixed = step_time(runner, mixed, args.iters)
        runner.graphs = graphs
        t_dec_best = t_dec_graph if t_dec_graph is not None else t_dec
        rows.append(dict(chunk_cached=cached, decode_ms=t_dec * 1e3,
                         decode_graph_ms=None if t_dec_graph is None else t_dec_graph * 1e3,
                         chunk_ms=t_chunk * 1e3, mixed_ms=t_mixed * 1e3,
                         ratio=t_mixed / (t_dec_best + 1.2 * t_chunk), ratio_eager=t_mixed / (t_dec + 1.2 * t_chunk)))
    short = None
    if args.short_extends:
        dec, _, _ = mixed_batches(args.decodes, args.context, args.chunk, cached_list[0], page, num_blocks)
        sb = short_batch(dec, args.short_extends, args.short_tokens, args.short_cached, page, chunk_blocks)
        runner.graphs, crossover = None, runner.backend.short_max_q
        t_abs = step_time(runner, sb, args.iters)
        runner.backend.short_max_q = 0
        t_exp = step_time(runner, sb, args.iters)
        runner.backend.short_max_q, runner.graphs = crossover, graphs
        short = dict(short_extends=args.short_extends, short_tokens=args.short_tokens, short_cached=args.short_cached,
                     absorbed_ms=t_abs * 1e3, expanded_ms=t_exp * 1e3, crossover_tokens=crossover)
    print(f"{args.decodes} decodes at {args.context} + one {args.chunk}-token chunk, {args.layers} layers, "
          f"{dtype_name}, triton_mla, device {kind}, max_num_batched_tokens {step_tokens}, extend chunk "
          f"{runner.backend.extend.chunk_tokens} rows")
    print("| chunk cached | decode ms (graph) | decode ms (eager) | chunk ms | mixed ms | "
          "mixed / (decode + 1.2 chunk) | same, eager decode |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        g = "-" if r["decode_graph_ms"] is None else f"{r['decode_graph_ms']:.2f}"
        print(f"| {r['chunk_cached']} | {g} | {r['decode_ms']:.2f} | {r['chunk_ms']:.2f} | {r['mixed_ms']:.2f} | "
              f"{r['ratio']:.2f} | {r['ratio_eager']:.2f} |")
    if short:
        print(f"{args.decodes} decodes + {args.short_extends} extends of {args.short_tokens} tokens over a shared "
              f"{args.short_cached}-token prefix (eager): short rows absorbed {short['absorbed_ms']:.2f} ms, "
              f"expanded {short['expanded_ms']:.2f} ms (crossover {short['crossover_tokens']} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "short": short}, f, indent=1)


if __name__ == "__main__":
    main()
