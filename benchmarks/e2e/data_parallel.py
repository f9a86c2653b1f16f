"""Data-parallel throughput: DP=2 (``--dp``: any list of sizes) replicas vs one engine on the end-to-end MoE workload.

The workload of benchmarks.e2e.moe (a): a random bf16 checkpoint with DeepSeek-V2-Lite dims cut
to ``--layers`` 4 (the same folder, written once and reused), 256 requests x 512 prompt tokens x 128
output tokens (greedy, ignore_eos, token ids), triton_mla with CUDA graphs and chunked prefill.
Measured, each as the second of two runs of the workload in its own engine(s) (the first, cold run
compiles every new kernel shape; its time is reported too):
  - DP=2: ``DataParallelLLM`` with ``parallel.data_parallel_size: 2`` (one replica process per GPU);
  - DP=1 (replica): ``DataParallelLLM`` with one replica process (the same dispatch path, one GPU);
  - DP=1 (in process): the plain ``LLM`` on GPU 0, what ``generate`` runs without DP.
Reported: output tok/s of each and the ratios DP=2 / DP=1 (target >= 1.9x), plus how many of the
DP=2 outputs equal the single engine's (bf16 on a GPU: batch composition may flip a near-tie).

    python -m benchmarks.e2e.data_parallel [--requests 2048] [--json out.json]   (GPU, >= 2 GPUs, 2-3 min)

With the default 256 requests one engine runs the whole workload as one batch (max_num_seqs 256),
and its decode steps are bound by the weight bytes: a replica with half the batch takes nearly as
long per step, so DP cannot pay there. ``--requests 2048`` gives each engine several batches.
    python -m benchmarks.e2e.data_parallel --requests 2048 --single-gpu
        (1 GPU: DP=1 in process vs one replica process)
    python -m benchmarks.e2e.data_parallel --requests 2048 --layers 27 --load-format dummy
        (full depth, no checkpoint written)
    python -m benchmarks.e2e.data_parallel --smoke                    (CPU, tiny dims, 2 CPU replicas: the code path)

Each engine's row also says where its time went, from the outputs' token times: the steps that made
tokens, their median period, the stalls (gaps over 3x the median), the time to the first token and
after the last one, and how long the parent took to yield an output after the engine finished it
(for DP=2 the two replicas' stamps interleave, so its step columns are not periods of one engine, and
its stalls are the times when no replica made a token: mostly both replicas in prefill steps at once,
which DP=1 counts as stalls too). Whether a replica waited for input is its own row below the table:
the time its engine sat with nothing to run waiting for the parent's next requests (measured in the
replica), its requests and expected tokens (prompt + max_tokens: the dispatch balances these), when its
first and last tokens came, and the finish skew (last replica's last token minus the first's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from benchmarks.harness.checkpoints import moe_checkpoint  # numpy only: replicas re-import this module


def requests(n: int, prompt: int, out: int, vocab: int, seed: int = 0) -> list:
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
    return [GenerationRequest(id=i, prompt_token_ids=rng.integers(2, vocab, prompt).tolist(), params=params)
            for i in range(n)]


def timed(llm, reqs: list, repeats: int = 1) -> tuple[dict, list]:
    """Run the workload 1 + ``repeats`` times: the first (cold) run meets every kernel shape once
    (Triton compiles each, seconds apiece, in every replica process); of the timed runs, the steady
    state, the median one is reported (``seconds_all`` lists them all)."""
    t = time.perf_counter()
    llm.generate(reqs, use_tqdm=False)
    cold = time.perf_counter() - t
    runs = [timed_once(llm, reqs) for _ in range(max(repeats, 1))]     # in run order (a warming trend shows)
    res, outs = sorted(runs, key=lambda r: r[0]["seconds"])[len(runs) // 2]
    res.update(cold_seconds=cold, seconds_all=[r[0]["seconds"] for r in runs])
    return res, outs


def timed_once(llm, reqs: list) -> tuple[dict, list]:
    from paddle_mla.platform import runtime

    t = time.perf_counter()
    outs, yielded_at = [], []
    for o in llm.stream(reqs):
        outs.append(o)
        yielded_at.append(time.perf_counter())
    loop_end = time.perf_counter()
    if not hasattr(llm, "replica_runs"):
        # in process: the engine's device work is this process's (done: its tokens were read). A
        # DP parent runs nothing on a device, so a sync there would time only its own idle context
        runtime.synchronize()
    dt = time.perf_counter() - t
    toks = sum(len(o.token_ids) for o in outs)
    assert toks == sum(r.params.max_tokens for r in reqs), f"{toks} output tokens"
    res = dict(seconds=dt, output_tok_s=toks / dt, **timeline(outs, yielded_at, t),
               stream_end_ms=(loop_end - yielded_at[-1]) * 1e3, sync_ms=(t + dt - loop_end) * 1e3)
    if hasattr(llm, "replica_runs"):
        res["replicas"] = [dict(index=r.index, requests=r.requests, work_tokens=r.work, output_tokens=r.output_tokens,
                                input_wait_ms=r.input_wait_s * 1e3, input_waits=r.input_waits,
                                tail_ms=r.tail_s * 1e3,
                                first_token_after_ms=((r.first_token_time or t) - t) * 1e3,
                                last_token_at_ms=((r.last_token_time or t) - t) * 1e3)
                           for r in llm.replica_runs()]
        last = [r["last_token_at_ms"] for r in res["replicas"]]
        res["finish_skew_ms"] = max(last) - min(last)
    return res, [list(o.token_ids) for o in outs]


def kernel_cache(fresh: bool, name: str):
    """``fresh``: an empty Triton cache for this engine (replicas inherit the environment), so its
    start and cold run compile every kernel, as on a bare machine; else the machine's shared cache.
    Returns a counter of the kernels compiled into it since (cache entries, each a compiled kernel)."""
    import tempfile

    if fresh:   # Triton reads the variable when it compiles, so setting it here takes effect
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton_{name}_")
    root = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")

    def entries() -> int:
        return len(os.listdir(root)) if os.path.isdir(root) else 0

    before = entries()
    return lambda: entries() - before


def timeline(outs: list, yielded_at: list[float], t0: float) -> dict:
    """Where a run's time goes, from the outputs' own token times (perf_counter is CLOCK_MONOTONIC,
    one clock for every process of the machine): each engine step stamps all its rows' tokens with
    one time, so the distinct stamps are the steps that made tokens and their gaps the step periods.
    Stalls are gaps over 3x the median; the delivery lag is the parent's yield minus the finish."""
    stamps = np.unique(np.concatenate([np.asarray(o.metrics.token_times) for o in outs]))
    gaps = np.diff(stamps) * 1e3
    med = float(np.median(gaps)) if len(gaps) else 0.0
    lag = (np.asarray(yielded_at) - np.asarray([o.metrics.finish_time for o in outs])) * 1e3
    return dict(token_steps=int(len(stamps)), step_median_ms=med,
                stall_ms=float(gaps[gaps > 3 * med].sum()) if len(gaps) else 0.0,
                first_token_after_ms=float((stamps[0] - t0) * 1e3) if len(stamps) else 0.0,
                after_last_token_ms=float((yielded_at[-1] - stamps[-1]) * 1e3) if len(stamps) else 0.0,
                lag_median_ms=float(np.median(lag)), lag_max_ms=float(lag.max()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, native backend: proves the code path")
    ap.add_argument("--dir", default="",
                    help="checkpoint folder (default: the e2e MoE benchmark's, /tmp/bench_e2e_moe_<L>L)")
    ap.add_argument("--requests", type=int, default=256,
                    help="requests (256: the MoE issue's workload, one engine batch; more: several batches)")
    ap.add_argument("--dp", default="2", help="replica counts to run beside DP=1, comma-separated (e.g. 2,4 on 4 GPUs)")
    ap.add_argument("--single-gpu", action="store_true",
                    help="one GPU: DP=1 in process against one replica process only (where the replica's time goes)")
    ap.add_argument("--no-replica", action="store_true",
                    help="skip DP=1 as one replica process (saves a run; the DP=2 / replica ratio is then not printed)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed runs per engine after its cold run (the median is reported)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="an empty Triton kernel cache for each engine: every cold run compiles its Triton kernels, "
                         "as on a bare machine (the custom ops build once, at install)")
    ap.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                    help="auto: the random checkpoint written once; dummy: config.json alone, each engine draws "
                         "the weights on its GPU (seeded by name: every replica holds the same ones), for full depth")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from paddle_mla.platform import runtime

    runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))   # the parent only
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.integrations.data_parallel import DataParallelLLM

    smoke = args.smoke
    sizes = [] if args.single_gpu else [int(x) for x in args.dp.split(",") if x]
    if not args.single_gpu and (not sizes or min(sizes) < 2):
        ap.error(f"--dp {args.dp!r}: replica counts of 2 or more (DP=1 always runs beside them)")
    dummy = args.load_format == "dummy" and not smoke
    if dummy and args.dir:
        ap.error("--dir names a checkpoint folder; --load-format dummy writes config.json alone elsewhere")
    path, cfg = moe_checkpoint(args.layers, smoke, args.dir, dummy=dummy)
    if smoke:
        device, dtype, backend, graphs, n, P, O = "cpu", "float32", "native", False, 16, 16, 4
    else:
        device, dtype, backend, graphs, n, P, O = "gpu", "bfloat16", "triton_mla", True, args.requests, 512, 128
        need = 1 if args.single_gpu else max(sizes)
        if runtime.gpu_count() < need:
            sys.exit(f"bench_dp --dp {args.dp} needs {need} GPUs; this machine has {runtime.gpu_count()}")
    block = 64
    base = {"model": str(path), "runtime": runtime.name(), "device": device, "dtype": dtype,
            "load_format": "dummy" if dummy else "auto",
            "attention": {"backend": backend}, "cuda_graph": graphs, "max_model_len": P + O + 64,
            "cache": {"block_size": block, "num_blocks": min(n, 256) * -(-(P + O) // block) + 8},
            "scheduler": {"max_num_seqs": min(n, 256), "max_num_batched_tokens": max(8192, 64 * P),
                          "enable_chunked_prefill": True}}
    reqs = requests(n, P, O, cfg["vocab_size"])
    res: dict = {"device": "cpu" if smoke else runtime.device_name(), "gpus": runtime.gpu_count(),
                 "layers": args.layers, "load_format": base["load_format"], "smoke": smoke, "requests": n, "prompt": P,
                 "output": O}
    tokens = {}
    engines = [(f"dp{m}", m) for m in sizes] + ([] if args.no_replica else [("dp1_replica", 1)]) + [("dp1", 0)]
    for name, size in engines:
        compiled = kernel_cache(args.fresh_cache, name)
        t = time.perf_counter()
        if size:
            llm = DataParallelLLM(config_from_dict(dict(base, parallel={"data_parallel_size": size})))
        else:
            llm = LLM(config_from_dict(base))                # the plain engine, in this process (GPU 0)
        start = time.perf_counter() - t
        res[name], tokens[name] = timed(llm, reqs, args.repeats)
        res[name].update(start_s=start, kernels_compiled=compiled())
        llm.close()
    res["sizes"] = sizes
    for m in sizes:
        res[f"ratio_dp{m}_vs_dp1"] = res[f"dp{m}"]["output_tok_s"] / res["dp1"]["output_tok_s"]
        if "dp1_replica" in res:
            res[f"ratio_dp{m}_vs_dp1_replica"] = res[f"dp{m}"]["output_tok_s"] / res["dp1_replica"]["output_tok_s"]
        res[f"dp{m}_outputs_equal_dp1"] = sum(a == b for a, b in zip(tokens[f"dp{m}"], tokens["dp1"]))
    if "dp1_replica" in tokens:
        res["replica_outputs_equal_dp1"] = sum(a == b for a, b in zip(tokens["dp1_replica"], tokens["dp1"]))
    print_table(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def print_table(r: dict) -> None:
    print(f"# Data parallel, DeepSeek-V2-Lite dims, {r['layers']} layers, load_format {r.get('load_format', 'auto')}"
          f"{' (SMOKE: tiny dims, CPU)' if r['smoke'] else ''}"
          f": {r['requests']} requests x ({r['prompt']} in, {r['output']} out), {r['device']} x {r['gpus']}\n")
    print("| engine | output tok/s | seconds (timed runs) | cold first run s | kernels compiled | start s | "
          "ratio to DP=1 | token steps | "
          "median step ms | stalls ms | first token after ms | after last token ms | lag median / max ms |")
    print("| --- |" + " ---: |" * 12)
    for name, label in [("dp1", "DP=1, LLM in process"), ("dp1_replica", "DP=1, one replica process")] + \
            [(f"dp{m}", f"DP={m}, {m} replica processes") for m in r.get("sizes", [])]:
        if name not in r:
            continue
        e = r[name]
        runs = ", ".join(f"{x:.2f}" for x in e["seconds_all"])
        print(f"| {label} | {e['output_tok_s']:.0f} | {e['seconds']:.2f} ({runs}) | {e['cold_seconds']:.2f} | "
              f"{e['kernels_compiled']} | {e['start_s']:.1f} | "
              f"{e['output_tok_s'] / r['dp1']['output_tok_s']:.2f}x | {e['token_steps']} | {e['step_median_ms']:.2f} | "
              f"{e['stall_ms']:.0f} | {e['first_token_after_ms']:.0f} | {e['after_last_token_ms']:.0f} | "
              f"{e['lag_median_ms']:.2f} / {e['lag_max_ms']:.1f} |")
    print("\n| engine | replica | requests | expected tokens | output tokens | input wait ms (times) | "
          "first token after ms | last token at ms | last output -> stream end ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ["dp1_replica"] + [f"dp{m}" for m in r.get("sizes", [])]:
        for x in r.get(name, {}).get("replicas", []):
            print(f"| {name} | {x['index']} | {x['requests']} | {x['work_tokens']} | {x['output_tokens']} | "
                  f"{x['input_wait_ms']:.1f} ({x['input_waits']}) | {x['first_token_after_ms']:.0f} | "
                  f"{x['last_token_at_ms']:.0f} | {x['tail_ms']:.1f} |")
    for m in r.get("sizes", []):
        skew = r[f"dp{m}"]["finish_skew_ms"]
        e = r[f"dp{m}"]
        print(f"\nDP={m} finish skew (last replica's last token - first replica's): {skew:.0f} ms; "
              f"the stream's end after its last output {e['stream_end_ms']:.1f} ms, "
              f"then the device sync {e['sync_ms']:.1f} ms")
    if "replica_outputs_equal_dp1" in r:
        print(f"\nOne replica process's outputs equal to DP=1's: {r['replica_outputs_equal_dp1']}/{r['requests']}")
    for m in r.get("sizes", []):
        target = f" (target >= {0.95 * m:.1f}x)"
        vs_replica = r.get(f"ratio_dp{m}_vs_dp1_replica")
        print(f"\nDP={m} / DP=1: {r[f'ratio_dp{m}_vs_dp1']:.2f}x{target}; DP={m} / one replica process: "
              f"{f'{vs_replica:.2f}x' if vs_replica else 'not run'}; DP={m} outputs equal to DP=1's: "
              f"{r[f'dp{m}_outputs_equal_dp1']}/{r['requests']}")


if __name__ == "__main__":
    main()
