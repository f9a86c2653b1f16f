"""Chunked prefill on a shared-prefix long-context workload, through ``paddle-mla bench``.

Target: with chunked prefill on, ITL p99 <= 2x ITL p50, and throughput at least that of chunked
prefill off. Both configs have prefix caching on, ``triton_mla`` and CUDA graphs; they differ only
in ``scheduler.enable_chunked_prefill`` and the step's token budget (chunked: ``--chunk`` tokens,
so one prefill chunk rides along with the running decodes; off: a whole prompt per step).

The model is the random DeepSeek-V2-Lite-dimension checkpoint of benchmarks.e2e.moe (written
once, reused). The workload: ``--prompts`` requests behind one ``--prefix``-token shared prefix,
``--suffix`` own tokens and ``--output`` output tokens each (greedy, ignore_eos).

    python -m benchmarks.e2e.chunked_itl [--layers 4] [--prefix 8192] [--json out.json]   (GPU, ~2 min)
    python -m benchmarks.e2e.chunked_itl --absorbed-caps 0,2097152   (one chunked-on config per cap)
    python -m benchmarks.e2e.chunked_itl --smoke                                             (CPU code path)
    python -m benchmarks.e2e.chunked_itl --profile [--smoke]   (where the time goes, step by step)

``--profile`` runs the same configs in this process instead (chunked off, then on with the first
cap): a warm-up as in the bench, then two measured runs of the workload. Run 1 times every step
(``harness.step_probe``: wall period, host time less the wait for the tokens, host time of ``launch``,
CUDA events around it, and the host phases of ``harness.phases`` on the wall clock). Run 2, the
same requests and so the same steps, runs under ``torch.profiler`` (CPU + CUDA) and gives each
step's kernels (time, count, category, and the attention regions, among them the extend's
expansion of the cached prefix through kv_b_proj). Printed: the time of each kind of step
(decode only, prefill chunk, short-extend admission) for both configs, the slowest steps of the
chunked run (which hold the ITL p99) with host vs kernel time, and the host phases of its
admission steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.harness.checkpoints import moe_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def engine_config(model: str, chunked: bool, args, smoke: bool, absorbed_cap: int = 0) -> dict:
    prompt = args.prefix + args.suffix
    max_len = prompt + args.output + 64
    return {
        "model": model, "runtime": "torch", "device": "cpu" if smoke else "gpu",
        "dtype": "float32" if smoke else "bfloat16",
        "attention": {"backend": "native" if smoke else "triton_mla"},
        "cuda_graph": False if smoke else True,
        "max_model_len": max_len,
        "cache": {"block_size": 64, "enable_prefix_caching": True},
        "scheduler": {"max_num_seqs": args.prompts, "enable_chunked_prefill": chunked,
                      "max_num_batched_tokens": args.chunk if chunked else max_len + args.prompts,
                      "max_num_batched_absorbed_context": absorbed_cap},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=8192)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024, help="step token budget with chunked prefill on")
    ap.add_argument("--absorbed-caps", default="0", help="chunked-on configs, one per scheduler."
                    "max_num_batched_absorbed_context value (comma-separated; 0: no cap)")
    ap.add_argument("--repeats", type=int, default=3)
    # a warm-up smaller than the workload misses shapes of the measured run (the 63-row admission step,
    # larger group counts), and their Triton compiles land in repeat 1 (seconds: 2026-11-24, H100)
    ap.add_argument("--warmup", type=int, default=-1, help="warm-up requests per engine (-1: as many as --prompts)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, native backend, short prompts")
    ap.add_argument("--profile", action="store_true", help="per-step host vs kernel time, in this process")
    ap.add_argument("--top", type=int, default=8, help="--profile: the slowest steps listed")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.smoke:
        (args.prompts, args.prefix, args.suffix, args.output, args.chunk, args.repeats,
         args.warmup) = 4, 96, 8, 4, 48, 1, 2
    if args.warmup < 0:
        args.warmup = args.prompts
    model, _ = moe_checkpoint(args.layers, args.smoke)
    if args.profile:   # in this process: the engine configs name the torch runtime
        from paddle_mla.platform import runtime

        runtime.select("torch")
        from benchmarks.e2e.chunked_itl_profile import profile_configs
        profile_configs([(name, engine_config(str(model), chunked, args, args.smoke, cap)) for name, chunked, cap in
                         [("chunked off", False, 0), ("chunked on", True, int(args.absorbed_caps.split(",")[0]))]],
                        args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench_chunked_itl_"))
    caps = [int(c) for c in args.absorbed_caps.split(",")]
    paths = []
    for name, chunked, cap in [("chunked_off", False, 0)] + [(f"chunked_on_cap{c}", True, c) for c in caps]:
        p = work / f"{name}.yaml"
        p.write_text(yaml.safe_dump(engine_config(str(model), chunked, args, args.smoke, cap)))
        paths.append(p)
    out_json = work / "bench.json"
    workload = (f"shared-prefix:num_prompts={args.prompts},prefix_len={args.prefix},suffix_len={args.suffix},"
                f"output_len={args.output}")
    cmd = [sys.executable, "-m", "paddle_mla", "bench", *[a for p in paths for a in ("--config", str(p))],
           "--workload", workload, "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--json", str(out_json)]
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    doc = json.loads(out_json.read_text())
    off, *ons = (c["summary"] for c in doc["configs"])
    keys = ("output_tokens_per_s", "itl_ms_p50", "itl_ms_p99", "ttft_ms_p50")
    res = {"device": doc["device_name"], "workload": workload, "layers": args.layers, "chunk": args.chunk,
           "off": {k: off[k] for k in keys}, "off_itl_p99_over_p50": off["itl_ms_p99"] / off["itl_ms_p50"]}
    print("\n| chunked | absorbed cap | out tok/s | on/off | ITL p50 ms | ITL p99 ms | p99/p50 | TTFT p50 ms |\n"
          "|---|---|---|---|---|---|---|---|")
    for i, (cap, s) in enumerate([(None, off)] + list(zip(caps, ons))):
        ratio = s["output_tokens_per_s"] / off["output_tokens_per_s"]
        print(f"| {'off' if cap is None else 'on'} | {cap if cap is not None else '-'} | "
              f"{s['output_tokens_per_s']:.0f} | "
              f"{ratio:.2f}x | {s['itl_ms_p50']:.2f} | {s['itl_ms_p99']:.2f} | "
              f"{s['itl_ms_p99'] / s['itl_ms_p50']:.2f} | "
              f"{s['ttft_ms_p50']:.1f} |")
        if cap is not None:   # "on" is the first chunked-on config (the first cap)
            res.setdefault("on", {k: s[k] for k in keys})
            res.setdefault("on_itl_p99_over_p50", s["itl_ms_p99"] / s["itl_ms_p50"])
            res.setdefault("throughput_on_over_off", ratio)
            res.setdefault("by_cap", {})[str(cap)] = {**{k: s[k] for k in keys}, "on_over_off": ratio,
                                                      "p99_over_p50": s["itl_ms_p99"] / s["itl_ms_p50"]}
    print("\ntargets: throughput on/off >= 1.0, ITL p99/p50 with chunked on <= 2")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
