"""Host side of the head-wise SWA benchmark's modes on this CPU: the scheduler and input building of the real engine
at the benchmark's sizes (32k context, blocks of 64, the KV budget of ``--num-blocks`` per head),
with the model's forward replaced by its host part (``ForwardMeta.build``: the upload of the step's
arrays, block tables included) and fixed logits, as benchmarks.profile.host_step does.

Per mode (uniform_mask, headwise, headwise_recycle): steps, preemptions, prompt tokens computed
(recomputed prefills show as more than requests x context), rows decoding together at most,
block-table entries written, and host CPU time per decode-only step, by phase.

    python -m benchmarks.profile.swa_host [--context 32768] [--requests 8] [--output 32] [--num-blocks 2100]
        [--max-num-seqs N] [--steps]

--steps prints each mode's schedule, run-length encoded: ``P3x9`` = 9 steps with a prefill chunk and
3 rows decoding, ``D4x19`` = 19 decode-only steps of 4 rows. The schedule does not depend on timing,
so it is benchmarks.e2e.head_wise_swa's on the GPU step for step (checked on its H100 run in BENCHMARKS.md,
"Head-wise SWA").
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.checkpoints import write_qwen3_checkpoint  # noqa: E402
from benchmarks.harness.phases import PhaseTimer, forward_host_part_only  # noqa: E402
from benchmarks.harness.swa_modes import MODES  # noqa: E402
from paddle_mla.attention.forward_meta import ForwardMeta  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.sched.scheduler import Scheduler  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def make_llm(path: Path, mode: str, args) -> LLM:
    m = MODES[mode]
    llm = LLM(config_from_dict({
        "model": str(path), "device": "cpu", "dtype": "float32",
        "attention": {"backend": "native", "head_wise_swa_ratio": 0.5, "sliding_window": args.window,
                      "sink_tokens": args.sink, "swa_mode": m["swa_mode"]},
        "max_model_len": args.context + args.output + 64,
        "cache": {"block_size": 64, "num_blocks": args.num_blocks, "enable_prefix_caching": False,
                  "swa_recycle": m["recycle"]},
        "scheduler": {"max_num_seqs": args.max_num_seqs or args.requests, "max_num_batched_tokens": 8192,
                      "enable_chunked_prefill": True, "overlap": True}}))
    forward_host_part_only(llm, args.requests)
    return llm


def entries_written(inputs) -> int:
    """Block-table entries the input state wrote, its head-wise rows included."""
    heads = getattr(inputs, "heads", None)
    return inputs.blocks_written + (heads.written if heads is not None else 0)


def profile(path: Path, mode: str, args) -> dict:
    llm = make_llm(path, mode, args)
    timer = PhaseTimer(time.thread_time)   # CPU time: steady on a shared machine
    timer.wrap(Scheduler, "schedule", "schedule")
    timer.wrap(Scheduler, "finish_step", "finish_step")
    timer.wrap(llm.runner, "_gather", "inputs (tables)")
    timer.wrap(ForwardMeta, "build", "meta + upload")
    timer.wrap(llm, "_step", "rest of the step")
    launch, stats = llm.runner.launch, {"steps": 0, "prompt": 0, "peak": 0, "decode": [], "schedule": []}
    real_step = llm._step

    def step(finished):
        before = dict(timer.total)
        t = time.thread_time()
        real_step(finished)
        if stats.get("only"):
            phases = {k: v - before.get(k, 0.0) for k, v in timer.total.items()}
            stats["decode"].append((time.thread_time() - t, phases))
        stats["only"] = False

    def counted(out):
        decoding = sum(not s.is_prefill for s in out.scheduled)
        stats["steps"] += 1
        stats["prompt"] += sum(s.num_new for s in out.scheduled if s.is_prefill)
        stats["peak"] = max(stats["peak"], decoding)
        stats["only"] = decoding == len(out.scheduled)
        stats["schedule"].append(("D" if stats["only"] else "P", decoding))
        return launch(out)

    llm._step, llm.runner.launch = step, counted
    rng = np.random.default_rng(0)
    reqs = [GenerationRequest(i, rng.integers(3, llm.runner.arch.vocab_size, args.context).tolist(),
                              SamplingParams(max_tokens=args.output, ignore_eos=True)) for i in range(args.requests)]
    written0 = entries_written(llm.runner.inputs)
    try:
        llm.generate(reqs, use_tqdm=False)
    finally:
        timer.close()
    written = entries_written(llm.runner.inputs) - written0
    dec = stats["decode"]
    phases = {k: float(np.median([p.get(k, 0.0) for _, p in dec])) * 1e3 for k in dec[0][1]} if dec else {}
    return {"mode": mode, "steps": stats["steps"], "preemptions": llm.scheduler.num_preemptions,
            "prompts": stats["prompt"] / args.context, "peak": stats["peak"], "decode_steps": len(dec),
            "host_ms": float(np.median([t for t, _ in dec])) * 1e3 if dec else 0.0, "phases": phases,
            "written": written, "schedule": " ".join(f"{k[0]}{k[1]}x{len(list(g))}"
                                                     for k, g in itertools.groupby(stats["schedule"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=2100)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=0, help="scheduler.max_num_seqs (default --requests)")
    ap.add_argument("--steps", action="store_true", help="print each mode's schedule")
    ap.add_argument("--modes", default="uniform_mask,headwise,headwise_recycle")
    ap.add_argument("--dir", default="/tmp/paddle_mla_bench_qwen3_swa")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = Path(args.dir) / "layers1_tiny"
    write_qwen3_checkpoint(path, 1, tiny=True)
    rows = [profile(path, mode, args) for mode in args.modes.split(",")]
    print(f"context {args.context}, {args.requests} requests x {args.output} tokens, budget {args.num_blocks} blocks "
          f"x 8 heads x 64 tokens (tiny qwen3, forward replaced by its host part; CPU time, median decode step)")
    names = sorted({k for r in rows for k in r["phases"]})
    print("| mode | steps | preemptions | prompts computed | peak decoding | decode-only steps | table entries "
          "written | host ms / decode step | " + " | ".join(names) + " |")
    print("|" + "---|" * (8 + len(names)))
    for r in rows:
        print(f"| {r['mode']} | {r['steps']} | {r['preemptions']} | {r['prompts']:.2f} | {r['peak']} | "
              f"{r['decode_steps']} | {r['written']} | {r['host_ms']:.3f} | "
              + " | ".join(f"{r['phases'].get(k, 0.0):.3f}" for k in names) + " |")
    if args.steps:
        for r in rows:
            print(f"{r['mode']}: {r['schedule']}")


if __name__ == "__main__":
    main()
