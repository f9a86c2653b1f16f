"""Benchmark: head-wise sliding-window attention on the GPU (docs/head_wise_swa.md), whole engine.

Default preset, the seed's geometry: ERNIE-4.5-21B-A3B at full depth (28 layers, hidden 2560, 20 query /
4 KV heads of 128, 64 routed experts top-6 + 2 shared), dummy bf16 weights (``load_format: dummy``,
config.json alone), append_attn, ratio 0.5 (the last 2 of 4 KV heads SWA).
Window W = 4096 and sink S = 64: 32k prompts are 8 windows long, so an SWA head reads (S + W) / 32k
= 12.7% of a full head's keys (the case the seed's acceptance is about: the window much shorter than
the context); 4096 is the window of the public SWA models (Mistral-7B v0.1, Gemma-2's local layers);
S = 64 is one cache block, the least a block pool can keep, and more than the few attention-sink
tokens StreamingLLM needs.
KV budget: the seed's, ``--kv-gb`` 24 (kv_cache_ratio 0.30 on an A800-80GB), as blocks of 64 tokens per
KV head (6539 for ERNIE-4.5: twelve 32k requests at a time with uniform tables; recycling re-splits the
same bytes and fits about 22); ``--num-blocks`` sets the blocks directly. ``scheduler.max_num_seqs`` 256,
so the pool and not the slot count limits concurrency.
A stream of ``--requests`` prompts of ``--context`` random tokens, ``--output`` tokens each, all
arriving at the start. Modes, each in its own process with its own engine, ``--repeats`` runs each:
  uniform_mask     the seed's baseline: uniform 1D tables, every head reads the whole row and SWA heads
                   mask it (attention.swa_mode: mask)
  headwise         head-wise 2D tables, SWA heads read only sink + window, recycling off
  headwise_recycle head-wise tables, recycling on (SWA heads give back out-of-window blocks, so the
                   same budget holds more requests)
  full             ratio 0 (not in the default set; --modes adds it)
Per run, from the engine's per-request metrics (RequestOutput.metrics): TTFT = first token - arrival
(p50 and mean over requests, queueing included: the KV-bound stream waits for blocks), TBT = gaps
between a request's tokens (p50 and mean over every gap). On the device (CUDA events around
``runner.launch``): decode tok/s over decode-only steps, and over those where requests wait for KV (the
pool binds; a finite stream's drain is not), the decode-only steps by rows, the full-batch TBT
(decode-only steps with the most rows, the steady batch), device idle time before a decode-only step's
work (> 0: the host is the bound) and peak concurrent requests (most rows decoding in one step).
Physics line: the fraction of bytes (weights + KV) a steady-batch decode step of uniform_mask reads
and head-wise tables no longer read (harness.swa_modes.decode_step_bytes), beside the measured
full-batch TBT gain. uniform_mask reads the keys it masks, as the seed's baseline does
(docs/head_wise_swa.md, "Mask mode").

  python -m benchmarks.e2e.head_wise_swa                     # the seed preset, 3 repeats (about 11 min on an H100)
  python -m benchmarks.e2e.head_wise_swa --quick             # one run of 24 x 64 per mode (about 2 min)
  python -m benchmarks.e2e.head_wise_swa --modes uniform_mask --json a.json    # modes in separate calls,
  python -m benchmarks.e2e.head_wise_swa --modes headwise,headwise_recycle --json b.json
  python -m benchmarks.e2e.head_wise_swa --report a.json b.json                # then one report
  python -m benchmarks.e2e.head_wise_swa --preset qwen3_8b --requests 12 --output 32
  python -m benchmarks.e2e.head_wise_swa --tiny --device cpu --context 256 --window 64 --num-blocks 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.checkpoints import dummy_model_dir, write_qwen3_checkpoint  # noqa: E402
from benchmarks.harness.errors import raise_on_failed  # noqa: E402
from benchmarks.harness.swa_modes import (DEFAULT_MODES, MODES, PRESETS, SEED_KV_GB,  # noqa: E402
                                          blocks_for_kv_bytes, decode_step_bytes)
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def preset_config(args) -> dict:
    """The preset's config.json, with --tiny's dims and --layers applied."""
    p = PRESETS[args.preset]
    cfg = dict(p.config, **(p.smoke if args.tiny else {}))
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    return cfg


def model_dir(args) -> tuple[Path, dict]:
    """The preset's folder (config.json alone for dummy weights, else random weight files) and config."""
    p, cfg = PRESETS[args.preset], preset_config(args)
    path = Path(args.dir) / f"{args.preset}_{cfg['num_hidden_layers']}L{'_tiny' if args.tiny else ''}"
    if not p.dummy:
        write_qwen3_checkpoint(path, cfg["num_hidden_layers"], args.tiny)
    elif not (path / "config.json").exists():
        dummy_model_dir(path, cfg)
    return path, cfg


def engine(path: Path, mode: str, args) -> LLM:
    m = MODES[mode]
    attention = {"backend": "append_attn", "head_wise_swa_ratio": m["head_wise_swa_ratio"]}
    if m["head_wise_swa_ratio"]:
        attention.update(sliding_window=args.window, sink_tokens=args.sink, swa_mode=m["swa_mode"])
    return LLM(config_from_dict({
        "model": str(path), "device": args.device, "dtype": "bfloat16" if args.device == "gpu" else "float32",
        "load_format": "dummy" if PRESETS[args.preset].dummy else "auto", "attention": attention,
        "max_model_len": args.context + args.output + 64,
        "cache": {"block_size": 64, "num_blocks": args.num_blocks, "enable_prefix_caching": False,
                  "swa_recycle": bool(m.get("recycle", False))},
        "scheduler": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": 8192,
                      "enable_chunked_prefill": True}}))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepClock:
    """Per engine step: rows, rows decoding, and when its device work started and ended. On a GPU,
    CUDA events recorded around ``runner.launch(StepInput)`` (the end event follows the step's sampler
    on the stream, so it fires when the step's work is done); on the CPU the launch runs the step, so
    host times. A step's period is end(N) - end(N - 1): with overlapped scheduling the host times of
    schedule() calls would charge step N - 1's device time to step N."""

    def __init__(self, llm: LLM):
        self.runner, self.launch, self.scheduler = llm.runner, llm.runner.launch, llm.scheduler
        self.gpu = torch.cuda.is_available()
        self.steps = []      # (rows, rows decoding, requests left waiting, start, end)
        llm.runner.launch = self.timed

    def mark(self):
        if not self.gpu:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def timed(self, msg):
        decoding = sum(not s.is_prefill for s in msg.scheduled)
        start = self.mark()
        launched = self.launch(msg)
        self.steps.append((len(msg.scheduled), decoding, len(self.scheduler.waiting), start, self.mark()))
        return launched

    def close(self) -> list[tuple[int, int, int, float, float]]:
        """(rows, rows decoding, requests waiting, period s, device idle s before the step's work began)
        per step."""
        self.runner.launch = self.launch
        sync()
        sec = (lambda a, b: a.elapsed_time(b) / 1e3) if self.gpu else (lambda a, b: b - a)
        out, prev = [], None
        for rows, decoding, waiting, start, end in self.steps:
            idle = 0.0 if prev is None else max(0.0, sec(prev, start))
            out.append((rows, decoding, waiting, sec(start if prev is None else prev, end), idle))
            prev = end
        return out


def run(llm: LLM, args, n: int, output: int, seed: int) -> dict:
    """One run of ``n`` requests: per-request TTFT / TBT from the engine's metrics, and the device
    clock's decode-only steps."""
    rng = np.random.default_rng(seed)
    vocab = llm.runner.arch.vocab_size
    reqs = [GenerationRequest(id=i, prompt_token_ids=rng.integers(3, vocab - 2, args.context).tolist(),
                              params=SamplingParams(max_tokens=output, ignore_eos=True)) for i in range(n)]
    clock = StepClock(llm)
    preempted = llm.scheduler.num_preemptions
    sync()
    t = time.perf_counter()
    outs = llm.generate(reqs, use_tqdm=False)
    sync()
    seconds = time.perf_counter() - t
    steps = clock.close()
    raise_on_failed(outs)
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tbt = [g for o in outs for g in np.diff(o.metrics.token_times).tolist()]
    only = [(rows, waiting, period, i) for rows, decoding, waiting, period, i in steps if decoding == rows and rows]
    dec = [(rows, period) for rows, _, period, _ in only]
    bound = [(rows, period) for rows, waiting, period, _ in only if waiting]   # the KV pool holds requests back
    idle = [i for *_, i in only]
    peak = max([d for _, d, *_ in steps] + [0])
    full = [period for rows, period in dec if rows == peak]
    hist = {}
    for rows, period in dec:
        count, sec = hist.get(rows, (0, 0.0))
        hist[rows] = (count + 1, sec + period)
    return {"ttft_p50_ms": float(np.median(ttft)) * 1e3, "ttft_mean_ms": float(np.mean(ttft)) * 1e3,
            "tbt_p50_ms": float(np.median(tbt)) * 1e3 if tbt else 0.0,
            "tbt_mean_ms": float(np.mean(tbt)) * 1e3 if tbt else 0.0,
            "decode_tok_s": sum(r for r, _ in dec) / max(sum(p for _, p in dec), 1e-9),
            "bound_decode_tok_s": sum(r for r, _ in bound) / max(sum(p for _, p in bound), 1e-9),
            "decode_steps_by_rows": {str(r): hist[r] for r in sorted(hist)},
            "full_tbt_ms": float(np.mean(full)) * 1e3 if full else 0.0, "full_steps": len(full),
            "idle_ms": float(np.mean(idle)) * 1e3 if idle else 0.0,
            "peak_concurrent": peak, "preemptions": llm.scheduler.num_preemptions - preempted,
            "seconds": seconds, "out_tok_s": n * output / seconds}


def bench_mode(path: Path, mode: str, args) -> dict:
    """One mode in this process: build the engine, warm it up, then ``--repeats`` runs."""
    t = time.perf_counter()
    llm = engine(path, mode, args)
    build_s = time.perf_counter() - t
    run(llm, argparse.Namespace(context=min(1024, args.context)), 1, 4, seed=99)   # graphs, kernels, autotune
    runs = [run(llm, args, args.requests, args.output, seed=2) for _ in range(args.repeats)]
    return {"mode": mode, "build_s": build_s, "runs": runs}


def mode_in_subprocess(mode: str, args) -> dict:
    """bench_mode in a fresh process (one engine per process: no weights of the last mode left over)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mode.json"
        argv = [sys.executable, "-m", "benchmarks.e2e.head_wise_swa", "--only-mode", mode, "--json", str(out)]
        for k in ("preset", "layers", "context", "output", "window", "sink", "requests", "num_blocks",
                  "max_num_seqs", "repeats", "dir", "device"):
            argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        argv += ["--tiny"] if args.tiny else []
        subprocess.run(argv, check=True)
        return json.loads(out.read_text())


def gain(base: float, new: float) -> float:
    """How much lower ``new`` is than ``base``, as a fraction of ``base``."""
    return (base - new) / base if base else 0.0


def report(rows: dict, cfg: dict, args) -> None:
    p = PRESETS[args.preset]
    print(f"{p.name} dims{' (tiny)' if args.tiny else ''}, {cfg['num_hidden_layers']} layers, "
          f"{'bf16' if args.device == 'gpu' else 'fp32'}, context {args.context}, ratio 0.5, W {args.window}, "
          f"S {args.sink}, KV budget {args.num_blocks} blocks x {cfg['num_key_value_heads']} heads x 64 tokens, "
          f"max_num_seqs {args.max_num_seqs}, {args.requests} requests x {args.output} tokens, {args.repeats} repeats")
    print("| mode | run | TTFT p50 ms | TTFT mean ms | TBT p50 ms | TBT mean ms | decode tok/s | full-batch TBT ms "
          "| idle ms/step | peak concurrent | preemptions | run s | out tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows.values():
        for i, x in enumerate(r["runs"]):
            print(f"| {r['mode']} | {i + 1} | {x['ttft_p50_ms']:.1f} | {x['ttft_mean_ms']:.1f} | "
                  f"{x['tbt_p50_ms']:.2f} | "
                  f"{x['tbt_mean_ms']:.2f} | {x['decode_tok_s']:.0f} | {x['full_tbt_ms']:.2f} | {x['idle_ms']:.3f} | "
                  f"{x['peak_concurrent']} | "
                  f"{x['preemptions']} | {x['seconds']:.1f} | {x['out_tok_s']:.1f} |")
    base = rows.get("uniform_mask")
    if base and "headwise" in rows:
        print("\nSeed acceptance, recycling off: headwise better than uniform_mask by (target: TTFT and TBT >= 5%, "
              "every run)")
        print("| run | TTFT p50 | TTFT mean | TBT p50 | TBT mean | full-batch TBT | skipped bytes | gain / skipped "
              "(target >= 0.8) |")
        print("|---|---|---|---|---|---|---|---|")
        for i, (b, h) in enumerate(zip(base["runs"], rows["headwise"]["runs"])):
            step = decode_step_bytes(cfg, b["peak_concurrent"], args.context + args.output // 2, args.window,
                                     args.sink, 0.5)
            g = gain(b["full_tbt_ms"], h["full_tbt_ms"])
            print(f"| {i + 1} | {gain(b['ttft_p50_ms'], h['ttft_p50_ms']):+.1%} | "
                  f"{gain(b['ttft_mean_ms'], h['ttft_mean_ms']):+.1%} | "
                  f"{gain(b['tbt_p50_ms'], h['tbt_p50_ms']):+.1%} | "
                  f"{gain(b['tbt_mean_ms'], h['tbt_mean_ms']):+.1%} | {g:+.1%} | {step.skipped_fraction:.1%} "
                  f"(weights {step.weights / 1e9:.1f} GB, KV {step.kv_uniform / 1e9:.1f} GB, skipped "
                  f"{step.kv_skipped / 1e9:.1f} GB) | {g / max(step.skipped_fraction, 1e-9):.2f} |")
    if base and "headwise_recycle" in rows:
        print("\nMoonshot, recycling on vs uniform_mask at the same KV budget (target >= 1.5x both)")
        print("| run | decode tok/s, decode-only steps while requests wait for KV | all decode-only steps | "
              "full batch | peak concurrent | out tok/s (prefill included) |")
        print("|---|---|---|---|---|---|")
        full = lambda x: x["peak_concurrent"] / max(x["full_tbt_ms"], 1e-9) * 1e3   # noqa: E731

        def ratio(b: float, h: float, fmt: str = ".0f") -> str:
            return f"{h / max(b, 1e-9):.2f}x ({b:{fmt}} -> {h:{fmt}})"

        for i, (b, h) in enumerate(zip(base["runs"], rows["headwise_recycle"]["runs"])):
            print(f"| {i + 1} | {ratio(b.get('bound_decode_tok_s', 0), h.get('bound_decode_tok_s', 0))} | "
                  f"{ratio(b['decode_tok_s'], h['decode_tok_s'])} | {ratio(full(b), full(h))} | "
                  f"{ratio(b['peak_concurrent'], h['peak_concurrent'], 'd')} | "
                  f"{ratio(b['out_tok_s'], h['out_tok_s'], '.1f')} |")
    print("\nDecode-only steps of each mode's first run, by rows: steps x mean ms")
    for r in rows.values():
        hist = r["runs"][0].get("decode_steps_by_rows", {})
        print(f"- {r['mode']}: " + ", ".join(f"{k} rows {n} x {sec / n * 1e3:.1f}" for k, (n, sec) in hist.items()))

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="ernie45_21b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0, help="cut the model to this many layers (0: full depth)")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--output", type=int, default=128,
                    help="tokens a request decodes (128: long enough that recycling's rows all decode together)")
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--requests", type=int, default=48,
                    help="prompts in the stream (default: four waves of uniform tables, two of recycling)")
    ap.add_argument("--kv-gb", type=float, default=SEED_KV_GB,
                    help="KV budget in GB (default: the seed's, about 24 GB; 12 requests of 32k at a time, uniform)")
    ap.add_argument("--num-blocks", type=int, default=0,
                    help="blocks of 64 tokens per KV head (0: what --kv-gb holds)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=DEFAULT_MODES)
    ap.add_argument("--only-mode", help="run this one mode here and write its JSON to --json (the driver's child)")
    ap.add_argument("--dir", default="/tmp/paddle_mla_bench_swa")
    ap.add_argument("--json")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--tiny", action="store_true", help="small dims of the same structure (a CPU smoke test)")
    ap.add_argument("--quick", action="store_true", help="one run of 24 requests x 64 tokens per mode")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="print the report of earlier --json files (modes run in separate calls) and exit")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.requests, args.output = 1, 24, 64
    if args.report:
        saved = [json.loads(Path(f).read_text()) for f in args.report]
        rows = {m: r for d in saved for m, r in d["rows"].items()}
        first = argparse.Namespace(**saved[0]["args"])
        report(rows, preset_config(first), first)    # the config alone: a report writes no checkpoint
        return
    path, cfg = model_dir(args)
    args.num_blocks = args.num_blocks or blocks_for_kv_bytes(cfg, args.kv_gb * 1e9, 64,
                                                             2 if args.device == "gpu" else 4)
    if args.only_mode:
        Path(args.json).write_text(json.dumps(bench_mode(path, args.only_mode, args)))
        return
    rows = {}
    for mode in args.modes.split(","):
        t = time.perf_counter()
        rows[mode] = mode_in_subprocess(mode, args)
        print(f"{mode}: {time.perf_counter() - t:.0f} s (engine build {rows[mode]['build_s']:.0f} s)", flush=True)
        print(json.dumps(rows[mode]), flush=True)      # each mode's runs as they finish (a cut-off run keeps them)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    report(rows, cfg, args)


if __name__ == "__main__":
    main()
