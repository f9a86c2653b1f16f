"""Run a workload under several configs, interleaved, and reduce the request metrics.

Order: a warm-up per engine, then for each repeat every config in turn (A B A B ...) so that slow
drift of the machine (clocks, thermals, other tenants) spreads over all configs alike. Repeat ``r``
uses the workload seeded with ``seed + r``: every config of a round sees the same prompts, and no
round hits prefix-cache blocks left over from an earlier one.

Engines: ``keep`` builds each config's LLM once and keeps all of them (the default on CPU, where a
tiny model costs little); ``rebuild`` builds the LLM for every run and drops it afterwards (the
default on GPU, where each engine sizes its KV cache from free memory and two would starve each
other). Metric definitions (per request, times from the engine's RequestMetrics):
TTFT = first token - arrival; TPOT = (latency - TTFT) / (output tokens - 1); ITL = gaps between
consecutive tokens; E2EL = finish - arrival. In an offline run every request arrives as soon as
the engine's lookahead admits it, so TTFT includes queueing inside the engine.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from paddle_mla.cli.bench.workloads import Workload, build_requests, make_workload

PERCENTILES = (50, 90, 99)
RATIO_KEYS = ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50",
              "itl_ms_p50")


@dataclass
class RunResult:
    repeat: int
    elapsed_s: float
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    num_preemptions: int
    peak_blocks_used: int
    num_blocks: int
    errors: int
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_s: list[float] = field(default_factory=list, repr=False)
    tpot_s: list[float] = field(default_factory=list, repr=False)
    itl_s: list[float] = field(default_factory=list, repr=False)
    e2el_s: list[float] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
            d.pop(k)
        return d


@dataclass
class ConfigSpec:
    name: str
    path: str | None
    config: Any                      # EngineConfig


@dataclass
class ConfigResult:
    spec: ConfigSpec
    runs: list[RunResult] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    ratio_to_first: dict[str, float] = field(default_factory=dict)


def run_once(llm: Any, requests: list, repeat: int) -> RunResult:
    if hasattr(llm, "reset_prefix_cache"):
        llm.reset_prefix_cache()
    llm.reset_stats()
    start = time.perf_counter()
    outputs = list(llm.stream(requests))
    elapsed = time.perf_counter() - start
    st = llm.stats()
    ok = [o for o in outputs if o.finish_reason != "error"]
    ttft, tpot, itl, e2el = [], [], [], []
    for o in ok:
        m = o.metrics
        if m.first_token_time is None or m.finish_time is None:
            continue
        first = m.first_token_time - m.arrival_time
        latency = m.finish_time - m.arrival_time
        ttft.append(first)
        e2el.append(latency)
        if len(o.token_ids) > 1:
            tpot.append((latency - first) / (len(o.token_ids) - 1))
        itl.extend(np.diff(m.token_times).tolist())
    prompt = sum(len(o.prompt_token_ids) for o in ok)
    completion = sum(len(o.token_ids) for o in ok)
    dt = max(elapsed, 1e-9)
    return RunResult(repeat=repeat, elapsed_s=elapsed, requests=len(ok), prompt_tokens=prompt,
                     completion_tokens=completion, cached_prompt_tokens=st.cached_prompt_tokens,
                     num_preemptions=st.num_preemptions, peak_blocks_used=st.peak_blocks_used,
                     num_blocks=st.num_blocks, errors=len(outputs) - len(ok), requests_per_s=len(ok) / dt,
                     output_tokens_per_s=completion / dt, total_tokens_per_s=(prompt + completion) / dt,
                     ttft_s=ttft, tpot_s=tpot, itl_s=itl, e2el_s=e2el)


def _pct(values: list[float], name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    arr = np.asarray(values, dtype=np.float64) * 1e3
    out[f"{name}_ms_mean"] = float(arr.mean()) if arr.size else float("nan")
    for q in PERCENTILES:
        out[f"{name}_ms_p{q}"] = float(np.percentile(arr, q)) if arr.size else float("nan")
    return out


def summarize(runs: list[RunResult]) -> dict[str, float]:
    s: dict[str, float] = {}
    for key in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"):
        vals = np.array([getattr(r, key) for r in runs])
        s[key] = float(vals.mean())
        s[key + "_std"] = float(vals.std())
    for name in ("ttft", "tpot", "itl", "e2el"):
        s.update(_pct([v for r in runs for v in getattr(r, name + "_s")], name))
    prompt = sum(r.prompt_tokens for r in runs)
    s["prefix_cache_hit_rate"] = sum(r.cached_prompt_tokens for r in runs) / prompt if prompt else 0.0
    s["peak_blocks_used"] = max(r.peak_blocks_used for r in runs)
    s["num_blocks"] = max(r.num_blocks for r in runs)
    s["num_preemptions_mean"] = float(np.mean([r.num_preemptions for r in runs]))
    s["errors"] = sum(r.errors for r in runs)
    s["elapsed_s_mean"] = float(np.mean([r.elapsed_s for r in runs]))
    return s


def _close(llm: Any) -> None:
    """Close an engine at once: a tensor-parallel one leaves its process group here (the next may
    form its own), where dropping the last reference would leave it to the garbage collector."""
    close = getattr(llm, "close", None)
    if close is not None:
        close()


def run_bench(specs: list[ConfigSpec], workload: Workload, repeats: int, warmup_requests: int, keep_engines: bool,
              build_llm: Callable[[Any], Any], request_cls: type, params_cls: type,
              log: Callable[[str], None] = lambda _: None) -> list[ConfigResult]:
    results = [ConfigResult(spec) for spec in specs]
    engines: dict[int, Any] = {}
    vocab: list[int] = []

    def requests_for(llm: Any, w: Workload) -> list:
        if vocab and llm.tokenizer.vocab_size != vocab[0]:
            raise ValueError("all configs of a bench must share one tokenizer (vocab sizes differ)")
        vocab.append(llm.tokenizer.vocab_size)
        return build_requests(w, llm.tokenizer, request_cls, params_cls, llm.max_model_len)

    warm = None
    if warmup_requests > 0:   # --warmup 0: no warm-up workload at all (a 0-prompt workload is invalid)
        warm = make_workload(workload.kind, {**workload.params, "num_prompts": min(warmup_requests,
                                                                                   workload.params["num_prompts"])})
        warm = warm.with_seed_offset(100_003)

    def engine(i: int) -> Any:
        if i in engines:
            return engines[i]
        log(f"[{specs[i].name}] building the engine")
        llm = build_llm(specs[i].config)
        if warm is not None:
            log(f"[{specs[i].name}] warm-up: {warm.params['num_prompts']} requests")
            list(llm.stream(requests_for(llm, warm)))
        if keep_engines:
            engines[i] = llm
        return llm

    for r in range(repeats):
        for i, res in enumerate(results):
            llm = engine(i)
            run = run_once(llm, requests_for(llm, workload.with_seed_offset(r)), r)
            res.runs.append(run)
            log(f"[{specs[i].name}] repeat {r + 1}/{repeats}: {run.requests_per_s:.2f} req/s, "
                f"{run.output_tokens_per_s:.1f} out tok/s, {run.elapsed_s:.2f}s")
            if not keep_engines:
                _close(llm)
                del llm
                gc.collect()
    for llm in engines.values():
        _close(llm)
    engines.clear()
    gc.collect()
    for res in results:
        res.summary = summarize(res.runs)
    first = results[0].summary
    for res in results:
        res.ratio_to_first = {k: (res.summary[k] / first[k] if first[k] else float("nan")) for k in RATIO_KEYS}
    return results
