"""Host time of the engine's decode steps, by phase (issue 9's host-time target: <= 0.5 ms at batch 256).

Runs ``LLM.generate`` on ``--batch`` requests (token ids, greedy, ignore_eos) and times, per decode step
where every request decodes, the host-side phases of ``LLM._step``: scheduling, building the step's
inputs (``ModelRunner.step_batch`` and the sampling batch), launching, and output handling
(``LLM._apply``). The forward itself is excluded: on a GPU it runs asynchronously (a graph replay)
and the host does not wait for it except in the one read, which is timed separately. A cProfile of
the same phases (the launch, which holds the forward on CPU, left out) lists the costliest functions
by own time.

On CPU (the tiny model, ``--device cpu``) the forward runs synchronously inside ``launch``, so read the
other phases there; ``--device gpu`` with the tiny model gives all phases.

    python tools/profile_host_step.py [--batch 256] [--context 1024] [--steps 30] [--device cpu|gpu]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddle_mla.config import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.engine.request import GenerationRequest, SamplingParams  # noqa: E402

PHASES = {"schedule": ("scheduler", "schedule"), "finish_step": ("scheduler", "finish_step"),
          "inputs (step_batch)": ("runner", "step_batch"), "launch (incl. CPU forward)": ("runner", "launch"),
          "outputs (_apply)": ("llm", "_apply")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    block = 16
    llm = LLM(config_from_dict({
        "device": args.device, "dtype": "float32" if args.device == "cpu" else "bfloat16",
        "max_model_len": args.context + args.steps + 64,
        "cache": {"block_size": block, "num_blocks": args.batch * -(-(args.context + args.steps + 16) // block) + 8},
        "scheduler": {"max_num_seqs": args.batch, "max_num_batched_tokens": 16384, "overlap": False}}))
    owners = {"scheduler": llm.scheduler, "runner": llm.runner, "llm": llm}
    spent = {k: [] for k in PHASES}
    in_decode = [False]

    prof = cProfile.Profile()

    def timed(name, fn):
        profiled = not name.startswith("launch")

        def wrapper(*a, **kw):
            on = profiled and in_decode[0]
            t = time.perf_counter()
            if on:
                prof.enable()
            try:
                return fn(*a, **kw)
            finally:
                if on:
                    prof.disable()
                if in_decode[0]:
                    spent[name].append(time.perf_counter() - t)
        return wrapper

    for name, (owner, attr) in PHASES.items():
        setattr(owners[owner], attr, timed(name, getattr(owners[owner], attr)))
    real_schedule = llm.scheduler.schedule

    def schedule():
        out = real_schedule()
        in_decode[0] = len(out.scheduled) == args.batch and all(s.num_new == 1 for s in out.scheduled)
        return out
    llm.scheduler.schedule = schedule
    rng = np.random.default_rng(0)
    vocab = llm.runner.arch.vocab_size
    reqs = [GenerationRequest(i, rng.integers(3, vocab, args.context - 8).tolist(),
                              SamplingParams(max_tokens=args.steps, ignore_eos=True)) for i in range(args.batch)]
    llm.generate(reqs, use_tqdm=False)
    n = len(spent["outputs (_apply)"])
    print(f"batch {args.batch}, context {args.context}, device {args.device}: {n} full decode steps")
    print("| phase | host ms per step |\n| --- | --- |")
    for name, ts in spent.items():
        print(f"| {name} | {f'{1e3 * np.median(ts):.3f}' if ts else 'not called'} |")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    print(s.getvalue()[-4000:])


if __name__ == "__main__":
    main()
