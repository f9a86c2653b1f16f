"""``benchmarks.e2e.chunked_itl --profile``: where the chunked shared-prefix workload's time goes, step by step.

For each engine config: a warm-up, then run 1 (every step timed by ``step_probe.StepProbe`` with the
host phases) and run 2 (the same requests, so the same steps, under ``torch.profiler`` with every
kernel attributed to its step). A helper module of that script, not a script.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import numpy as np

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from benchmarks.harness.step_probe import (EXTEND, StepProbe, step_kernels, step_kernels_by_launch,  # noqa: E402
                                           step_kind)
from paddle_mla.cli.bench.runner import run_once  # noqa: E402
from paddle_mla.cli.bench.workloads import build_requests, make_workload  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402

KINDS = ("prefill chunk (+ decodes)", "admission: short extends (+ decodes)", "decode only", "no launch (last reads)")


def _profiled_run(llm, reqs):
    from torch.profiler import ProfilerActivity, profile

    acts = [a for a in (ProfilerActivity.CPU, ProfilerActivity.CUDA) if a in torch.profiler.supported_activities()]
    probe = StepProbe(llm, profile=True)
    try:
        with profile(activities=acts) as prof:
            run_once(llm, reqs, 1)
            runtime.synchronize()
    finally:
        probe.close()
    kern, total = step_kernels(prof)
    try:
        by_launch = step_kernels_by_launch(prof)
    except Exception as e:      # a profiler build without these fields: the op-tree attribution only
        print(f"[profile] attribution by launch failed: {e!r}", flush=True)
        by_launch = {}
    return [r["comp"] for r in probe.recs], kern, by_launch, total


def profile_config(name: str, cfg_dict: dict, args) -> dict:
    w = make_workload("shared-prefix", {"num_prompts": args.prompts, "prefix_len": args.prefix,
                                        "suffix_len": args.suffix, "output_len": args.output})
    llm = LLM(config_from_dict(cfg_dict))
    tok, max_len = llm.tokenizer, llm.max_model_len

    def reqs(wl):
        return build_requests(wl, tok, GenerationRequest, SamplingParams, max_len)

    try:
        warm = make_workload(w.kind, {**w.params, "num_prompts": args.warmup}).with_seed_offset(100_003)
        list(llm.stream(reqs(warm)))
        probe = StepProbe(llm, phases=True)
        try:
            run = run_once(llm, reqs(w), 0)
            t_end = time.perf_counter()
            gpu = probe.gpu_ms()
        finally:
            probe.close()
        recs, periods = probe.recs, probe.periods(t_end)
        comps2, kern, by_launch, kernel_total = _profiled_run(llm, reqs(w))
    finally:
        llm.close()
        llm = None      # the next config's engine gets the memory (profile_configs frees it)
    same = [r["comp"] for r in recs] == comps2
    steps = []
    for i, r in enumerate(recs):
        k = kern.get(i, {}) if same else {}
        kl = by_launch.get(i, {}) if same else {}
        steps.append(dict(i=i, kind=step_kind(r["comp"]), comp=r["comp"], period_ms=periods[i], host_ms=r["host"] * 1e3,
                          wait_ms=r["wait"] * 1e3, syncs=r["syncs"], launch_host_ms=r["launch_host"] * 1e3,
                          gpu_event_ms=gpu[i],
                          phases=r["phases"], kernel_ms=k.get("kernel_ms"), kernels=k.get("kernels"),
                          kernel_ms_launch=kl.get("kernel_ms"), kernels_launch=kl.get("kernels"),
                          cats=k.get("cats", {}), regions=k.get("regions", {})))
    itl = np.asarray(run.itl_s) * 1e3
    return dict(name=name, elapsed_s=run.elapsed_s, out_tok_s=run.output_tokens_per_s,
                itl_p50=float(np.percentile(itl, 50)), itl_p90=float(np.percentile(itl, 90)),
                itl_p99=float(np.percentile(itl, 99)), itl_samples=len(itl), same_steps=same,
                kernel_total_ms=kernel_total, kernel_attributed_ms=sum(v["kernel_ms"] for v in kern.values()),
                kernel_by_launch_ms=sum(v["kernel_ms"] for v in by_launch.values()),
                steps=steps)


def _f(v, fmt=".2f") -> str:
    return "-" if v is None or v != v else format(v, fmt)


def _sum(steps, key):
    vals = [s[key] for s in steps if s[key] is not None]
    return sum(vals) if vals else None


def report(res: list[dict], top: int) -> None:
    print("\n## Configs (run 1: timed steps; run 2: the same steps under torch.profiler)")
    print("| config | elapsed s | out tok/s | ITL p50 / p90 / p99 ms | samples | steps | run 2 same steps | "
          "kernels seen ms | attributed to steps: by op tree / by launch call ms |\n"
          "|---|---:|---:|---|---:|---:|---|---:|---|")
    for r in res:
        print(f"| {r['name']} | {r['elapsed_s']:.3f} | {r['out_tok_s']:.0f} | "
              f"{r['itl_p50']:.2f} / {r['itl_p90']:.2f} / "
              f"{r['itl_p99']:.2f} | {r['itl_samples']} | {len(r['steps'])} | {r['same_steps']} | "
              f"{r['kernel_total_ms']:.1f} | {r['kernel_attributed_ms']:.1f} / {r['kernel_by_launch_ms']:.1f} |")
    print("\n## Time by kind of step, summed over the run (ms)\n"
          "wall: the steps' periods; host: time in _step less the wait for tokens; launch host: of which in "
          "runner.launch; GPU events: device time between the events around launch (kernels + idle); kernels: "
          "run 2's kernel time; extend: of which in the extend region (cached prefix + new rows expanded "
          "through kv_b_proj, attended), by the profiler's op tree, which may miss kernels (a lower bound; the "
          "'launch' column attributes every kernel)")
    print("| config | kind | steps | wall | host | launch host | wait | GPU events | kernels (op tree / launch) | "
          "kernel count | extend | extend GEMMs |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in res:
        for kind in KINDS:
            st = [s for s in r["steps"] if s["kind"] == kind]
            if not st:
                continue
            ext = sum(s["regions"].get(EXTEND, 0.0) for s in st)
            ext_gemm = sum(s["regions"].get(EXTEND + " / dense GEMM (cuBLAS)", 0.0) for s in st)
            print(f"| {r['name']} | {kind} | {len(st)} | {_sum(st, 'period_ms'):.1f} | {_sum(st, 'host_ms'):.1f} | "
                  f"{_sum(st, 'launch_host_ms'):.1f} | {_sum(st, 'wait_ms'):.1f} | "
                  f"{_f(_sum(st, 'gpu_event_ms'), '.1f')} | "
                  f"{_f(_sum(st, 'kernel_ms'), '.1f')} / {_f(_sum(st, 'kernel_ms_launch'), '.1f')} | "
                  f"{_f(_sum(st, 'kernels'), '.0f')} | {ext:.1f} | {ext_gemm:.1f} |")
    on = res[-1]
    slow = sorted(on["steps"], key=lambda s: -s["period_ms"])[:top]
    print(f"\n## The {top} slowest steps of '{on['name']}' (ITL p99 {on['itl_p99']:.2f} ms), ms")
    print("| step | decodes + short ext + chunk tok | period | host | launch host | forward launches | GPU events | "
          "kernels (op tree / launch) | count | syncs | by region / category |\n"
          "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for s in slow:
        c = s["comp"] or {}
        parts = {**{k: v for k, v in s["regions"].items() if " / " not in k},
                 **{k: v for k, v in s["cats"].items() if not k.startswith("attn")}}
        top_parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:5])
        print(f"| {s['i']} | {c.get('decodes', '-')} + {c.get('short_extends', '-')} + {c.get('chunk_tokens', '-')} | "
              f"{s['period_ms']:.2f} | {s['host_ms']:.2f} | {s['launch_host_ms']:.2f} | "
              f"{s['phases'].get('forward (model op launches / graph replay)', 0.0):.2f} | {_f(s['gpu_event_ms'])} | "
              f"{_f(s['kernel_ms'])} / {_f(s['kernel_ms_launch'])} | {_f(s['kernels'], '.0f')} | {s['syncs']} | "
              f"{top_parts} |")
    for kind in ("admission: short extends (+ decodes)", "prefill chunk (+ decodes)", "decode only"):
        st = [s for s in on["steps"] if s["kind"] == kind]
        if not st:
            continue
        names = sorted({k for s in st for k in s["phases"]})
        print(f"\n## Host phases of '{on['name']}', {kind} ({len(st)} steps), ms per step (mean; wall clock)")
        print("| phase | mean | max |\n|---|---:|---:|")
        for k in sorted(names, key=lambda k: -np.mean([s["phases"].get(k, 0.0) for s in st])):
            v = [s["phases"].get(k, 0.0) for s in st]
            print(f"| {k} | {np.mean(v):.3f} | {max(v):.3f} |")
        print(f"| host (in _step, less the wait) | {np.mean([s['host_ms'] for s in st]):.3f} | "
              f"{max(s['host_ms'] for s in st):.3f} |")


def profile_configs(configs: list[tuple[str, dict]], args) -> None:
    res = []
    for name, cfg in configs:
        print(f"[profile] {name}", flush=True)
        res.append(profile_config(name, cfg, args))
        gc.collect()
        runtime.empty_cache()
        if torch.cuda.is_available():   # the next engine sizes its cache by the free memory
            print(f"[profile] after {name}: {torch.cuda.memory_allocated() / 2**30:.2f} GiB still allocated",
                  flush=True)
    report(res, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=float) + "\n")
