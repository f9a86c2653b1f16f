"""Mixed step (decodes + a prefill chunk) vs decode-only and chunk-only steps (GPU), issue 9 target:
mixed <= decode-only + 1.2 x chunk-only.

The dense DeepSeek-V3-dims model of ``bench_e2e_decode.py`` (random bf16 weights, 4 layers), the
triton_mla backend, a paged latent cache of random values. Three steps, each timed through the
whole runner step (metadata, model, logits, greedy sampling with its one host read):
  decode  ``--decodes`` requests at ``--context`` tokens, one new token each (CUDA graph, and eager);
  chunk   one ``--chunk``-token prefill chunk after ``c`` cached tokens, for each c in ``--chunk-cached``;
  mixed   the decodes and the chunk in one step (decodes first, as the scheduler orders them).
Before the split, a mixed step re-expanded every decode row's whole context through kv_b_proj.
  short   the decodes plus ``--short-extends`` prefix-cache hits of ``--short-tokens`` new tokens over
          one shared ``--short-cached``-token prefix (the chunked shared-prefix workload), with the
          short rows absorbed (pseudo decode rows) and, for comparison, expanded.

    python tools/bench_mixed_step.py [--decodes 63 --context 8192 --chunk 512 --chunk-cached 0,7680]
``--cpu-smoke`` (with TRITON_INTERPRET=1) runs every step once at toy shapes on the CPU: a check of
the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

_TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_TOOLS), _TOOLS]   # this checkout, and bench_e2e_decode next to it

from bench_e2e_decode import V3, random_weights  # noqa: E402  (selects the runtime)

from paddle_mla.platform import runtime  # noqa: E402
from paddle_mla.attention.forward_meta import StepBatch  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402
from paddle_mla.models import parse_arch  # noqa: E402
from paddle_mla.models.deepseek import CausalLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

SMOKE = dict(V3, vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
             v_head_dim=16)


def step_time(runner: ModelRunner, batch: StepBatch, iters: int) -> float:
    rows = int(batch.sample_mask.sum())
    zeros = np.zeros(rows)

    def step():
        logits = runner.forward_step(batch)
        return sampler.sample(logits, zeros, zeros.astype(np.int64), zeros + 1, zeros.astype(np.int64),
                              zeros.astype(np.int64)).tolist()

    for _ in range(min(iters, 3)):
        step()
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t) / iters


def batches(decodes: int, context: int, chunk: int, cached: int, page: int, num_blocks: int):
    """(decode, chunk, mixed) StepBatches over disjoint random blocks."""
    rng = np.random.default_rng(cached)
    per_dec, per_chunk = -(-context // page), -(-(cached + chunk) // page)
    width = max(per_dec, per_chunk)
    perm = rng.permutation(num_blocks)[:decodes * per_dec + per_chunk].astype(np.int32)
    tables = np.full((decodes + 1, width), -1, np.int32)
    tables[:decodes, :per_dec] = perm[:decodes * per_dec].reshape(decodes, per_dec)
    tables[decodes, :per_chunk] = perm[decodes * per_dec:]
    dec = StepBatch(token_ids=np.arange(decodes, dtype=np.int64) + 5, num_new=np.ones(decodes, np.int32),
                    num_cached=np.full(decodes, context - 1, np.int32), block_tables=tables[:decodes],
                    is_prefill=np.zeros(decodes, bool), sample_mask=np.ones(decodes, bool))
    chk = StepBatch(token_ids=(np.arange(chunk, dtype=np.int64) % 97) + 3, num_new=np.array([chunk], np.int32),
                    num_cached=np.array([cached], np.int32), block_tables=tables[decodes:],
                    is_prefill=np.ones(1, bool), sample_mask=np.ones(1, bool))
    mixed = StepBatch(token_ids=np.concatenate([dec.token_ids, chk.token_ids]),
                      num_new=np.concatenate([dec.num_new, chk.num_new]),
                      num_cached=np.concatenate([dec.num_cached, chk.num_cached]), block_tables=tables,
                      is_prefill=np.concatenate([dec.is_prefill, chk.is_prefill]),
                      sample_mask=np.ones(decodes + 1, bool))
    return dec, chk, mixed


def short_batch(dec: StepBatch, n: int, q: int, cached: int, page: int, first_block: int) -> StepBatch:
    """``dec`` plus ``n`` extend rows of ``q`` new tokens over one shared ``cached``-token prefix
    (blocks from ``first_block`` on: the shared prefix, then each row's own tail blocks)."""
    shared, own = cached // page, -(-(cached % page + q) // page)
    width = max(dec.block_tables.shape[1], shared + own)
    tables = np.full((len(dec.num_new) + n, width), -1, np.int32)
    tables[:len(dec.num_new), :dec.block_tables.shape[1]] = dec.block_tables
    for i in range(n):
        row = tables[len(dec.num_new) + i]
        row[:shared] = np.arange(first_block, first_block + shared)
        row[shared:shared + own] = first_block + shared + i * own + np.arange(own)
    return StepBatch(token_ids=np.concatenate([dec.token_ids, (np.arange(n * q, dtype=np.int64) % 97) + 3]),
                     num_new=np.concatenate([dec.num_new, np.full(n, q, np.int32)]),
                     num_cached=np.concatenate([dec.num_cached, np.full(n, cached, np.int32)]), block_tables=tables,
                     is_prefill=np.concatenate([dec.is_prefill, np.ones(n, bool)]),
                     sample_mask=np.ones(len(dec.num_new) + n, bool))


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
        cfg, kind, dtype_name = dict(SMOKE, num_hidden_layers=2), "cpu", "float32"
        args.layers, args.decodes, args.context, args.chunk, args.chunk_cached, args.iters = 2, 3, 40, 12, "0,20", 1
        args.max_batched_tokens = 0
        args.short_extends, args.short_tokens, args.short_cached = 2, 5, 30
    else:
        cfg, kind, dtype_name = dict(V3, num_hidden_layers=args.layers), "gpu", "bfloat16"
    device, dtype = runtime.device_string(kind), getattr(torch, dtype_name)
    cached_list = [int(c) for c in args.chunk_cached.split(",")]
    page = 64 if kind == "gpu" else 8
    step_tokens = max(args.decodes + args.chunk, args.decodes + args.short_extends * args.short_tokens,
                      args.max_batched_tokens)
    chunk_blocks = args.decodes * -(-args.context // page) + -(-(max(cached_list) + args.chunk) // page)
    short_own = -(-(args.short_cached % page + args.short_tokens) // page)
    num_blocks = chunk_blocks + args.short_cached // page + args.short_extends * short_own + 1
    model = CausalLM(parse_arch(cfg), random_weights(cfg, args.layers, device, dtype), device, dtype)
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
        dec, chk, mixed = batches(args.decodes, args.context, args.chunk, cached, page, num_blocks)
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
        dec, _, _ = batches(args.decodes, args.context, args.chunk, cached_list[0], page, num_blocks)
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
