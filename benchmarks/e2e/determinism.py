"""Do a request's tokens depend on how it was batched? One workload, six engine configurations,
default mode and ``deterministic: true`` side by side.

The workload: ``--requests`` prompts of ``--prompt`` random tokens in groups of four sharing their
first half (so the prefix cache hits), ``--output`` tokens each, ignore_eos. Every fourth request
samples (temperature 1, top_p 0.9, its own seed); the others are greedy. Configurations:
  batch1    scheduler.max_num_seqs 1: every request alone (the reference)
  batch256  scheduler.max_num_seqs 256
  chunked   chunked prefill with a ``--chunk``-token step budget, 256 sequences
  prefix    prefix caching on, 256 sequences
  preempt   a KV pool of 16-token blocks holding two prompts and one block more: requests preempt
            one another as they grow, and are recomputed from their tokens (the count is printed)
  dp2       parallel.data_parallel_size 2 (2 GPUs; on CPU two processes; skipped on one GPU)
For each mode the table counts the requests whose tokens differ from that mode's batch1 run (and
the earliest position of a difference), then times both modes on the batch256 engine, warm: the
prefill (the workload with max_tokens 1) and the decode step ((whole workload - prefill) / (output - 1)).
``--profile`` (GPU) adds both modes' device time per kernel category of the prefill and of one decode
step (torch.profiler, one run of each): where the mode's extra time goes.

The model: random weights (``load_format: dummy``) of DeepSeek-V2-Lite (``--dims v2-lite``, MoE) or
Qwen3-8B (``--dims qwen3``, GQA, ``append_attn``) cut to ``--layers``, from ``benchmarks/harness/dims.py``.
``--set KEY=VALUE`` applies to every run.

  python -m benchmarks.e2e.determinism                                   # GPU, bf16, V2-Lite dims
  python -m benchmarks.e2e.determinism --smoke                           # CPU, fp32, tiny dims (interpreter)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.checkpoints import dummy_model_dir
from benchmarks.harness.dims import QWEN3_8B, SMOKE_GQA, SMOKE_MOE, V2_LITE
from paddle_mla.cli.bench.determinism import VARIANTS, compare, outputs, row_text, variant_config

MODES = ("default", "deterministic")


def workload(n: int, prompt: int, output: int, vocab: int, seed: int = 0) -> list:
    """(prompt ids, sampling params) pairs: groups of four share their first half; every fourth samples."""
    from paddle_mla.sched.request import SamplingParams

    rng = np.random.default_rng(seed)
    out, shared = [], []
    for i in range(n):
        if i % 4 == 0:
            shared = rng.integers(3, vocab - 1, prompt // 2).tolist()
        ids = shared + rng.integers(3, vocab - 1, prompt - prompt // 2).tolist()
        sampled = i % 4 == 3
        params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=1.0 if sampled else 0.0,
                                top_p=0.9 if sampled else 1.0, seed=1000 + i if sampled else None, logprobs=True)
        out.append((ids, params))
    return out


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_overrides(texts) -> dict:
    """``--set a.b=v`` texts as one nested dict (values parsed as the config's --set parses them)."""
    from paddle_mla.config.schema import parse_override

    out: dict = {}
    for text in texts:
        keys, value = parse_override(text)
        node: dict = {keys[-1]: value}
        for part in reversed(keys[:-1]):
            node = {part: node}
        out = merge(out, node)
    return out


def model_folder(dims: str, layers: int, smoke: bool, heads: int = 0) -> tuple[str, dict]:
    """A folder with only config.json: the engine draws the weights (``load_format: dummy``).
    ``heads`` > 0: that many query heads (MLA dims: as many KV heads too)."""
    base, tiny = (V2_LITE, SMOKE_MOE) if dims == "v2-lite" else (QWEN3_8B, SMOKE_GQA)
    cfg = dict(base, num_hidden_layers=layers, **(tiny if smoke else {}))
    if heads:
        cfg.update(num_attention_heads=heads, **({"num_key_value_heads": heads} if dims == "v2-lite" else {}))
    tag = f"{dims}_{layers}L{f'_{heads}h' if heads else ''}{'_smoke' if smoke else ''}"
    path = dummy_model_dir(Path(tempfile.gettempdir()) / f"determinism_{tag}", cfg)
    return str(path), cfg


def make_engine(cfg_dict: dict):
    from paddle_mla.config.schema import config_from_dict

    cfg = config_from_dict(cfg_dict)
    if cfg.parallel.data_parallel_size > 1:
        from paddle_mla.integrations.data_parallel import DataParallelLLM
        return DataParallelLLM(cfg)
    from paddle_mla.engine.llm import LLM
    return LLM(cfg)


def generate(llm, work, max_tokens: int | None = None) -> list[tuple[list[int], list[float]]]:
    """Per request: (tokens, the sampled tokens' logprobs), as ``outputs`` of the CLI check."""
    import dataclasses

    from paddle_mla.sched.request import GenerationRequest

    reqs = [GenerationRequest(i, ids, p if max_tokens is None else dataclasses.replace(p, max_tokens=max_tokens))
            for i, (ids, p) in enumerate(work)]
    return outputs(llm, reqs)


def timing(llm, work, output: int, repeats: int) -> dict:
    """Warm timings on one engine: best of ``repeats`` (the workload was run once already)."""
    from paddle_mla.platform import runtime

    def run(max_tokens):
        best = float("inf")
        for _ in range(repeats):
            runtime.synchronize()
            t = time.perf_counter()
            generate(llm, work, max_tokens)
            best = min(best, time.perf_counter() - t)
        return best

    prefill = run(1)
    whole = run(output)
    return {"prefill_s": prefill, "decode_step_ms": 1e3 * (whole - prefill) / max(output - 1, 1)}


def phase_profile(llm, work, output: int) -> dict:
    """Device ms per kernel category of the prefill and of one decode step (harness.kernel_profile)."""
    from benchmarks.harness.kernel_profile import category_ms, kernel_ms, phase_split, profiled

    prefill = profiled(lambda: generate(llm, work, 1), 1, 0)
    whole = profiled(lambda: generate(llm, work), 1, 0)
    res = phase_split(category_ms(prefill), category_ms(whole), output - 1)
    step = phase_split(kernel_ms(prefill), kernel_ms(whole), output - 1)["decode_step"]
    res["decode_kernels"] = dict(sorted(step.items(), key=lambda kv: -kv[1])[:10])   # the costliest kernels
    return res


def print_profile(results: dict) -> None:
    modes = [m for m in results if "profile" in results[m]]
    if not modes:
        return
    for phase in ("prefill", "decode_step"):
        cats = sorted({c for m in modes for c in results[m]["profile"][phase]},
                      key=lambda c: -max(results[m]["profile"][phase].get(c, 0.0) for m in modes))
        print(f"\n| {phase} (device ms, by kernel category) | " + " | ".join(modes) + " |")
        print("| --- |" + " ---: |" * len(modes))
        for c in cats:
            print(f"| {c} | " + " | ".join(f"{results[m]['profile'][phase].get(c, 0.0):.3f}" for m in modes) + " |")
    for m in modes:
        print(f"\n| {m}: costliest kernels of a decode step | device ms |\n| --- | ---: |")
        for name, ms in results[m]["profile"].get("decode_kernels", {}).items():
            print(f"| `{name}` | {ms:.3f} |")


def run_mode(mode: str, args, base: dict, work, variants) -> dict:
    res: dict = {"rows": {}, "tokens": {}}
    over = set_overrides(args.set)
    for name in variants:
        cfg = merge(merge(merge(base, variant_config(name, args.chunk, args.prompt, args.output)),
                          {"deterministic": mode == "deterministic"}),
                    over)
        try:
            llm = make_engine(cfg)
        except Exception as exc:   # a combination the config layer rejects: say so in the table
            res["rows"][name] = {"error": str(exc).splitlines()[-1].strip()}
            continue
        try:
            res["tokens"][name] = generate(llm, work)
            preemptions = llm.stats().num_preemptions if name == "preempt" else 0
            if name == "batch256" and args.time:
                res["timing"] = timing(llm, work, args.output, args.repeats)
            if name == "batch256" and args.profile:
                res["profile"] = phase_profile(llm, work, args.output)
        finally:
            llm.close()
        if name != "batch1" and "batch1" in res["tokens"]:
            res["rows"][name] = compare(res["tokens"]["batch1"], res["tokens"][name])
            if name == "preempt":
                res["rows"][name]["preemptions"] = preemptions
            print(f"[{mode}] {name}: {res['rows'][name]}", file=sys.stderr, flush=True)
        if name == "batch256" and "timing" in res:
            print(f"[{mode}] timing: {res['timing']}", file=sys.stderr, flush=True)
    return res


def print_table(results: dict, device: str, args) -> None:
    heads = f", {args.heads} heads" if args.heads else ""
    print(f"\n### Determinism check: {args.dims} dims{heads}, {args.layers} layers, {device}, {args.dtype or 'auto'} "
          f"({args.requests} requests x {args.prompt} prompt + {args.output} output tokens)\n")
    modes = list(results)
    print("(requests whose tokens differ from the mode's batch1 run; in brackets, those whose tokens or "
          "logprob bits differ)\n")
    print("| configuration | " + " | ".join(f"{m}: requests differing from batch1" for m in modes) + " |")
    print("| --- |" + " --- |" * len(modes))
    names = [v for v in VARIANTS if any(v in results[m]["rows"] for m in modes)]
    for v in names:
        cells = []
        for m in modes:
            r = results[m]["rows"].get(v)
            if r is None:
                cells.append("reference" if v == "batch1" and "batch1" in results[m]["tokens"] else "not run")
            elif "error" in r:
                cells.append(f"rejected: {r['error']}")
            else:
                cells.append(f"{row_text(r)} [{r['bits_differ']}]")
        print(f"| {v} | " + " | ".join(cells) + " |")
    timed = [m for m in modes if "timing" in results[m]]
    if timed:
        print("\n| mode | prefill of the workload (s) | decode step (ms) |")
        print("| --- | --- | --- |")
        for m in timed:
            t = results[m]["timing"]
            print(f"| {m} | {t['prefill_s']:.3f} | {t['decode_step_ms']:.2f} |")
        if set(timed) == set(MODES):
            a, b = results["default"]["timing"], results["deterministic"]["timing"]
            print(f"| deterministic / default | {b['prefill_s'] / a['prefill_s']:.2f}x | "
                  f"{b['decode_step_ms'] / a['decode_step_ms']:.2f}x |")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", choices=("v2-lite", "qwen3"), default="v2-lite")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=0,
                    help="query heads instead of the dims' own "
                         "(e.g. 128: DeepSeek-V2/V3's at TP=1 on V2-Lite's other dims)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=512, help="step token budget of the chunked configuration")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dtype", default="", help="default: bfloat16 on a GPU, float32 with --smoke")
    ap.add_argument("--backend", default="", help="default: triton_mla (MLA dims), append_attn (qwen3)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, fp32, Triton interpreter")
    ap.add_argument("--no-time", dest="time", action="store_false")
    ap.add_argument("--profile", action="store_true", help="kernel-category profile of both modes (GPU only)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from paddle_mla.platform import runtime

    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before any Triton import; replicas inherit it
    runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))
    device = "cpu" if args.smoke or not runtime.gpu_available() else "gpu"
    args.dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    if args.profile and device != "gpu":
        print("--profile: needs a GPU (it reads CUDA kernel activity); skipped", file=sys.stderr)
        args.profile = False
    path, mcfg = model_folder(args.dims, args.layers, args.smoke, args.heads)
    backend = args.backend or ("triton_mla" if args.dims == "v2-lite" else "append_attn")
    base = {"model": path, "runtime": runtime.name(), "device": device, "dtype": args.dtype, "load_format": "dummy",
            "attention": {"backend": backend}, "max_model_len": args.prompt + args.output + 16}
    variants = [v for v in args.variants.split(",") if v]
    if "dp2" in variants and device == "gpu" and runtime.gpu_count() < 2:
        print("dp2: skipped (needs 2 GPUs)", file=sys.stderr)
        variants.remove("dp2")
    work = workload(args.requests, args.prompt, args.output, mcfg["vocab_size"])
    results = {m: run_mode(m, args, base, work, variants) for m in args.modes.split(",") if m}
    where = "CPU" if device == "cpu" else runtime.device_name()
    print_table(results, where, args)
    print_profile(results)
    summary = {m: {"rows": r["rows"], "timing": r.get("timing"), "profile": r.get("profile")}
               for m, r in results.items()}
    if args.json:
        Path(args.json).write_text(json.dumps({"device": where, "args": vars(args), "results": summary}, indent=1))
    return summary


if __name__ == "__main__":
    main()
