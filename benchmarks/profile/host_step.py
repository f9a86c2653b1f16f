"""Host time of one decode step of the real engine, with the model's forward replaced (CPU only).

The engine is ``LLM`` on the tiny model (torch runtime, CPU); ``runner._forward`` is replaced by
the host part of the step's forward: ``ForwardMeta.build`` (the staging upload and the metadata
ops) and a fixed logits tensor, so what is timed is the scheduler, the input state, the sampling
batch, the sampler, the read, output handling and stop checks, as one decode step runs them.
``batch`` requests of ``--context`` prompt tokens are prefilled, then decode steps with every
request decoding are timed. Per phase, the self time (nested phases subtracted) per step:

- schedule: ``Scheduler.schedule``; finish_step: ``Scheduler.finish_step``
- inputs: ``ModelRunner._gather`` (persistent rows, block tables); meta: ``ForwardMeta.build``
- sampling batch: ``build_sampling_batch`` + ``sampler.device_arrays``
- sampler ops: ``sampler.sample_step_ids`` (device work on a GPU; here run by the CPU, so it is
  listed apart and not counted in ``host``)
- read/unpack: ``LaunchedStep.result``; outputs: ``LLM._apply`` less stop checks; stop checks: ``LLM._stopped``
  and ``LLM._stop_string_hits``
- launch (rest): ``ModelRunner.launch`` less the phases above; other (step): ``LLM._step`` less all

Times are the main thread's CPU time by default (``--clock cpu``): on a machine shared with other
jobs, time spent descheduled is not counted (``--clock wall`` counts it). Reported per phase: the
median over the decode steps (the steady step) and the mean (which also
spreads the last step, where every request finishes and releases its blocks, over the steps).

``--sampler stub`` replaces the sampler's tensor ops by ids made on the host: on this CPU those ops
take 5-20 ms per step on the same core and evict the engine's objects from the caches, so with the
real sampler every host phase after them runs cold (a GPU host does not pay that).

    python -m benchmarks.profile.host_step --batch 64,256 --steps 30 [--context 1024] [--overlap] [--stop-frac 0.25]
        [--repeat 3] [--top 0] [--sampler stub] [--clock wall]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.phases import PhaseTimer, forward_host_part_only, wrap_phases  # noqa: E402
from benchmarks.harness.errors import raise_on_failed  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.sched.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402

DEVICE_PHASES = ("sampler ops",)
TARGET_MS = 0.5       # the target host time per decode step at batch 256


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def make_llm(batch: int, context: int, steps: int, overlap: bool, prefix: bool):
    from paddle_mla.engine.llm import LLM

    block = 16
    cfg = config_from_dict({
        "model": "tiny", "device": "cpu", "dtype": "float32", "attention": {"backend": "native"},
        "max_model_len": context + steps + 64,
        "cache": {"block_size": block, "num_blocks": batch * (-(-(context + steps + 32) // block)) + 8,
                  "enable_prefix_caching": prefix},
        "scheduler": {"max_num_seqs": batch, "max_num_batched_tokens": max(8192, batch * context),
                      "enable_chunked_prefill": True, "overlap": overlap}})
    llm = LLM(cfg)
    forward_host_part_only(llm, batch)
    return llm


def requests(batch: int, context: int, steps: int, vocab: int, stop_frac: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(batch):
        stop = ["\x00never\x00"] if i < stop_frac * batch else []
        params = SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=0.8 if i % 2 else 0.0,
                                top_p=0.95 if i % 4 == 1 else 1.0, seed=i, stop=stop)
        reqs.append(GenerationRequest(i, rng.integers(3, vocab, context).tolist(), params))
    return reqs


def stub_sampler(vocab: int):
    """``sampler.sample_step_ids`` without its tensor work: the packed read and the ids of the
    rows (no logprob rows in this workload), varying with each row's seed and step. On a GPU the
    sampler's ops run on the device; here they would run on the host's core between the host
    phases and evict their data from the CPU caches, which inflates every later phase."""
    def sample_step_ids(logits, batch, dev=None, penalties=None):
        ids = (batch.seeds * 7919 + batch.steps * 104729) % (vocab - 3) + 3
        return torch.from_numpy(ids.astype(np.float64)), torch.from_numpy(ids.astype(np.int64))

    return sample_step_ids


def profile(batch: int, context: int, steps: int, overlap: bool, prefix: bool, stop_frac: float, top: int,
            use_cprofile: bool = False, stub: bool = False):
    llm = make_llm(batch, context, steps, overlap, prefix)
    real_sampler = sampler.sample_step_ids
    if stub:
        sampler.sample_step_ids = stub_sampler(llm.runner.arch.vocab_size)
    timer = PhaseTimer(clock)
    wrap_phases(timer, llm)
    step_times, step_phases, prof = [], [], cProfile.Profile()
    real_step = llm._step

    def counted_step(finished):
        decode = len(llm.scheduler.running) == batch and all(
            s.num_computed_tokens >= s.prompt_len for s in llm.scheduler.running)
        if not decode:
            return real_step(finished)
        if use_cprofile:
            prof.enable()
        before = dict(timer.total)
        t = clock()
        try:
            return real_step(finished)
        finally:
            step_times.append(clock() - t)
            if use_cprofile:
                prof.disable()
            step_phases.append({k: v - before.get(k, 0.0) for k, v in timer.total.items()})

    llm._step = counted_step
    reqs = requests(batch, context, steps, llm.runner.arch.vocab_size, stop_frac)
    # prefill steps are not decode steps: reset the phase totals when the first decode step starts
    timed = {"on": False}

    def gate(finished):
        if not timed["on"] and len(llm.scheduler.running) == batch and all(
                s.num_computed_tokens >= s.prompt_len for s in llm.scheduler.running):
            timer.reset()
            timed["on"] = True
        return counted_step(finished)

    llm._step = gate
    try:
        outs = llm.generate(reqs, use_tqdm=False)
    finally:
        timer.close()
        sampler.sample_step_ids = real_sampler
    raise_on_failed(outs)
    n = len(step_times)
    # mean: every decode step, the last one (all requests finish: blocks released, outputs built)
    # included; median: the steady decode step (per phase, and of the per-step host totals)
    per_step = {k: v / n * 1e3 for k, v in timer.total.items()}
    host = sum(v for k, v in per_step.items() if k not in DEVICE_PHASES)
    median = {k: float(np.median([p.get(k, 0.0) for p in step_phases])) * 1e3 for k in per_step}
    host_steps = [sum(v for k, v in p.items() if k not in DEVICE_PHASES) * 1e3 for p in step_phases]
    s = io.StringIO()
    if use_cprofile:
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    llm.close()
    return dict(batch=batch, context=context, steps=n, overlap=overlap, host_ms=host,
                host_median_ms=float(np.median(host_steps)), host_max_ms=float(max(host_steps)),
                wall_ms=float(np.median(step_times)) * 1e3, phases=per_step, median=median, cprofile=s.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="64,256")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=30, help="decode steps")
    ap.add_argument("--overlap", action="store_true", help="overlapped scheduling (the GPU default)")
    ap.add_argument("--no-prefix", action="store_true", help="prefix caching off")
    ap.add_argument("--stop-frac", type=float, default=0.25, help="fraction of requests with a stop string")
    ap.add_argument("--top", type=int, default=20, help="cProfile rows (0: none)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per batch; the least disturbed one is shown")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this thread's CPU time (steady on a shared machine; the default), wall: elapsed")
    ap.add_argument("--sampler", choices=("cpu", "stub"), default="cpu",
                    help="cpu: the real sampler's tensor ops run here (between the host phases); stub: ids "
                         "made on the host without them (closer to a GPU host, whose caches they do not evict)")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    for b in [int(x) for x in args.batch.split(",") if x]:
        runs = [profile(b, args.context, args.steps, args.overlap, not args.no_prefix, args.stop_frac, args.top,
                        stub=args.sampler == "stub") for _ in range(args.repeat)]
        r = min(runs, key=lambda x: x["host_median_ms"])
        print(f"\n## batch {b}, context {r['context']}, overlap {r['overlap']}, {r['steps']} decode steps, "
              f"stop strings on {args.stop_frac:.0%} of the requests, sampler {args.sampler}")
        if len(runs) > 1:     # a shared machine: the least disturbed run, and the spread of the others
            print(f"{len(runs)} runs, the one with the lowest median host time shown; medians of all runs: "
                  + ", ".join(f"{x['host_median_ms']:.3f}" for x in runs) + " ms")
        print(f"host per step: median {r['host_median_ms']:.3f} ms (steady decode step), mean {r['host_ms']:.3f} ms "
              f"(all decode steps, the finishing one included; largest step {r['host_max_ms']:.3f} ms); "
              f"whole step {r['wall_ms']:.3f} ms median, sampler ops included ({args.clock} clock)")
        print("| phase | median ms / step | mean ms / step |\n| --- | ---: | ---: |")
        for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
            print(f"| {k}{' (device work, not host)' if k in DEVICE_PHASES else ''} | {r['median'][k]:.3f} | {v:.3f} |")
        print(f"| host total | {r['host_median_ms']:.3f} | {r['host_ms']:.3f} |")
        if b == 256:
            verdict = "met" if r["host_median_ms"] <= TARGET_MS else "missed"
            print(f"target: host <= {TARGET_MS} ms per decode step at batch 256: {verdict} "
                  f"({r['host_median_ms']:.3f} ms on this machine, {args.clock} clock, sampler {args.sampler})")
        if args.top:   # a second run under cProfile (its overhead would distort the phases)
            print(profile(b, args.context, min(args.steps, 10), args.overlap, not args.no_prefix, args.stop_frac,
                          args.top, use_cprofile=True, stub=args.sampler == "stub")["cprofile"])

if __name__ == "__main__":
    main()
