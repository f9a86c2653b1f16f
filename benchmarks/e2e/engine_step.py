"""The whole LLM step on a GPU: schedule, input build, forward, sampling, output handling.

Dense DeepSeek-V3-dims model (``dims.V3_DENSE``, random bf16 weights, ``--layers`` layers),
triton_mla with CUDA graphs, prefix caching off. ``batch`` requests of ``context - 8`` prompt tokens
are prefilled (chunked), then the decode steps where all ``batch`` requests decode are measured
through ``LLM.generate`` itself, with overlapped scheduling on and off. Per decode step:

- period: wall time from one ``LLM._step`` to the next (what throughput sees);
- host: time the host spends in ``_step`` minus the time it waits for the sampled tokens;
- GPU: CUDA events around ``runner.launch`` (its kernels, the graph replay, sampling and the read's
  copy), and the gap: device time between the end of step N-1's work and the start of step N's;
- syncs: blocking syncs flagged by ``torch.cuda.set_sync_debug_mode("warn")`` inside the step (the
  one read waits on its event, which the mode does not flag: counted as ``reads``);
- roofline: (weight bytes + KV bytes of the batch) / copy bandwidth measured in this process.

    python -m benchmarks.e2e.engine_step --layers 4 --batch 1,64 --context 4096 --host-batch 256

``--cache-dtype fp8_e4m3|both``: the FP8 latent cache (its roofline counts its row bytes).
``--moe``: the DeepSeek-V2-Lite-dims checkpoint of ``benchmarks.e2e.moe`` (routed MoE, written once
to /tmp) instead, for the MoE decode-step target; its roofline counts the routed experts the
batch selects (``roofline.decode_bytes``, measured per layer in one eager step).

Host time only (batch 256, about a minute): ``--batch '' --host-batch 256 --overlap on --steps 30``.
``--phases``: also the host time of each phase of the steady decode step (median, wall clock), by
the host-phase timer (``harness.phases``) run on this engine (the real forward, sampler and read).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.batches import PAGE, step_batch  # noqa: E402
from benchmarks.harness.checkpoints import moe_checkpoint  # noqa: E402
from benchmarks.harness.models import dense_v3_model, model_tensors, routed_distinct  # noqa: E402
from benchmarks.harness.roofline import decode_bytes  # noqa: E402
from benchmarks.harness.step_probe import StepProbe  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from paddle_mla.cache.fp8_latent import row_width  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402


def run_case(model, batch: int, context: int, steps: int, overlap: bool, model_dir: str = "tiny",
             phases: bool = False, cuda_decode: bool = True, cache_dtype: str = "auto") -> dict:
    blocks = batch * (-(-(context + steps + 16) // PAGE)) + 8
    cfg = config_from_dict({
        "model": model_dir, "device": "gpu", "dtype": "bfloat16", "cuda_graph": True,
        "attention": {"backend": "triton_mla", "cuda_decode": cuda_decode}, "max_model_len": context + steps + 64,
        "cache": {"block_size": PAGE, "num_blocks": blocks, "dtype": cache_dtype},
        "scheduler": {"max_num_seqs": batch, "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,
                      "overlap": overlap}})
    llm = LLM(cfg, model=model) if model is not None else LLM(cfg)
    rng = np.random.default_rng(batch)
    vocab = llm.runner.arch.vocab_size
    reqs = [GenerationRequest(i, rng.integers(3, vocab, context - 8).tolist(),
                              SamplingParams(max_tokens=steps + 8, ignore_eos=True)) for i in range(batch)]
    probe = StepProbe(llm, batch, phases=phases)
    try:
        llm.generate(reqs, use_tqdm=False)
        res = probe.summary()
    finally:
        probe.close()
        llm.close()
    return res


def moe_model(layers: int, batches: list[int], context: int):
    """(checkpoint folder, arch, {batch: weight bytes a decode step of that batch reads})."""
    from paddle_mla.worker.model_runner import ModelRunner

    folder, cfg = moe_checkpoint(layers)
    path = str(folder)
    b = max(batches)
    runner = ModelRunner(config_from_dict({
        "model": path, "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"},
        "cuda_graph": False, "max_model_len": context + 64, "cache": {"block_size": PAGE, "num_blocks": b * 66 + 8},
        "scheduler": {"max_num_seqs": b, "max_num_batched_tokens": 8192}}), path)
    weight_bytes = {}
    for n in batches:
        experts = routed_distinct(runner, step_batch(runner, n, 1, context - 1, PAGE, False, 0))
        weight_bytes[n] = decode_bytes(cfg, experts, n, context, 2)[0]
    arch = runner.arch
    del runner
    runtime.empty_cache()
    return path, arch, weight_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--host-batch", type=int, default=256, help="a batch measured for host time (0: none)")
    ap.add_argument("--host-context", type=int, default=1024, help="its context (host work is O(batch))")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per case")
    ap.add_argument("--moe", action="store_true",
                    help="V2-Lite dims (routed MoE) from the e2e MoE benchmark's checkpoint")
    ap.add_argument("--overlap", choices=("both", "on", "off"), default="both",
                    help="overlapped scheduling on, off or both (a host-time check: --batch '' --overlap on)")
    ap.add_argument("--phases", action="store_true", help="host time per phase of the steady decode step")
    ap.add_argument("--cuda-decode", choices=("both", "on", "off"), default="on",
                    help="attention.cuda_decode: on (the engine's default: the SM90 mla_decode CUDA op where it "
                         "can serve), off (the Triton decode) or both side by side")
    ap.add_argument("--cache-dtype", choices=("auto", "fp8_e4m3", "both"), default="auto",
                    help="cache.dtype: the model's (bf16), the FP8 latent cache, or both side by side")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = runtime.device_string("gpu")
    bw = copy_bandwidth(device)
    model_dir = "tiny"
    cases = [(int(b), args.context) for b in args.batch.split(",") if b]
    if args.host_batch:
        cases.append((args.host_batch, args.host_context))
    if args.moe:
        model, (model_dir, arch, weight_bytes) = None, moe_model(args.layers, [b for b, _ in cases], args.context)
    else:
        model, arch = dense_v3_model(args.layers, device, torch.bfloat16)
        dense_bytes = sum(p.numel() * p.element_size() for p in model_tensors(model))
        weight_bytes = {b: dense_bytes for b, _ in cases}
    rows = []
    for b, ctx in cases:
        switches = [{"both": (True, False), "on": (True,), "off": (False,)}[x]
                    for x in (args.overlap, args.cuda_decode)]
        dtypes = ("auto", "fp8_e4m3") if args.cache_dtype == "both" else (args.cache_dtype,)
        for overlap, cuda, cache_dtype in itertools.product(*switches, dtypes):
            r = run_case(model, b, ctx, args.steps, overlap, model_dir, args.phases, cuda, cache_dtype)
            row_bytes = row_width(arch.mla.latent_dim) if cache_dtype != "auto" else arch.mla.latent_dim * 2
            kv_bytes = b * ctx * row_bytes * args.layers
            r.update(batch=b, context=ctx, overlap=overlap, cuda_decode=cuda, cache_dtype=cache_dtype,
                     roofline_ms=(weight_bytes[b] + kv_bytes) / bw * 1e3)
            r["x_roofline"] = r["period"] / r["roofline_ms"]
            rows.append(r)
            print(f"batch {b} context {ctx} overlap {overlap} cuda_decode {cuda} cache {cache_dtype}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in r.items() if isinstance(v, float) and not k.startswith("phase:")),
                flush=True)
            if args.phases:
                phases = sorted(((k[6:], v) for k, v in r.items() if k.startswith("phase:")), key=lambda kv: -kv[1])
                print("| host phase (median ms per steady decode step, wall clock) | ms |\n| --- | ---: |\n"
                      + "\n".join(f"| {k} | {v:.3f} |" for k, v in phases)
                      + f"\n| sum of phase medians | {sum(v for _, v in phases):.3f} |"
                      f"\n| host (median of per-step totals) | {r['host']:.3f} |", flush=True)
    print(f"\n{'V2-Lite dims (MoE)' if args.moe else 'dense V3 dims'}, copy bandwidth {bw / 1e12:.2f} TB/s, weight "
          f"bytes read per step {', '.join(f'b{b}: {w / 1e9:.2f} GB' for b, w in weight_bytes.items())}, "
          f"layers {args.layers}")
    print("| batch | context | overlap | CUDA decode | cache | step period ms | host ms | GPU ms | gap ms | gap / step "
          "| syncs | reads | roofline ms | period / roofline |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['context']} | {r['overlap']} | {r['cuda_decode']} | {r['cache_dtype']} | "
              f"{r['period']:.3f} | "
              f"{r['host']:.3f} | "
              f"{r['gpu']:.3f} | {r['gap']:.3f} | {r['gap'] / r['period']:.1%} | {r['syncs']:.0f} | {r['reads']:.0f} | "
              f"{r['roofline_ms']:.3f} | {r['x_roofline']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bw": bw, "weight_bytes": weight_bytes, "moe": args.moe, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
