"""Kernel-level views of a step from ``torch.profiler`` (CUDA activity only): time per kernel
category, the costliest kernels, and the kernels of one call in launch order."""

from __future__ import annotations

import gzip
import json
import re
import tempfile

from paddle_mla.platform import runtime

COLLECTIVE = "collective (NCCL all-reduce / all-gather)"
# first match wins; names are those of our Triton and CUDA kernels, of cuBLAS / PyTorch kernels, and
# the CPU ops that stand in for kernels in a CPU profile (gloo collectives, aten products)
CATEGORIES = [
    (COLLECTIVE, r"nccl|all_?reduce|all_?gather|reduce_?scatter|c10d::|gloo|record_param_comms"),
    ("attn: GQA append_attention", r"AppendAttentionArgs|segment_merge"),
    ("attn: MLA decode (split-KV)", r"_decode_stage1|_plan_kernel|mla_decode_wgmma_kernel|mla_decode_split_kernel"),
    ("attn: split merge", r"_decode_stage2|_merge_kernel|mla_combine_kernel"),
    ("attn: extend/prefill", r"_extend_kernel|flash|fmha|attention|sdpa"),
    ("attn: latent interleave/cache write/gather",
     r"_interleave_kernel|_write_latent_cache|_gather_rows|_gather_groups"),
    ("MoE: grouped GEMM", r"grouped_gemm"),
    ("MoE: align/sum", r"_count_kernel|_offsets_kernel|_scatter_kernel|sum_topk"),
    ("FP8 GEMM + quant", r"_w8a8|_group_quant|_split_k_reduce"),
    ("sampling: argmax/logits", r"argmax|multinomial|exponential|logsumexp"),
    ("dense GEMM (cuBLAS)", r"gemm|gemv|cutlass|nvjet|xmma|cublas|ampere|magma|splitK|Kernel2|"
                            r"aten::(linear|mm|addmm|bmm|baddbmm|matmul)$"),
    ("routing: topk/sort/softmax", r"topk|sort|softmax|radix|bitonic|_route_kernel"),
    ("norm (RMSNorm) / rope", r"rsqrt|norm|rope|_mla_latent_kernel"),
    ("copies", r"copy|Memcpy|Memset|fill|cat|index|gather|scatter|embedding"),
    ("elementwise/reduce", r"elementwise|vectorized|reduce|unrolled"),
]
OTHER = "other"


def categorize(name: str) -> str:
    for cat, pat in CATEGORIES:
        if re.search(pat, name, re.IGNORECASE):
            return cat
    return OTHER


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


def _device_us(ev) -> float:
    return getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)


def _device_ms_by(prof, key) -> dict[str, float]:
    """Device ms over everything ``prof`` recorded (CUDA activity), summed by ``key(kernel name)``."""
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        us = _device_us(ev)
        if us:
            k = key(ev.key)
            out[k] = out.get(k, 0.0) + us / 1e3
    return out


def kernel_ms(prof) -> dict[str, float]:
    """Device ms per kernel name (its first 90 characters)."""
    return _device_ms_by(prof, lambda name: name[:90])


def category_ms(prof) -> dict[str, float]:
    """Device ms per kernel category."""
    return _device_ms_by(prof, categorize)


def phase_split(prefill: dict[str, float], whole: dict[str, float], decode_steps: int) -> dict:
    """Category ms of a run's prefill (the workload with max_tokens 1) and of one decode step, from
    the prefill's and the whole run's (``category_ms``): (whole - prefill) / decode_steps."""
    steps = max(decode_steps, 1)
    return {"prefill": dict(prefill),
            "decode_step": {k: (whole.get(k, 0.0) - prefill.get(k, 0.0)) / steps
                            for k in sorted(set(whole) | set(prefill))}}


def kernel_table(step, iters: int) -> dict:
    """Per-category device ms per step, and the 12 costliest kernels, over ``iters`` eager steps."""
    prof = profiled(step, iters, 3)
    cats = {k: ms / iters for k, ms in category_ms(prof).items()}
    kernels = [(_device_us(ev) / 1e3 / iters, ev.count // iters, ev.key[:90])
               for ev in prof.key_averages() if _device_us(ev)]
    total = sum(cats.values())
    kernels.sort(reverse=True)
    return {"device_ms": total, "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [dict(ms=m, calls=c, name=n) for m, c, n in kernels[:12]]}


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")     # a Chrome trace's device events


def load_trace(path) -> list[dict]:
    """A Chrome trace's events (``.json`` or ``.json.gz``, as ``export_chrome_trace`` writes them)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def kernel_sequence(fn, iters: int) -> list[dict]:
    """Kernels of one ``fn`` call in launch order, each with its mean µs over ``iters`` calls (a chrome
    trace read back: key_averages would merge two launches of one kernel, e.g. the two MoE GEMMs)."""
    prof = profiled(fn, iters, 2)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = load_trace(f.name)
    evs = sorted((e for e in trace if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    per = len(evs) // iters
    if per * iters != len(evs):     # a call that launches a varying set: totals by name instead of an order
        tot: dict[str, float] = {}
        for e in evs:
            tot[e["name"][:70]] = tot.get(e["name"][:70], 0.0) + e["dur"]
        return [dict(name=f"(by name) {k}", us=v / iters) for k, v in tot.items()]
    return [dict(name=evs[i]["name"][:70], us=sum(evs[j * per + i]["dur"] for j in range(iters)) / iters)
            for i in range(per)]
