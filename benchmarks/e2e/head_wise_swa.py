"""Benchmark: head-wise sliding-window attention on the GPU (docs/head_wise_swa.md), whole engine.

A Qwen3-8B-dimension checkpoint cut to ``--layers`` layers, random bf16 weights written once (to
``--dir``, reused when present), run through the LLM at ratio 0.5 (4 of 8 KV heads SWA, window W,
sink S), bf16, append_attn, in these modes at one fixed KV budget (``--num-blocks`` blocks of 64
tokens per KV head, times 8 heads):
  uniform_mask     the seed's baseline: uniform tables and one pool, every head walks the whole row
                   and SWA heads mask it (attention.swa_mode: mask)
  headwise         head-wise tables, SWA heads read only sink + window, recycling off
  headwise_recycle head-wise tables, recycling on (SWA heads give back out-of-window blocks)
  full             ratio 0, every head full (not in the default set; --modes adds it)
Per mode:
  TTFT             one request of ``--context`` tokens, 1 output token, wall time
  TBT              mean period of the decode-only steps of the throughput run (every mode of the
                   acceptance table runs the same batch: recycling off admits the same requests); a
                   step's period is from the end of the step before to its end, on the device
                   (StepClock: CUDA events around each launch)
  decode tok/s     tokens of decode-only steps / their time, in the throughput run (``--requests``
                   requests of ``--context`` tokens, ``--output`` tokens each)
  full-batch       the same over the decode-only steps with the most rows (the mode's steady batch,
                   which the KV budget sets: the moonshot's "more requests fit")
  idle ms/step     device idle before a decode-only step's work began (> 0: the host is the bound)
  preemptions, prompts computed   in the throughput run (prompt tokens computed / context: more
                   than --requests means preempted prompts were recomputed)
  KV MiB/request   one request alone: peak blocks held summed over KV heads x bytes per head-block
  peak concurrent  most requests decoding together in one step of the throughput run (requests
                   admitted for a prefill chunk and preempted later are not counted)
  run out tok/s    every output token of the throughput run / its wall time (prefill included)
  by rows          decode-only steps grouped by rows: count and mean period (the ramp where fewer
                   rows decode: requests admitted one prompt at a time finish one at a time)
Two tables: the seed's acceptance (headwise vs uniform_mask, TTFT and TBT >= 5% better) and the
moonshot (headwise_recycle vs uniform_mask decode throughput >= 1.4x at the same KV budget).

  python -m benchmarks.e2e.head_wise_swa --quick            # one GPU, about 2-3 minutes (op build excluded)
  python -m benchmarks.e2e.head_wise_swa [--layers 4] [--context 32768] [--requests 16] [--json out.json]
The budget is the same for every mode: uniform_mask and headwise give each KV head --num-blocks
blocks; headwise_recycle re-splits 8 x --num-blocks into per-head ranges of one flat cache (SWA heads:
what scheduler.max_num_seqs recycled rows and one chunk use; full heads: the rest), which is why more
requests fit (docs/head_wise_swa.md, "Per-head cache ranges"). max_num_seqs is --max-num-seqs,
default --requests: at 2100 blocks a head, 8 or 12 leave the full heads room for 6 rows of 32k, 16 for
5 and 24 for 4 (the SWA ranges then take what the full heads needed), so the request count is not
neutral here. --json keeps every step (rows, decoding rows, prefill tokens, period ms, decode-only).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.checkpoints import write_qwen3_checkpoint  # noqa: E402
from benchmarks.harness.swa_modes import DEFAULT_MODES, MODES  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

def engine(path: Path, mode: str, args) -> LLM:
    m = MODES[mode]
    attention = {"backend": "append_attn", "head_wise_swa_ratio": m["head_wise_swa_ratio"]}
    if m["head_wise_swa_ratio"]:
        attention.update(sliding_window=args.window, sink_tokens=args.sink, swa_mode=m["swa_mode"])
    return LLM(config_from_dict({
        "model": str(path), "device": args.device, "dtype": "bfloat16" if args.device == "gpu" else "float32",
        "attention": attention,
        "max_model_len": args.context + args.output + 64,
        "cache": {"block_size": 64, "num_blocks": args.num_blocks, "enable_prefix_caching": False,
                  "swa_recycle": bool(m.get("recycle", False))},
        "scheduler": {"max_num_seqs": args.max_num_seqs or args.requests, "max_num_batched_tokens": 8192,
                      "enable_chunked_prefill": True}}))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepClock:
    """Per engine step: rows, decode-only or not, and when its device work started and ended. On a
    GPU, CUDA events recorded around ``runner.launch`` (the end event follows the step's sampler
    on the stream, so it fires when the step's work is done); on the CPU the launch runs the step,
    so host times. A step's period is end(N) - end(N - 1): with overlapped scheduling the host
    timestamps of schedule() calls would charge step N - 1's device time to step N (a decode step
    after a 8k-token prefill chunk then "took" the chunk's 300 ms: the first pass's 37.6 ms TBT)."""

    def __init__(self, llm: LLM):
        self.runner, self.launch = llm.runner, llm.runner.launch
        self.gpu = torch.cuda.is_available()
        self.steps = []      # (decode-only, rows, rows decoding, prefill tokens, start, end)
        llm.runner.launch = self.timed

    def mark(self):
        if not self.gpu:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def timed(self, out):
        decoding = sum(not s.is_prefill for s in out.scheduled)
        prefill = sum(s.num_new for s in out.scheduled if s.is_prefill)
        start = self.mark()
        launched = self.launch(out)
        self.steps.append((decoding == len(out.scheduled), len(out.scheduled), decoding, prefill, start, self.mark()))
        return launched

    def close(self) -> list[tuple]:
        """(decode-only, rows, rows decoding, prefill tokens, period s, busy s, idle s before it) per step."""
        self.runner.launch = self.launch
        sync()
        ms = (lambda a, b: a.elapsed_time(b) / 1e3) if self.gpu else (lambda a, b: b - a)
        out, prev = [], None
        for only, rows, decoding, prefill, start, end in self.steps:
            busy = ms(start, end)
            period, idle = (busy, 0.0) if prev is None else (ms(prev, end), max(0.0, ms(prev, start)))
            out.append((only, rows, decoding, prefill, period, busy, idle))
            prev = end
        return out


def run(llm: LLM, n: int, context: int, output: int, seed: int) -> dict:
    """``n`` requests of ``context`` random tokens and ``output`` tokens each: wall time, the most
    rows decoding in one step, preemptions, prompt tokens computed (recomputed ones included), and
    the decode-only steps' count, rows, periods and device idle time (StepClock)."""
    rng = np.random.default_rng(seed)
    reqs = [GenerationRequest(id=i, prompt_token_ids=rng.integers(2, llm.runner.arch.vocab_size - 2, context).tolist(),
                              params=SamplingParams(max_tokens=output, ignore_eos=True)) for i in range(n)]
    clock = StepClock(llm)
    preempted = llm.scheduler.num_preemptions
    sync()
    t = time.perf_counter()
    outs = llm.generate(reqs, use_tqdm=False)
    sync()
    end = time.perf_counter()
    steps = clock.close()
    assert all(o.error is None for o in outs), [o.error for o in outs if o.error]
    dec = [(rows, period, idle) for only, rows, _, _, period, _, idle in steps if only]
    peak = max([rows for rows, *_ in dec] + [0])
    full = [(rows, period) for rows, period, _ in dec if rows == peak]     # the steady batch
    return {"seconds": end - t, "peak": max([s[2] for s in steps] + [0]), "output_tokens": n * output,
            "steps": [(rows, decoding, prefill, round(period * 1e3, 4), only)
                      for only, rows, decoding, prefill, period, _, _ in steps],
            "preemptions": llm.scheduler.num_preemptions - preempted,
            "prompt_tokens": sum(s[3] for s in steps), "decode_steps": len(dec),
            "decode_rows": sum(r for r, *_ in dec), "decode_s": sum(p for _, p, _ in dec),
            "decode_idle_s": sum(i for *_, i in dec), "full_rows": sum(r for r, _ in full),
            "full_s": sum(p for _, p in full), "full_steps": len(full)}


def bench_mode(path: Path, mode: str, args) -> dict:
    llm = engine(path, mode, args)
    run(llm, 1, min(1024, args.context), 4, seed=99)       # warm-up (graphs, kernels)
    pool = llm.pool
    head_wise = hasattr(pool, "peak_head_blocks")
    llm.reset_stats()            # restarts the uniform pool's peak
    if head_wise:
        pool.peak_head_blocks = 0
    ttft = run(llm, 1, args.context, 1, seed=1)["seconds"]
    arch = llm.runner.arch.gqa
    elt = torch.zeros(1, dtype=llm.runner.dtype).element_size()
    per_head_block = 2 * 64 * arch.head_dim * elt * llm.runner.arch.num_layers     # K + V, all layers
    held = pool.peak_head_blocks if head_wise else pool.peak_used * arch.num_kv_heads
    r = run(llm, args.requests, args.context, args.output, seed=2)
    del llm
    steps = max(1, r["decode_steps"])
    return {"mode": mode, "ttft_ms": ttft * 1e3, "tbt_ms": r["decode_s"] / steps * 1e3,
            "decode_tok_s": r["decode_rows"] / max(r["decode_s"], 1e-9),
            "full_tok_s": r["full_rows"] / max(r["full_s"], 1e-9),
            "full_tbt_ms": r["full_s"] / max(1, r["full_steps"]) * 1e3,
            "idle_ms": r["decode_idle_s"] / steps * 1e3, "kv_mib_per_request": held * per_head_block / 2**20,
            "peak_concurrent": r["peak"], "elapsed_s": r["seconds"], "decode_steps": r["decode_steps"],
            "full_steps": r["full_steps"], "preemptions": r["preemptions"],
            "prompts_computed": r["prompt_tokens"] / args.context,
            "run_out_tok_s": r["output_tokens"] / max(r["seconds"], 1e-9), "by_rows": by_rows(r["steps"]),
            "steps": r["steps"]}


def by_rows(steps: list) -> dict:
    """Decode-only steps by their rows: {rows: [steps, mean period ms]}."""
    out = {}
    for rows, _, _, ms, only in steps:
        if only:
            n, total = out.get(rows, (0, 0.0))
            out[rows] = (n + 1, total + ms)
    return {r: [n, total / n] for r, (n, total) in sorted(out.items())}


def gain(base: float, new: float) -> str:
    """How much lower ``new`` is than ``base``, in percent of ``base``."""
    return f"{(base - new) / base * 100:+.1f}%"


def report(rows: dict, args) -> None:
    dt = "bf16" if args.device == "gpu" else "fp32"
    print(f"Qwen3-8B dims, {args.layers} layers, {dt}, context {args.context}, ratio 0.5 (4 of 8 KV heads SWA), "
          f"W {args.window}, S {args.sink}, KV budget {args.num_blocks} blocks x 8 heads x 64 tokens, "
          f"{args.requests} requests x {args.output} tokens")
    print("| mode | TTFT ms | TBT ms | decode tok/s | full-batch TBT ms | full-batch tok/s | idle ms/step | "
          "KV MiB/request | peak concurrent | decode steps (full batch) | preemptions | prompts computed | run s | "
          "run out tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows.values():
        print(f"| {r['mode']} | {r['ttft_ms']:.1f} | {r['tbt_ms']:.2f} | {r['decode_tok_s']:.0f} | "
              f"{r['full_tbt_ms']:.2f} | {r['full_tok_s']:.0f} | {r['idle_ms']:.3f} | "
              f"{r['kv_mib_per_request']:.1f} | {r['peak_concurrent']} | {r['decode_steps']} ({r['full_steps']}) | "
              f"{r['preemptions']} | {r['prompts_computed']:.2f} | {r['elapsed_s']:.1f} | {r['run_out_tok_s']:.1f} |")
    print("\nDecode-only steps by rows (steps x mean ms)")
    for r in rows.values():
        cells = [f"{k} rows: {n} x {ms:.2f}" for k, (n, ms) in r["by_rows"].items()]
        print(f"| {r['mode']} | " + " | ".join(cells) + " |")
    base = rows.get("uniform_mask")
    if base and "headwise" in rows:
        h = rows["headwise"]
        print("\nSeed acceptance (recycling off; target: both >= 5% better)")
        print("| metric | uniform_mask | headwise | better by |")
        print("|---|---|---|---|")
        print(f"| TTFT ms | {base['ttft_ms']:.1f} | {h['ttft_ms']:.1f} | {gain(base['ttft_ms'], h['ttft_ms'])} |")
        print(f"| TBT ms | {base['tbt_ms']:.2f} | {h['tbt_ms']:.2f} | {gain(base['tbt_ms'], h['tbt_ms'])} |")
        print(f"| full-batch TBT ms | {base['full_tbt_ms']:.2f} | {h['full_tbt_ms']:.2f} | "
              f"{gain(base['full_tbt_ms'], h['full_tbt_ms'])} |")
    if base and "headwise_recycle" in rows:
        h = rows["headwise_recycle"]
        print("\nMoonshot (recycling on vs uniform_mask, same KV budget; target: >= 1.4x decode tok/s)")
        print("| metric | uniform_mask | headwise_recycle | ratio |")
        print("|---|---|---|---|")
        print(f"| decode tok/s (every decode-only step) | {base['decode_tok_s']:.0f} | {h['decode_tok_s']:.0f} | "
              f"{h['decode_tok_s'] / base['decode_tok_s']:.2f}x |")
        print(f"| full-batch decode tok/s | {base['full_tok_s']:.0f} | {h['full_tok_s']:.0f} | "
              f"{h['full_tok_s'] / base['full_tok_s']:.2f}x |")
        print(f"| run out tok/s (prefill included) | {base['run_out_tok_s']:.1f} | {h['run_out_tok_s']:.1f} | "
              f"{h['run_out_tok_s'] / base['run_out_tok_s']:.2f}x |")
        print(f"| KV MiB/request | {base['kv_mib_per_request']:.1f} | {h['kv_mib_per_request']:.1f} | "
              f"{h['kv_mib_per_request'] / base['kv_mib_per_request']:.2f}x |")
        print(f"| peak concurrent | {base['peak_concurrent']} | {h['peak_concurrent']} | "
              f"{h['peak_concurrent'] / base['peak_concurrent']:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=4200,
                    help="blocks of 64 tokens per KV head (default: 8 requests of 32k at a time when uniform)")
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="scheduler.max_num_seqs (default --requests); sizes the recycled SWA heads' ranges")
    ap.add_argument("--modes", default=DEFAULT_MODES)
    ap.add_argument("--quick", action="store_true",
                    help="8 requests x 32 tokens, a budget of 4 uniform 32k requests (about 2-3 min)")
    ap.add_argument("--dir", default="/tmp/paddle_mla_bench_qwen3_swa")
    ap.add_argument("--json")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--tiny", action="store_true", help="small dims (a CPU smoke test of the script)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.output, args.num_blocks = 8, 32, 2100
    path = Path(args.dir) / (f"layers{args.layers}" + ("_tiny" if args.tiny else ""))
    t0 = time.perf_counter()
    write_qwen3_checkpoint(path, args.layers, args.tiny)
    print(f"checkpoint ready in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = {}
    for mode in args.modes.split(","):
        t = time.perf_counter()
        rows[mode] = bench_mode(path, mode, args)
        print(f"{mode}: {time.perf_counter() - t:.0f} s", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    report(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
