"""Where a step's GPU time goes: a per-category kernel table (torch.profiler, CUDA activity only).

The profiles behind the engine-step and MoE targets (BENCHMARKS.md, "Engine step and host" and
"Fused MoE"). Each case
runs one runner step (``forward_step`` + greedy sampling + its one host read) eagerly, so every
kernel is seen by the profiler; kernel times are those of a graph replay minus launch gaps.

  dense-decode  dense V3 dims (dims.V3_DENSE), batch 64 at 4k context (the dense decode step)
  short         63 decodes at 8k + 15 short extends of 64 tokens over one 8k prefix: the slow steps
                of the chunked shared-prefix workload (its ITL p99)
  chunk         63 decodes at 8k + one 1024-token chunk after 7168 cached tokens
  moe-short     V2-Lite dims: 47 decodes at 8k + 15 short extends of 64 tokens over one 8k prefix,
                chunk budget 1024 (the ITL p99 step of benchmarks.e2e.chunked_itl), and its 47 decodes alone
  moe-decode    DeepSeek-V2-Lite dims (routed MoE), batch 64 at 4k context (the MoE decode step)
  moe-prefill   V2-Lite dims, 64 x 512-token prefill (the MoE prefill step)
  fp8-m1        FP8 block-scaled linears at M=1 (V3 q_a_proj 1536x7168, kv_a 576x7168, expert down
                7168x2048) next to bf16 F.linear: the fixed costs of the FP8 path at M=1
  moe-m1        the fused MoE at M=1 (V2-Lite bf16, V3 fp8): align, GEMMs, sum (the M=1 cost)
  moe-large     the fused MoE at V3 fp8 shapes, M=4096 and 16384, ours next to SGLang's sequence
                (./third_party, scripts/fetch_sglang_fused_moe.sh): every kernel of one call in launch
                order with its mean µs (both GEMMs of a side share a name): the large-M gap
  dsa-b1        one layer of DeepSeek-V3.2 dims (dsa) and of V3 (triton_mla), one decode row at 32k:
                every kernel of one step in launch order with its mean µs (the b=1 cost of the indexer)
  e2e-steps     not a kernel table: the end-to-end MoE workload (256 x 512 in, 128 out, V2-Lite
                dims, graphs) through ``LLM.generate``, with every step's wall time grouped by kind
                (steps with prefill tokens, decode-only steps by batch size): where the run's time goes

    python -m benchmarks.profile.kernels --cases dense-decode,short,chunk,moe-decode,moe-prefill --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.batches import mixed_batches, short_batch, step_batch  # noqa: E402
from benchmarks.harness.checkpoints import moe_checkpoint  # noqa: E402
from benchmarks.harness.kernel_profile import kernel_sequence, kernel_table  # noqa: E402
from benchmarks.harness.models import V3_STEP_MODELS, dense_v3_model, greedy_step, v3_step_runner  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402


def dense_runner(layers: int, num_seqs: int, num_blocks: int, max_len: int, tokens: int) -> ModelRunner:
    model, _ = dense_v3_model(layers, "cuda", torch.bfloat16)
    runner = ModelRunner(config_from_dict({
        "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"}, "cuda_graph": False,
        "cache": {"block_size": 64, "num_blocks": num_blocks}, "max_model_len": max_len,
        "scheduler": {"max_num_seqs": num_seqs, "max_num_batched_tokens": tokens, "enable_chunked_prefill": True}}),
        model=model)
    for cache in runner.kv_caches:
        cache.normal_(0.0, 1.0)
    return runner


def moe_runner(layers: int, max_len: int = 4160, num_blocks: int = 64 * 66 + 8, tokens: int = 32768):
    path = str(moe_checkpoint(layers)[0])
    runner = ModelRunner(config_from_dict({
        "model": path, "device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"},
        "cuda_graph": False, "max_model_len": max_len, "cache": {"block_size": 64, "num_blocks": num_blocks},
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": tokens, "enable_chunked_prefill": True}}),
        path)
    for cache in runner.kv_caches:
        cache.normal_(0.0, 1.0)
    return runner


def run_cases(cases: list[str], layers: int, iters: int) -> dict:
    out: dict = {"device": runtime.device_name(), "layers": layers}
    if "dense-decode" in cases:
        r = dense_runner(layers, 64, 64 * 65 + 8, 4160, 8192)
        dec, _, _ = mixed_batches(64, 4096, 1, 0, 64, 64 * 65 + 8)
        out["dense-decode"] = kernel_table(greedy_step(r, dec), iters)
        del r
        runtime.empty_cache()
    if "short" in cases or "chunk" in cases:
        nb = 63 * 128 + 129 + 128 + 15 * 2 + 8
        r = dense_runner(layers, 80, nb, 8192 + 1024 + 64, 8192)
        dec, _, mixed = mixed_batches(63, 8192, 1024, 7168, 64, 63 * 128 + 129)
        if "chunk" in cases:
            out["chunk"] = kernel_table(greedy_step(r, mixed), iters)
            out["chunk-decode-only"] = kernel_table(greedy_step(r, dec), iters)
        if "short" in cases:
            sb = short_batch(dec, 15, 64, 8192, 64, 63 * 128 + 129)
            out["short"] = kernel_table(greedy_step(r, sb), iters)
        del r
        runtime.empty_cache()
    if "moe-decode" in cases or "moe-prefill" in cases:
        r = moe_runner(layers)
        if "moe-decode" in cases:
            out["moe-decode"] = kernel_table(greedy_step(r, step_batch(r, 64, 1, 4095, 64, False, 0)), iters)
        if "moe-prefill" in cases:
            out["moe-prefill"] = kernel_table(greedy_step(r, step_batch(r, 64, 512, 0, 64, True, 1)),
                                              max(2, iters // 4))
        del r
        runtime.empty_cache()
    if "moe-short" in cases:
        used = 47 * 130 + 129
        r = moe_runner(layers, 8192 + 192, used + 128 + 15 * 2 + 8, 1024)
        dec, _, _ = mixed_batches(47, 8256, 1, 0, 64, used)
        out["moe-short"] = kernel_table(greedy_step(r, short_batch(dec, 15, 64, 8192, 64, used)), iters)
        out["moe-short-decode-only"] = kernel_table(greedy_step(r, dec), iters)
        del r
        runtime.empty_cache()
    if "fp8-m1" in cases:
        out.update(fp8_m1(iters))
    if "moe-m1" in cases:
        out.update(moe_m1(iters))
    if "moe-large" in cases:
        out.update(moe_large(iters))
    if "dsa-b1" in cases:
        for name in V3_STEP_MODELS:
            r, batch = v3_step_runner(name, 1, 1, 32768, False)
            out[f"dsa-b1 {name}"] = kernel_sequence(greedy_step(r, batch), iters)
            del r
            runtime.empty_cache()
    if "e2e-steps" in cases:
        out["e2e-steps"] = e2e_steps(layers)
    return out


def fp8_m1(iters: int) -> dict:
    from benchmarks.harness.models import block_fp8_weight
    from paddle_mla.models.fp8 import fp8_linear
    from paddle_mla.platform.tensor_api import F

    out = {}
    for n, k in ((1536, 7168), (576, 7168), (7168, 2048)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        w8 = block_fp8_weight(w)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        out[f"fp8-m1 {n}x{k}"] = kernel_table(lambda: fp8_linear(x, w8), iters * 10)
        out[f"bf16-m1 {n}x{k}"] = kernel_table(lambda: F.linear(x, w), iters * 10)
    return out


def moe_m1(iters: int) -> dict:
    from benchmarks.harness.dims import MOE_SHAPES
    from benchmarks.harness.moe_cases import act_quant_fn, make_inputs, make_weights

    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    out = {}
    for key, fp8 in (("v2lite", False), ("v3", True)):
        shape = MOE_SHAPES[key]
        wts = make_weights(shape, fp8)
        ws = MoEWorkspace(64, shape.top_k, shape.E, shape.N, shape.K, torch.bfloat16, "cuda", fp8=fp8)
        scales = dict(w_gate_scale=wts.s_gate, w_up_scale=wts.s_up, w_down_scale=wts.s_down,
                      act_quant=act_quant_fn()[0]) if fp8 else {}
        x, ids, w = make_inputs(shape, 1)
        out[f"moe-m1 {shape.name} {'fp8' if fp8 else 'bf16'}"] = kernel_table(
            lambda: fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws, **scales), iters * 10)
        del wts, ws
    return out


def moe_large(iters: int) -> dict:
    from benchmarks.harness.dims import MOE_SHAPES
    from benchmarks.harness.moe_cases import SGLangMoE, act_quant_fn, load_sglang, make_inputs, make_weights

    from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe

    shape, sg = MOE_SHAPES["v3"], load_sglang()[0]
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
    from benchmarks.harness.dims import V2_LITE
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "model": str(moe_checkpoint(layers)[0]), "device": "gpu", "dtype": "bfloat16",
        "attention": {"backend": "triton_mla"},
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
    llm.generate(reqs[:4], use_tqdm=False)   # warm-up (compiles, graphs), as benchmarks.e2e.moe does
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
        print("top kernels: "
              + "; ".join(f"{k['name'][:60]} x{k['calls']} {k['ms']:.3f} ms" for k in t["top_kernels"][:6]))


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
