"""Where a step's GPU time goes: a per-category kernel table (torch.profiler, CUDA activity only).

The profiles behind the missed targets of issues 9 and 10 (BENCHMARKS.md section 12). Each case
runs one runner step (``forward_step`` + greedy sampling + its one host read) eagerly, so every
kernel is seen by the profiler; kernel times are those of a graph replay minus launch gaps.

  dense-decode  dense V3 dims (bench_e2e_decode.V3), batch 64 at 4k context (issue 9's 1.65x)
  short         63 decodes at 8k + 15 short extends of 64 tokens over one 8k prefix: the slow steps
                of the chunked shared-prefix workload (issue 9's ITL p99)
  chunk         63 decodes at 8k + one 1024-token chunk after 7168 cached tokens
  moe-short     V2-Lite dims: 47 decodes at 8k + 15 short extends of 64 tokens over one 8k prefix,
                chunk budget 1024 (the ITL p99 step of bench_chunked_itl.py), and its 47 decodes alone
  moe-decode    DeepSeek-V2-Lite dims (routed MoE), batch 64 at 4k context (issue 10's decode step)
  moe-prefill   V2-Lite dims, 64 x 512-token prefill (issue 10's prefill)
  fp8-m1        FP8 block-scaled linears at M=1 (V3 q_a_proj 1536x7168, kv_a 576x7168, expert down
                7168x2048) next to bf16 F.linear: the fixed costs behind issue 10's FP8 miss
  moe-m1        the fused MoE at M=1 (V2-Lite bf16, V3 fp8): align, GEMMs, sum (issue 10's M=1 miss)
  moe-large     the fused MoE at V3 fp8 shapes, M=4096 and 16384, ours next to SGLang's sequence
                (./third_party, tools/fetch_sglang_fused_moe.sh): every kernel of one call in launch
                order with its mean µs (both GEMMs of a side share a name): issue 10's large-M miss
  dsa-b1        one layer of DeepSeek-V3.2 dims (dsa) and of V3 (triton_mla), one decode row at 32k:
                every kernel of one step in launch order with its mean µs (the b=1 cost of the indexer)
  e2e-steps     not a kernel table: issue 10's end-to-end workload (256 x 512 in, 128 out, V2-Lite
                dims, graphs) through ``LLM.generate``, with every step's wall time grouped by kind
                (steps with prefill tokens, decode-only steps by batch size): where the run's time goes

    python tools/profile_kernels.py --cases dense-decode,short,chunk,moe-decode,moe-prefill --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

_TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_TOOLS), _TOOLS]

from bench_e2e_decode import V3, random_weights  # noqa: E402  (selects the runtime: torch by default)
from bench_mixed_step import batches, short_batch  # noqa: E402

from paddle_mla.platform import runtime  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402
from paddle_mla.models import parse_arch  # noqa: E402
from paddle_mla.models.deepseek import CausalLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

# first match wins; names are those of our Triton kernels and of cuBLAS / PyTorch kernels
CATEGORIES = [
    ("attn: MLA decode (split-KV)", r"_decode_stage1|_plan_kernel"),
    ("attn: split merge", r"_decode_stage2|_merge_kernel"),
    ("attn: extend/prefill", r"_extend_kernel|flash|fmha|attention"),
    ("attn: latent interleave/cache write/gather", r"_interleave_kernel|_write_latent_cache|_gather_rows|_gather_groups"),
    ("MoE: grouped GEMM", r"grouped_gemm"),
    ("MoE: align/sum", r"_count_kernel|_offsets_kernel|_scatter_kernel|sum_topk"),
    ("FP8 GEMM + quant", r"_w8a8|_group_quant|_split_k_reduce"),
    ("dense GEMM (cuBLAS)", r"gemm|cutlass|nvjet|sm90_xmma|sm80_xmma|ampere|magma|splitK|Kernel2"),
    ("routing: topk/sort/softmax", r"topk|sort|softmax|radix|bitonic"),
    ("norm (RMSNorm)", r"rsqrt|norm"),
    ("copies", r"copy|Memcpy|Memset|cat|index|gather|scatter"),
    ("elementwise/reduce", r"elementwise|vectorized|reduce|unrolled"),
]


def categorize(name: str) -> str:
    for cat, pat in CATEGORIES:
        if re.search(pat, name, re.IGNORECASE):
            return cat
    return "other"


def profiled(fn, iters: int, warmup: int):
    """A ``torch.profiler`` run (CUDA activity only) of ``iters`` calls of ``fn`` after ``warmup`` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    runtime.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        runtime.synchronize()
    return prof


def kernel_table(step, iters: int) -> dict:
    """Per-category device ms per step, and the 12 costliest kernels, over ``iters`` eager steps."""
    prof = profiled(step, iters, 3)
    cats: dict[str, float] = {}
    kernels = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if not us:
            continue
        ms = us / 1e3 / iters
        cats[categorize(ev.key)] = cats.get(categorize(ev.key), 0.0) + ms
        kernels.append((ms, ev.count // iters, ev.key[:90]))
    total = sum(cats.values())
    kernels.sort(reverse=True)
    return {"device_ms": total, "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [dict(ms=m, calls=c, name=n) for m, c, n in kernels[:12]]}


def make_step(runner: ModelRunner, batch):
    zeros = np.zeros(int(batch.sample_mask.sum()))

    def step():
        logits = runner.forward_step(batch)
        return sampler.sample(logits, zeros, zeros.astype(np.int64), zeros + 1, zeros.astype(np.int64),
                              zeros.astype(np.int64)).tolist()
    return step


def dense_runner(layers: int, num_seqs: int, num_blocks: int, max_len: int, tokens: int) -> ModelRunner:
    cfg = dict(V3, num_hidden_layers=layers)
    model = CausalLM(parse_arch(cfg), random_weights(cfg, layers, "cuda", torch.bfloat16), "cuda", torch.bfloat16)
    runner = ModelRunner(config_from_dict({
        "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"}, "cuda_graph": False,
        "cache": {"block_size": 64, "num_blocks": num_blocks}, "max_model_len": max_len,
        "scheduler": {"max_num_seqs": num_seqs, "max_num_batched_tokens": tokens, "enable_chunked_prefill": True}}),
        model=model)
    for cache in runner.kv_caches:
        cache.normal_(0.0, 1.0)
    return runner


def moe_checkpoint(layers: int) -> Path:
    """The random V2-Lite-dims checkpoint of bench_e2e_moe (written once, shared with that tool)."""
    from bench_loader import V2_LITE, write_checkpoint

    path = Path(f"/tmp/bench_e2e_moe_{layers}L")
    if not (path / "config.json").exists():
        write_checkpoint(path, dict(V2_LITE, num_hidden_layers=layers), 5 * 10 ** 9)
    return path


def moe_runner(layers: int, max_len: int = 4160, num_blocks: int = 64 * 66 + 8, tokens: int = 32768):
    from bench_e2e_moe import step_batch

    path = moe_checkpoint(layers)
    runner = ModelRunner(config_from_dict({
        "model": str(path), "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"},
        "cuda_graph": False, "max_model_len": max_len, "cache": {"block_size": 64, "num_blocks": num_blocks},
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": tokens, "enable_chunked_prefill": True}}),
        str(path))
    for cache in runner.kv_caches:
        cache.normal_(0.0, 1.0)
    return runner, step_batch


def run_cases(cases: list[str], layers: int, iters: int) -> dict:
    out: dict = {"device": runtime.device_name(), "layers": layers}
    if "dense-decode" in cases:
        r = dense_runner(layers, 64, 64 * 65 + 8, 4160, 8192)
        dec, _, _ = batches(64, 4096, 1, 0, 64, 64 * 65 + 8)
        out["dense-decode"] = kernel_table(make_step(r, dec), iters)
        del r
        runtime.empty_cache()
    if "short" in cases or "chunk" in cases:
        nb = 63 * 128 + 129 + 128 + 15 * 2 + 8
        r = dense_runner(layers, 80, nb, 8192 + 1024 + 64, 8192)
        dec, _, mixed = batches(63, 8192, 1024, 7168, 64, 63 * 128 + 129)
        if "chunk" in cases:
            out["chunk"] = kernel_table(make_step(r, mixed), iters)
            out["chunk-decode-only"] = kernel_table(make_step(r, dec), iters)
        if "short" in cases:
            sb = short_batch(dec, 15, 64, 8192, 64, 63 * 128 + 129)
            out["short"] = kernel_table(make_step(r, sb), iters)
        del r
        runtime.empty_cache()
    if "moe-decode" in cases or "moe-prefill" in cases:
        r, step_batch = moe_runner(layers)
        if "moe-decode" in cases:
            out["moe-decode"] = kernel_table(make_step(r, step_batch(r, 64, 1, 4095, 64, False, 0)), iters)
        if "moe-prefill" in cases:
            out["moe-prefill"] = kernel_table(make_step(r, step_batch(r, 64, 512, 0, 64, True, 1)), max(2, iters // 4))
        del r
        runtime.empty_cache()
    if "moe-short" in cases:
        used = 47 * 130 + 129
        r, _ = moe_runner(layers, 8192 + 192, used + 128 + 15 * 2 + 8, 1024)
        dec, _, _ = batches(47, 8256, 1, 0, 64, used)
        out["moe-short"] = kernel_table(make_step(r, short_batch(dec, 15, 64, 8192, 64, used)), iters)
        out["moe-short-decode-only"] = kernel_table(make_step(r, dec), iters)
        del r
        runtime.empty_cache()
    if "fp8-m1" in cases:
        out.update(fp8_m1(iters))
    if "moe-m1" in cases:
        out.update(moe_m1(iters))
    if "moe-large" in cases:
        out.update(moe_large(iters))
    if "dsa-b1" in cases:
        from bench_dsa import E2E_MODELS, e2e_runner

        for name in E2E_MODELS:
            r, batch = e2e_runner(name, 1, 1, 32768, False)
            out[f"dsa-b1 {name}"] = kernel_sequence(make_step(r, batch), iters)
            del r
            runtime.empty_cache()
    if "e2e-steps" in cases:
        out["e2e-steps"] = e2e_steps(layers)
    return out


def fp8_m1(iters: int) -> dict:
    import torch.nn.functional as F
    from bench_fp8_linear import make_fp8

    from paddle_mla.models.fp8 import fp8_linear

    out = {}
    for n, k in ((1536, 7168), (576, 7168), (7168, 2048)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        w8 = make_fp8(w)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        out[f"fp8-m1 {n}x{k}"] = kernel_table(lambda: fp8_linear(x, w8), iters * 10)
        out[f"bf16-m1 {n}x{k}"] = kernel_table(lambda: F.linear(x, w), iters * 10)
    return out


def moe_m1(iters: int) -> dict:
    from fused_moe_bench_lib import SHAPES, act_quant_fn, make_inputs, make_weights

    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    out = {}
    for key, fp8 in (("v2lite", False), ("v3", True)):
        shape = SHAPES[key]
        wts = make_weights(shape, fp8)
        ws = MoEWorkspace(64, shape.top_k, shape.E, shape.N, shape.K, torch.bfloat16, "cuda", fp8=fp8)
        scales = dict(w_gate_scale=wts.s_gate, w_up_scale=wts.s_up, w_down_scale=wts.s_down,
                      act_quant=act_quant_fn()[0]) if fp8 else {}
        x, ids, w = make_inputs(shape, 1)
        out[f"moe-m1 {shape.name} {'fp8' if fp8 else 'bf16'}"] = kernel_table(
            lambda: fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws, **scales), iters * 10)
        del wts, ws
    return out


def kernel_sequence(fn, iters: int) -> list[dict]:
    """Kernels of one ``fn`` call in launch order, each with its mean µs over ``iters`` calls (a chrome
    trace read back: key_averages would merge two launches of one kernel, e.g. the two MoE GEMMs)."""
    import tempfile

    prof = profiled(fn, iters, 2)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    evs = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                 key=lambda e: e["ts"])
    per = len(evs) // iters
    if per * iters != len(evs):     # a call that launches a varying set: totals by name instead of an order
        tot: dict[str, float] = {}
        for e in evs:
            tot[e["name"][:70]] = tot.get(e["name"][:70], 0.0) + e["dur"]
        return [dict(name=f"(by name) {k}", us=v / iters) for k, v in tot.items()]
    return [dict(name=evs[i]["name"][:70], us=sum(evs[j * per + i]["dur"] for j in range(iters)) / iters)
            for i in range(per)]


def moe_large(iters: int) -> dict:
    from fused_moe_bench_lib import SHAPES, SGLangMoE, act_quant_fn, load_sglang, make_inputs, make_weights

    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    shape, sg = SHAPES["v3"], load_sglang()[0]
    wts = make_weights(shape, True)
    quant = act_quant_fn()[0]
    out = {}
    for M in (4096, 16384):
        ws = MoEWorkspace(M, shape.top_k, shape.E, shape.N, shape.K, torch.bfloat16, "cuda", fp8=True)
        x, ids, w = make_inputs(shape, M)
        out[f"moe-large ours V3 fp8 M={M}"] = kernel_sequence(
            lambda: fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws, w_gate_scale=wts.s_gate,
                              w_up_scale=wts.s_up, w_down_scale=wts.s_down, act_quant=quant), iters)
        if sg is not None:
            ref = SGLangMoE(sg, shape, wts, M)
            # SGLang's sequence quantizes x itself, through the shim, with the same quantizer as ours
            out[f"moe-large SGLang V3 fp8 M={M} {ref.config}"] = kernel_sequence(lambda: ref(x, ids, w), iters)
            del ref
        del ws
    return out


def e2e_steps(layers: int) -> dict:
    """Per-step wall times of the end-to-end MoE workload, grouped by the step's composition."""
    from bench_loader import V2_LITE

    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "model": str(moe_checkpoint(layers)), "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"},
        "cuda_graph": True, "max_model_len": 4160, "cache": {"block_size": 64, "num_blocks": 256 * 10 + 8},
        "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 32768, "enable_chunked_prefill": True}}))
    marks = []
    real = llm.scheduler.schedule

    def schedule():
        out = real()
        marks.append((time.perf_counter(), out.num_tokens, len(out.scheduled)))
        return out
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    reqs = [GenerationRequest(id=i, prompt_token_ids=rng.integers(2, V2_LITE["vocab_size"], 512).tolist(),
                              params=params) for i in range(256)]
    llm.generate(reqs[:4], use_tqdm=False)   # warm-up (compiles, graphs), as bench_e2e_moe does
    llm.scheduler.schedule = schedule
    runs = []
    for _ in range(2):   # the first run meets every new kernel shape once (JIT); the second is warm
        marks.clear()
        t0 = time.perf_counter()
        outs = llm.generate(reqs, use_tqdm=False)
        runtime.synchronize()
        t_end = time.perf_counter()
        runs.append((dict(seconds=t_end - t0, output_tok_s=sum(len(o.token_ids) for o in outs) / (t_end - t0)),
                     list(marks), t_end))
    res, marks, t_end = runs[-1]
    res["first_run"] = runs[0][0]
    groups: dict[str, list] = {}
    for (t, tokens, rows), nxt in zip(marks, [m[0] for m in marks[1:]] + [t_end]):
        kind = "prefill (any)" if tokens > rows else f"decode batch {rows}" if rows in (256, 1) else \
            f"decode batch {'<64' if rows < 64 else '64-255'}"
        groups.setdefault(kind, []).append(nxt - t)
    llm.close()
    return {"run": res, "groups": {k: dict(steps=len(v), total_s=sum(v), mean_ms=1e3 * sum(v) / len(v),
                                           max_ms=1e3 * max(v)) for k, v in groups.items()}}


def print_tables(res: dict) -> None:
    for case, t in res.items():
        if case == "e2e-steps":
            first = t["run"]["first_run"]
            print(f"\n### e2e-steps: {t['run']['output_tok_s']:.0f} output tok/s, {t['run']['seconds']:.2f} s "
                  f"(first run, JIT included: {first['output_tok_s']:.0f} tok/s, {first['seconds']:.2f} s)")
            print("| steps of kind | count | total s | mean ms | max ms |\n| --- | --- | --- | --- | --- |")
            for k, g in t["groups"].items():
                print(f"| {k} | {g['steps']} | {g['total_s']:.3f} | {g['mean_ms']:.2f} | {g['max_ms']:.2f} |")
            continue
        if isinstance(t, list):      # moe-large: a launch-order kernel list
            print(f"\n### {case}: {sum(k['us'] for k in t):.1f} µs of kernels per call, {len(t)} kernels")
            print("; ".join(f"{k['name'][:40]} {k['us']:.1f}" for k in t))
            continue
        if not isinstance(t, dict):
            continue
        print(f"\n### {case}: {t['device_ms']:.3f} ms of kernels per step ({res['device']}, {res['layers']} layers)")
        print("| category | ms/step | share |\n| --- | --- | --- |")
        for cat, ms in t["categories"].items():
            print(f"| {cat} | {ms:.3f} | {100 * ms / t['device_ms']:.1f}% |")
        print("top kernels: " + "; ".join(f"{k['name'][:60]} x{k['calls']} {k['ms']:.3f} ms" for k in t["top_kernels"][:6]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="dense-decode,short,chunk,moe-decode,moe-prefill")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    res = run_cases(args.cases.split(","), args.layers, args.iters)
    print_tables(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
