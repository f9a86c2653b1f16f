"""Benchmark: tensor-parallel decode step, TP=1 vs TP=2 (and any ``--tp`` list, e.g. 1,2,4 on 4 GPUs).

DeepSeek-V2-Lite dimensions at full depth (27 layers: hidden 2048, 16 heads, kv_lora 512, 64
routed experts of 1408 top-6 + 2 shared, vocab 102400), random bf16 weights made by the engine
itself with ``load_format: dummy`` (default: a folder holding only config.json; each rank makes
its own shards on its GPU, nothing is written or read), so TP=2 runs the real path: spawned worker,
the loader's sharding, NCCL all-reduces, each rank's own CUDA graphs. ``--checkpoint`` writes a
random bf16 checkpoint instead (``checkpoints.write_checkpoint``, 31 GB at 27 layers; reused when
present) and loads it from the files. Per TP size: one engine (triton_mla, CUDA graphs, bf16), a decode
step of ``--batch`` requests at ``--context`` tokens each (paged latent cache, random block tables),
timed as the engine runs it: ``forward_step`` (rank 0 sends the batch to the worker, metadata,
model, gathered logits) + greedy argmax + the one host read. Target: TP=2 <= 0.6x TP=1.
Then, on the same engine, two whole runs through ``LLM.generate`` (greedy, ignore_eos, token ids):
prefill (``--prefill-requests`` prompts of 1024 tokens, one output token each: prompt tok/s) and a
1k/1k run (``--e2e`` requests of 1024 in / 1024 out: output tok/s). Before them, the engine's own decode
step (``time_engine_step``: ``--batch`` prompts near ``--context`` through ``generate`` twice, to 16 and
to 16 + ``--engine-steps`` tokens, the prompts cached by a first run), which unlike the step above
overlaps each step's host work with the step before (``scheduler.overlap``). Prefix caching is on
for every run (the engine step needs it; each other run has its own prompts, so it only adds the
block hashing).

Memory target (a model that does not fit one GPU's budget runs under TP=2):
``--gpu-memory-utilization U`` sizes the KV cache by the profile run (``cache.num_blocks: auto``)
under that budget; a TP size whose engine cannot start in it is a row "does not fit" with the
profile's reason, and TP=1 is then also run without the budget (a fixed cache) as the ratio's
baseline, so one command measures both targets. ``--gpu-memory-utilization auto`` picks U from
this card's size: half the weights and the batch's whole KV cache (one TP=2 rank's share: the latent
cache is shared by all heads, so TP does not split it) plus 6 GiB of activations and graphs, so the model
cannot fit one GPU's budget and fits two, on any card.

    python -m benchmarks.e2e.tensor_parallel [--layers 27] [--batch 64] [--context 4096] [--tp 1,2]
        [--iters 30] [--json out.json] [--gpu-memory-utilization 0.2] [--checkpoint [--dir DIR]] [--no-graphs]
        [--rows | --rows-only] [--ep]
        [--profile [--profile-steps 5] [--profile-eager] [--profile-json P.json] [--profile-traces DIR]]

``--profile`` (``tp_profile``): after the timed steps, a few decode steps of each engine under
torch.profiler on every rank: µs per kernel category, GPU idle, NCCL, per-layer blocks, top kernels.

``--rows`` also runs each TP size > 1 with ``parallel.attention_split: rows``: every rank attends
its share of the batch's rows with all heads, so it reads its rows' part of the latent cache (1/TP here:
every row has the same context).

NCCL_NVLS_ENABLE=0 is set for every rank (the GPU machines' rule: no NVLink multicast).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from paddle_mla.platform import runtime  # noqa: E402

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.batches import PAGE, decode_batch, step_batch  # noqa: E402
from benchmarks.harness.checkpoints import dummy_model_dir, write_checkpoint  # noqa: E402
from benchmarks.harness.dims import SMOKE_MOE, V2_LITE  # noqa: E402
from benchmarks.harness.errors import raise_on_failed  # noqa: E402
from benchmarks.harness.models import time_steps  # noqa: E402
from benchmarks.harness.roofline import decode_bytes, weight_counts  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from benchmarks.e2e import tp_profile  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def time_decode(llm: LLM, batch, iters: int) -> float:
    return time_steps(llm.runner, batch, iters)


def time_generate(llm: LLM, requests: int, prompt_len: int, max_tokens: int, seed: int) -> float:
    """Seconds for one whole ``generate`` of ``requests`` random-token prompts (greedy, ignore_eos);
    each run its own ``seed``, so no run finds another's prompts in the prefix cache by chance."""
    if requests <= 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    vocab = llm.runner.arch.vocab_size
    reqs = [GenerationRequest(i, rng.integers(3, vocab, prompt_len).tolist(),
                              SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for i in range(requests)]
    runtime.synchronize()
    t = time.perf_counter()
    outs = llm.generate(reqs, use_tqdm=False)
    runtime.synchronize()
    took = time.perf_counter() - t
    raise_on_failed(outs)
    return took


def time_engine_step(llm: LLM, requests: int, context: int, steps: int, repeats: int = 1) -> float:
    """ms per decode step as the engine runs it (``generate``: scheduling, the launch overlapped with
    the step before, the workers' pipe, sampling, outputs), ``requests`` rows at about ``context``
    tokens. One run of the prompts fills the prefix cache; then the same prompts run to 16 and to
    16 + ``steps`` tokens, and the difference of the two is ``steps`` decode steps of the batch: the
    median of ``repeats`` such pairs."""
    steps = min(steps, context - 17)     # a prompt of one token at least
    if steps <= 0:
        return float("nan")
    prompt_len = context - steps - 16
    time_generate(llm, requests, prompt_len, 2, seed=4)
    took = []
    for _ in range(repeats):
        short = time_generate(llm, requests, prompt_len, 16, seed=4)
        long = time_generate(llm, requests, prompt_len, 16 + steps, seed=4)
        took.append(1e3 * (long - short) / steps)
    print(f"engine step ms, {repeats} pairs: {', '.join(f'{t:.2f}' for t in took)}", file=sys.stderr, flush=True)
    return float(np.median(took))


def profile(llm: LLM, batch, tp: int, args, step_ms: float, split: str = "heads") -> None:
    """``--profile``: the engine's own mode (CUDA graphs unless --no-graphs), and eager steps too under
    ``--profile-eager``; each run's tables printed at once and the JSON rewritten (a later engine that
    fails or a time limit keeps what came before)."""
    modes = ["graphs" if llm.runner.graphs is not None else "eager"]
    if args.profile_eager and modes[0] == "graphs":
        modes.append("eager")
    for mode in modes:
        # the head split's in the folder itself
        traces = Path(args.profile_traces) / ("" if split == "heads" else split)
        traces.mkdir(parents=True, exist_ok=True)
        res = tp_profile.profile_engine(llm, batch, tp, mode, args.profile_steps, args.layers, traces, step_ms)
        if split != "heads":     # its own column beside the head split's
            res["mode"] = f"{mode}, attention by {split}"
        args.profiles.append(res)
        print("\n".join(tp_profile.format_run(res)), flush=True)
        if args.profile_json:
            device = "cpu" if args.smoke else runtime.device_name()
            with open(args.profile_json, "w") as f:
                json.dump(dict(layers=args.layers, batch=args.batch, context=args.context, device=device,
                               categories=[c for c, _ in tp_profile.CATEGORIES] + [tp_profile.OTHER],
                               runs=args.profiles), f, indent=1)


def run(tp: int, path: Path, args, budget: float, ep: bool = False, split: str = "heads") -> dict:
    need = args.batch * -(-args.context // PAGE)        # the decode batch's blocks
    num_blocks = need + args.batch + 8
    gpu = not args.smoke
    cache = ({"block_size": PAGE, "num_blocks": "auto", "gpu_memory_utilization": budget} if budget else
             {"block_size": PAGE, "num_blocks": num_blocks})
    cfg = config_from_dict({
        "model": str(path), "load_format": "auto" if args.checkpoint else "dummy", "runtime": "torch",
        "device": "gpu" if gpu else "cpu",
        "dtype": "bfloat16" if gpu else "float32", "attention": {"backend": "triton_mla" if gpu else "native"},
        "cuda_graph": gpu and not args.no_graphs, "max_model_len": args.context + PAGE,
        "cache": {**cache, "enable_prefix_caching": True},   # time_engine_step's runs reuse their prompts
        # 2048-token chunks: the profile run's prefill (its activations) stays small beside the weights
        "scheduler": {"max_num_seqs": args.batch, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                      "overlap": False if args.no_overlap else "auto"},
        "parallel": {"tensor_parallel_size": tp, "expert_parallel": ep, "attention_split": split}})
    t = time.perf_counter()
    try:
        llm = LLM(cfg)
    except RuntimeError as exc:
        if not budget:
            raise
        print(f"TP={tp} does not fit gpu_memory_utilization {budget}:\n{exc}\n", file=sys.stderr)
        error = str(exc).splitlines()[0]
    else:
        error = None
    if error is not None:   # outside the except block: the failed engine's weights are free to go
        gc.collect()
        runtime.empty_cache()
        return dict(tp=tp, ep=ep, split=split, budget=budget, step_ms=float("nan"),
                    engine_start_s=time.perf_counter() - t,
                    rank0_peak_gib=0.0, fits=False, error=error)
    start_s = time.perf_counter() - t
    load_s = llm.runner.load_s
    prof = llm.runner.memory_profile
    weights_gib = prof.weights / 2**30 if prof is not None else 0.0
    num_blocks = llm.runner.limits.num_blocks
    if num_blocks < need:    # starts, but the budget leaves too little cache for the batch: a row, not fatal
        llm.close()
        del llm
        gc.collect()
        runtime.empty_cache()
        return dict(tp=tp, ep=ep, split=split, budget=budget, step_ms=float("nan"), engine_start_s=start_s,
                    rank0_peak_gib=0.0,
                    fits=False, error=f"the KV cache holds {num_blocks} blocks, the decode batch needs {need}")
    for cache in llm.runner.kv_caches:       # rank 0's cache; the values do not change the work
        cache.normal_(0.0, 1.0)
    batch = decode_batch(num_blocks, args.batch, args.context)
    step_s = time_decode(llm, batch, args.iters)
    if args.profile and not ep:
        if args.profile_prefill:    # a prompt step instead: eager, the extend path
            batch = step_batch(llm.runner, args.profile_prefill, min(1024, args.context), 0, PAGE, True, seed=5)
            step_s = time_decode(llm, batch, args.iters)
        profile(llm, batch, tp, args, step_s * 1e3, split)
    io = 32 if args.smoke else 1024       # tokens in, and out for the whole run
    if args.prefill_requests or args.e2e or args.engine_steps:   # warm-up: prefill and mixed-step kernels compile here
        time_generate(llm, 4, io, 64, seed=3)
    engine_step_ms = time_engine_step(llm, args.batch, args.context,
                                      min(args.engine_steps, 32) if args.smoke else args.engine_steps,
                                      args.engine_repeats)
    prefill_s = time_generate(llm, args.prefill_requests, io, 1, seed=1)
    e2e_s = time_generate(llm, args.e2e, io, io, seed=2)
    mem = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
    llm.close()
    del llm
    runtime.empty_cache()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    return dict(tp=tp, ep=ep, split=split, budget=budget, step_ms=step_s * 1e3, engine_step_ms=engine_step_ms,
                engine_start_s=start_s, rank0_peak_gib=mem, fits=True,
                rank0_weights_gib=weights_gib, kv_blocks=num_blocks, load_s=load_s,
                prefill_tok_s=args.prefill_requests * io / prefill_s, e2e_out_tok_s=args.e2e * io / e2e_s)


def print_roofline(cfg: dict, args, sizes: list[int]) -> None:
    """The step's byte bound at TP=1 and per rank at each TP size: weights split, the latent cache does
    not (every rank reads all of it, its heads share it), so MLA's TP ratio has a floor above 1/TP."""
    weights, kv = decode_bytes(cfg, [cfg["n_routed_experts"]] * weight_counts(cfg)["moe_layers"],
                               args.batch, args.context, 2)
    rate = copy_bandwidth()                  # bytes/s
    one = (weights + kv) / rate * 1e3
    floors = ", ".join(f"TP={tp} rank {(weights / tp + kv) / rate * 1e3:.2f} ms (ratio floor "
                       f"{(weights / tp + kv) / (weights + kv):.2f}x)" for tp in sizes if tp > 1)
    # split by rows: attention weights whole on every rank, 1/TP of the cache read
    c = weight_counts(cfg)
    attn = c["layers"] * c["attn_per_layer"] * 2
    rows = ", ".join(f"TP={tp} rank {((weights - attn) / tp + attn + kv / tp) / rate * 1e3:.2f} ms (ratio floor "
                     f"{((weights - attn) / tp + attn + kv / tp) / (weights + kv):.2f}x)" for tp in sizes if tp > 1)
    print(f"byte bound at {rate / 1e9:.0f} GB/s measured copy (every expert read at batch {args.batch}): "
          f"TP=1 {one:.2f} ms "
          f"(weights {weights / 1e9:.1f} GB + KV {kv / 1e9:.1f} GB); attention split by heads: {floors}; "
          f"by rows: {rows}")


def fit_two_budget(cfg: dict, args) -> float:
    """gpu_memory_utilization under which one TP=2 rank fits and a TP=1 engine cannot (0 on CPU)."""
    if args.smoke or not torch.cuda.is_available():
        return 0.0
    c = weight_counts(cfg)
    params = (c["layers"] * c["attn_per_layer"] + c["dense_layers"] * c["dense_mlp"] + 2 * c["lm_head"]
              + c["moe_layers"] * (c["shared"] + c["router"] + cfg["n_routed_experts"] * c["expert"]))
    _, kv = decode_bytes(cfg, [], args.batch, args.context, 2)
    # MLA's latent cache is shared by every head, so each TP rank holds all of it: only weights halve
    need = params * 2 / 2 + kv + 6 * 2**30
    return round(need / torch.cuda.get_device_properties(0).total_memory, 3)


def main() -> None:
    # a run stopped by `timeout` (SIGTERM) prints where rank 0 was: a slow start and a hang look alike
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--prefill-requests", type=int, default=64,
                    help="prompts of 1024 tokens for the prefill run (0: skip)")
    ap.add_argument("--e2e", type=int, default=64, help="requests of 1024 in / 1024 out for the whole run (0: skip)")
    ap.add_argument("--engine-steps", type=int, default=128,
                    help="decode steps of the engine's own step time (generate, --batch prompts at --context; 0: skip)")
    ap.add_argument("--engine-repeats", type=int, default=3,
                    help="engine step: the median of this many timed pairs (an engine's first pair reads low)")
    ap.add_argument("--ep", action="store_true",
                    help="also run each TP size > 1 with parallel.expert_parallel (experts whole per rank)")
    ap.add_argument("--rows", action="store_true",
                    help="also run each TP size > 1 with parallel.attention_split: rows (each rank attends its "
                         "share of the batch's rows with every head)")
    ap.add_argument("--rows-only", action="store_true", help="TP sizes > 1 only with attention_split: rows")
    ap.add_argument("--checkpoint", action="store_true",
                    help="write (once) and load a random bf16 checkpoint instead of load_format: dummy")
    ap.add_argument("--dir", default="", help="with --checkpoint: its folder (default /tmp/bench_v2lite_<L>L)")
    ap.add_argument("--json", default="")
    ap.add_argument("--no-graphs", action="store_true", help="run the engines without CUDA graphs (eager steps)")
    ap.add_argument("--no-overlap", action="store_true", help="scheduler.overlap: false (the engine step's A/B)")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, profile --profile-steps decode steps on every rank (tp_profile)")
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--profile-prefill", type=int, default=0,
                    help="with --profile: profile a step of this many 1024-token prompts (at most --context) "
                         "instead of the decode batch "
                         "(its synthetic step time replaces the decode step's in the table)")
    ap.add_argument("--profile-eager", action="store_true",
                    help="with --profile: also profile the steps with the CUDA graphs set aside on every rank")
    ap.add_argument("--profile-json", default="", help="with --profile: every run's per-kernel tables as JSON")
    ap.add_argument("--profile-traces", default="",
                    help="with --profile: keep each rank's Chrome trace (.json.gz) in this folder "
                         "(default: a temporary one)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, native backend: proves the code path")
    ap.add_argument("--gpu-memory-utilization", default="0",
                    help="size the KV cache by the profile run under this budget (the memory target); "
                         "a TP size that does not fit is reported, not fatal (CPU: the budget is ignored); "
                         "auto: one TP=2 rank's weights (half) and KV cache "
                         "(whole: MLA's latent cache is not split by heads) + 6 GiB, over this card's memory")
    args = ap.parse_args()
    args.profiles = []
    if args.profile and not args.profile_traces:
        args.profile_traces = tempfile.mkdtemp(prefix="tp_profile_")
    if args.profile:
        Path(args.profile_traces).mkdir(parents=True, exist_ok=True)
    cfg = dict(V2_LITE, num_hidden_layers=args.layers, **(SMOKE_MOE if args.smoke else {}))
    args.gpu_memory_utilization = fit_two_budget(cfg, args) if args.gpu_memory_utilization == "auto" \
        else float(args.gpu_memory_utilization)
    if args.checkpoint:
        path = Path(args.dir or f"/tmp/bench_v2lite_{args.layers}L{'_smoke' if args.smoke else ''}")
        if not (path / "model.safetensors.index.json").exists():
            print(f"writing a random bf16 checkpoint to {path}", file=sys.stderr)
            write_checkpoint(path, cfg, 5 * 10 ** 9)
    else:    # load_format: dummy: config.json is the whole model folder
        path = dummy_model_dir(tempfile.mkdtemp(prefix="bench_tp_dummy_"), cfg)
    rows = []
    for tp in map(int, args.tp.split(",")):
        splits = [] if args.rows_only and tp > 1 else ["heads"]
        splits += ["rows"] if (args.rows or args.rows_only) and tp > 1 else []
        for split in splits:
            rows.append(run(tp, path, args, args.gpu_memory_utilization, split=split))
            print(f"row: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
            if not rows[-1]["fits"]:   # the ratio still needs this run: again without the budget (fixed cache)
                rows.append(run(tp, path, args, 0.0, split=split))
                print(f"row: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
        if args.ep and tp > 1:
            rows.append(run(tp, path, args, rows[-1]["budget"], ep=True))
            print(f"row: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    base = next((r["step_ms"] for r in rows if r["fits"] and r["tp"] == 1), float("nan"))
    engine_base = next((r["engine_step_ms"] for r in rows if r["fits"] and r["tp"] == 1), float("nan"))
    print(f"# TP decode step: V2-Lite dims, {args.layers} layers, batch {args.batch}, context {args.context}, "
          + ("SMOKE (tiny dims, CPU fp32, native)" if args.smoke else
             f"bf16, triton_mla + {'eager steps' if args.no_graphs else 'CUDA graphs'}, {runtime.device_name()}")
          + (", scheduler.overlap: false" if args.no_overlap else "")
          + (f", gpu_memory_utilization {args.gpu_memory_utilization} (KV cache: auto)\n"
             if args.gpu_memory_utilization else "\n"))
    print(f"weights: {'checkpoint ' + str(path) if args.checkpoint else 'load_format: dummy (made on each GPU)'}\n")
    print("| TP | EP | attention split | gpu_memory_utilization | fits | step ms | vs TP=1 | engine step ms | vs TP=1 "
          "| engine start s | load s | rank-0 weights GiB | KV blocks | rank-0 peak GiB | prefill tok/s "
          "| 1k/1k out tok/s |")
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: | ---: | ---: |")
    for r in rows:
        r["ratio"] = r["step_ms"] / base
        util = r["budget"] or "- (fixed cache)"
        if not r["fits"]:
            print(f"| {r['tp']} | {'yes' if r['ep'] else 'no'} | {r['split']} | {util} | no: {r['error']} | "
                  f"- | - | - | - | "
                  f"{r['engine_start_s']:.0f} | - | - | - | - | - | - |")
            continue
        r["engine_ratio"] = r["engine_step_ms"] / engine_base
        print(f"| {r['tp']} | {'yes' if r['ep'] else 'no'} | {r['split']} | {util} | yes | {r['step_ms']:.2f} | "
              f"{r['ratio']:.2f}x | "
              f"{r['engine_step_ms']:.2f} | {r['engine_ratio']:.2f}x | {r['engine_start_s']:.0f} | "
              f"{r['load_s']:.1f} | "
              f"{r['rank0_weights_gib']:.1f} | {r['kv_blocks']} | {r['rank0_peak_gib']:.1f} | "
              f"{r['prefill_tok_s']:.0f} | {r['e2e_out_tok_s']:.0f} |")
    two = min((r for r in rows if r["tp"] == 2 and r["fits"] and not r["ep"]), key=lambda r: r["engine_step_ms"],
              default=None)
    two_budget = next((r for r in rows if r["tp"] == 2 and r["budget"]), None)
    if two is not None:
        verdict = "met" if two["ratio"] <= 0.6 else "NOT met"
        print(f"\ntarget: TP=2 step <= 0.6x TP=1 (attention split by {two['split']}): {two['ratio']:.2f}x ({verdict}); "
              f"the engine's own decode step: {two['engine_ratio']:.2f}x")
    if not args.smoke:
        print_roofline(cfg, args, sorted({r["tp"] for r in rows}))
    if args.gpu_memory_utilization:
        one = [r for r in rows if r["tp"] == 1 and r["budget"]]
        met = bool(one) and not one[0]["fits"] and two_budget is not None and two_budget["fits"]
        print(f"memory target (under gpu_memory_utilization {args.gpu_memory_utilization}: TP=1 does not fit, "
              f"TP=2 runs): {'met' if met else 'NOT met' + (' (CPU: the budget is ignored)' if args.smoke else '')}")
    if args.profiles:
        print("\n".join(tp_profile.comparison(args.profiles)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(layers=args.layers, batch=args.batch, context=args.context, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
