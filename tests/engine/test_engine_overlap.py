"""Overlapped scheduling and the persistent step inputs (CPU, tiny model, fp32).

- ``scheduler.overlap: true`` gives the same completions (tokens, finish reasons, logprobs) as the
  plain loop, greedy and seeded, with stop tokens, min_tokens, penalties, n > 1, prefix caching,
  chunked prefill and preemption.
- The per-step input build never touches a sequence's whole token list and writes each block id
  into the persistent block table once (deltas), whatever the context length.
- One upload per step.
"""

from __future__ import annotations

import random

import pytest

from paddle_mla.sched.request import GenerationRequest, SamplingParams, Sequence
from test_engine_equivalence import VARIANTS, make_llm


def mixed_workload(vocab: int, seed: int = 3, n: int = 10) -> list[GenerationRequest]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(19)]
    reqs = []
    for i in range(n):
        prompt = shared[:rng.choice([0, 8, 19])] + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 14))]
        kind = i % 5
        params = SamplingParams(max_tokens=rng.randrange(1, 9), ignore_eos=True)
        if kind == 1:
            params = SamplingParams(max_tokens=8, temperature=0.9, top_k=20, top_p=0.9, seed=i, ignore_eos=True,
                                    logprobs=True, top_logprobs=2)
        elif kind == 2:     # stops early on a frequent token: the overlapped extra step is discarded
            params = SamplingParams(max_tokens=8, temperature=1.0, seed=i, stop_token_ids=list(range(3, vocab, 3)),
                                    min_tokens=1)
        elif kind == 3:     # penalties: counted on the device, also while the last token is pending
            params = SamplingParams(max_tokens=6, temperature=0.7, seed=i, frequency_penalty=0.5,
                                    repetition_penalty=1.2, ignore_eos=True, n=2)
        elif kind == 4:
            params = SamplingParams(max_tokens=5, temperature=1.0, seed=i, ignore_eos=True, n=3)
        reqs.append(GenerationRequest(id=i, prompt_token_ids=prompt, params=params))
    return reqs


def completions(outs):
    """Tokens and finish reasons (exact) and logprobs (the batches differ between the two loops,
    so fp32 sums may round differently: compared to 1e-4 below)."""
    return ([(o.error, [(c.token_ids, c.finish_reason, [lp.token_id for lp in c.logprobs or []]) for c in o.outputs])
             for o in outs],
            [lp.logprob for o in outs for c in o.outputs for lp in c.logprobs or []])


@pytest.mark.parametrize("variant", ["plain", "preempt", "all"])   # "all": prefix cache + chunked + preemption
def test_overlap_gives_the_same_completions(variant):
    over = VARIANTS.get(variant, {})
    runs = []
    for overlap in (False, True):
        cfg = {k: dict(v) for k, v in over.items()}
        cfg.setdefault("scheduler", {})["overlap"] = overlap
        llm = make_llm(**cfg)
        assert llm.overlap is overlap
        reqs = mixed_workload(llm.runner.arch.vocab_size)
        runs.append(completions(llm.generate(reqs, use_tqdm=False)))
        assert llm.core.inflight is None
    assert runs[1][0] == runs[0][0]
    assert runs[1][1] == pytest.approx(runs[0][1], abs=1e-4) and len(runs[0][1]) > 0
    assert all(err is None for err, _ in runs[0][0])
    assert any(reason == "stop" for _, cs in runs[0][0] for _, reason, _ in cs)


def test_overlap_auto_is_off_on_cpu():
    assert make_llm().overlap is False


@pytest.mark.parametrize("overlap", [False, True])
def test_input_build_never_reads_the_whole_token_list(monkeypatch, overlap):
    """A long prompt decoded for many steps: neither the scheduler's step message nor launch()
    calls Sequence.token_ids(), and every block id is written into the persistent table once
    (deltas, not a rebuild per step)."""
    llm = make_llm(scheduler={"overlap": overlap})
    runner = llm.runner
    inside = []
    real_launch, real_input, real_ids = runner.launch, llm.scheduler.step_input, Sequence.token_ids

    def watched(fn):
        def call(arg):
            inside.append(True)
            try:
                return fn(arg)
            finally:
                inside.pop()
        return call

    def token_ids(seq):
        assert not inside, "the step's input build read the whole token list"
        return real_ids(seq)

    monkeypatch.setattr(runner, "launch", watched(real_launch))
    monkeypatch.setattr(llm.scheduler, "step_input", watched(real_input))
    monkeypatch.setattr(Sequence, "token_ids", token_ids)
    prompt = [random.Random(1).randrange(3, 200) for _ in range(150)]
    steps0, written0, commits0 = llm.stats().steps, runner.inputs.blocks_written, runner.uploader.num_commits
    out = llm.generate([GenerationRequest(0, prompt, SamplingParams(max_tokens=20, ignore_eos=True))],
                       use_tqdm=False)[0]
    assert len(out.token_ids) == 20
    blocks = -(-(150 + 19) // 8)             # block size 8: the blocks the sequence ever held
    assert runner.inputs.blocks_written - written0 == blocks
    # one upload per step; overlapped, the step after the last token runs too (and is discarded)
    assert runner.uploader.num_commits - commits0 == llm.stats().steps - steps0 == 20 + overlap
