"""Stop conditions, min_tokens masking, penalties, logprobs, n completions and the length cap,
through the real engine (LLM on the tiny model, CPU float32): the real ``LLM._stopped``, sampler
and output assembly, with no stand-in. Logprobs are checked against a native forward of the
same checkpoint."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from helpers.model_harness import run_greedy
from helpers.sampling_reference import log_softmax, penalties

from paddle_mla.config.schema import config_from_dict
from paddle_mla.worker import sampler
from paddle_mla.worker.sampling_batch import PenaltySlots
from paddle_mla.engine.llm import LLM, completion_seed
from paddle_mla.sched.request import GenerationRequest, SamplingParams
from paddle_mla.models import load_model
from paddle_mla.platform.tensor_api import torch

PROMPT = [5, 6, 7, 8, 9, 10]


def make_llm(**over) -> LLM:
    base = {"device": "cpu", "dtype": "float32", "cache": {"block_size": 8, "num_blocks": 256},
            "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512}}
    for key, value in over.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update(value)
        else:
            base[key] = value
    return LLM(config_from_dict(base))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return make_llm()


@pytest.fixture(scope="module")
def greedy(llm) -> list[int]:
    """The plain greedy continuation of PROMPT (no eos: the tiny model's eos id is not among them)."""
    out = run(llm, max_tokens=12, ignore_eos=True)[0]
    return out.token_ids


def run(llm: LLM, prompt=PROMPT, **params):
    return llm.generate([GenerationRequest(id=0, prompt_token_ids=list(prompt), params=SamplingParams(**params))],
                        use_tqdm=False)


@contextmanager
def eos_ids(llm: LLM, ids: set[int]):
    """Pretend the model's eos ids are ``ids`` (the engine stops on them and the sampler masks them)."""
    saved = llm.eos_token_ids, llm.runner.eos_token_ids
    llm.eos_token_ids, llm.runner.eos_token_ids = set(ids), frozenset(ids)
    try:
        yield
    finally:
        llm.eos_token_ids, llm.runner.eos_token_ids = saved


def first_new(tokens: list[int], skip: int = 0) -> int:
    """Index of the first token that did not occur before it (from ``skip`` on)."""
    return next(i for i in range(skip, len(tokens)) if tokens[i] not in tokens[:i])


def test_max_tokens(llm, greedy):
    out = run(llm, max_tokens=5, ignore_eos=True)[0]
    assert out.finish_reason == "length" and out.token_ids == greedy[:5]


def test_eos_stops_and_ignore_eos_runs_on(llm, greedy):
    i = first_new(greedy, 2)
    with eos_ids(llm, {greedy[i]}):
        out = run(llm, max_tokens=12)[0]
        assert out.finish_reason == "stop" and out.token_ids == greedy[:i + 1]
        out = run(llm, max_tokens=12, ignore_eos=True)[0]
        assert out.finish_reason == "length" and out.token_ids == greedy


def test_stop_token_ids(llm, greedy):
    i = first_new(greedy, 3)
    out = run(llm, max_tokens=12, ignore_eos=True, stop_token_ids=[greedy[i], 99999])[0]
    assert out.finish_reason == "stop" and out.token_ids == greedy[:i + 1]


def test_stop_string_cuts_text(llm, greedy):
    decode = llm.tokenizer.decode
    full = decode(greedy[:8])
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), f"pick another stop string from {full!r}"
    k = next(k for k in range(1, 9) if stop in decode(greedy[:k]))
    out = run(llm, max_tokens=12, ignore_eos=True, stop=[stop])[0]
    text = decode(greedy[:k])
    assert out.finish_reason == "stop" and out.token_ids == greedy[:k]
    assert out.text == text[:text.find(stop)]


def test_min_tokens_masks_stop_ids(llm, greedy):
    # The stop id is the greedy choice of the first step: masked, the first token must be the runner-up.
    top = run(llm, max_tokens=1, logprobs=True, top_logprobs=2)[0].outputs[0].logprobs[0].top
    assert top[0][0] == greedy[0]
    out = run(llm, max_tokens=12, min_tokens=4, ignore_eos=True, stop_token_ids=[greedy[0]])[0]
    assert out.token_ids[0] == top[1][0]
    assert greedy[0] not in out.token_ids[:4]
    assert len(out.token_ids) >= 4
    with eos_ids(llm, {greedy[0]}):
        masked = run(llm, max_tokens=6, min_tokens=3)[0]
        assert masked.token_ids[0] == top[1][0] and greedy[0] not in masked.token_ids[:3]
        unmasked = run(llm, max_tokens=6, min_tokens=3, ignore_eos=True)[0]   # ignore_eos: eos not masked
        assert unmasked.token_ids[0] == greedy[0]


def test_penalties_match_reference(llm, greedy):
    """Each greedy token under penalties = argmax of the numpy reference on the native logits of the
    same prefix. The plain greedy continuation repeats a token, so the penalties change it."""
    assert len(set(greedy[:6])) < 6, "the test needs a plain greedy continuation that repeats a token"
    model = load_model(llm.model_dir, torch.float32, "cpu")
    out = run(llm, max_tokens=6, ignore_eos=True, repetition_penalty=1.5, presence_penalty=1.0,
              frequency_penalty=2.0)[0].token_ids
    for j in range(6):
        logits = run_greedy(model, [PROMPT + out[:j]], 1).first_logits[0]
        assert out[j] == int(np.argmax(penalties(logits, PROMPT, out[:j], 1.0, 2.0, 1.5))), f"token {j}"
    assert out != greedy[:6]


def test_penalty_upload_does_not_grow_with_context(llm, monkeypatch):
    """A penalized request's prompt goes up once, at its admission; after that each step uploads
    the same few sampler elements (its row, slot and penalties) at token 2 as at token 64, when
    its context is ten times the prompt (test_penalties.py runs the same to 200 without a model)."""
    uploaded = []
    real = sampler.device_arrays

    def counted(batch):
        arrays = real(batch)
        uploaded.append(sum(a.size for a in arrays.values()))
        return arrays

    monkeypatch.setattr(sampler, "device_arrays", counted)
    ledger = llm.runner.penalties.ledger
    admitted = ledger.tokens_admitted
    out = run(llm, max_tokens=64, ignore_eos=True, repetition_penalty=1.2, frequency_penalty=0.3,
              presence_penalty=0.2)[0]
    assert len(out.token_ids) == 64 and len(uploaded) == 64        # one sampling step per token
    assert ledger.tokens_admitted - admitted == len(PROMPT)
    assert uploaded[0] == uploaded[1] + 1 + len(PROMPT)             # the admission: its slot and its prompt
    assert uploaded[1:] == [uploaded[1]] * 63 and uploaded[1] == 5


def test_penalties_survive_preemption():
    """Penalized requests in a pool that forces preemption (recompute): the same tokens as in a
    roomy pool, so a request back after preemption counts its earlier output."""
    def reqs():
        return [GenerationRequest(i, PROMPT[i:], SamplingParams(max_tokens=16, ignore_eos=True, n=1 + (i == 0),
                                                                frequency_penalty=1.5, repetition_penalty=1.3,
                                                                presence_penalty=0.5))
                for i in range(3)]
    roomy = make_llm().generate(reqs(), use_tqdm=False)
    small = make_llm(cache={"num_blocks": 5})
    tight = small.generate(reqs(), use_tqdm=False)
    assert small.stats().num_preemptions > 0
    assert [[c.token_ids for c in o.outputs] for o in tight] == [[c.token_ids for c in o.outputs] for o in roomy]
    assert all(o.error is None for o in tight)


def test_readmission_from_host_tokens_matches_device_counts(llm, monkeypatch):
    """A slot admitted again at every step (prompt and output listed from the host, as when a
    preempted request comes back in another slot) gives the same tokens as counting on the device."""
    def reqs():
        return [GenerationRequest(i, PROMPT[i:], SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8 * i,
                                                                seed=i, frequency_penalty=1.0 + 0.5 * i,
                                                                repetition_penalty=1.4 - 0.2 * i))
                for i in range(3)]
    counted = llm.generate(reqs(), use_tqdm=False)
    real = PenaltySlots.plan

    def forgetful(self, seqs, rows, slots, vocab_size):
        for slot in range(len(self.owner)):
            self.release(slot)
        return real(self, seqs, rows, slots, vocab_size)

    monkeypatch.setattr(PenaltySlots, "plan", forgetful)
    admitted = llm.runner.penalties.ledger.tokens_admitted
    readmitted = llm.generate(reqs(), use_tqdm=False)
    assert [o.token_ids for o in readmitted] == [o.token_ids for o in counted]
    # every step listed each row's output so far, and its prompt where a repetition penalty reads it
    # (the third request's repetition penalty is 1: its prompt stays on the host)
    expected = sum(12 * len(o.prompt_token_ids) * (i < 2) + sum(range(12)) for i, o in enumerate(counted))
    assert llm.runner.penalties.ledger.tokens_admitted - admitted == expected


def test_overlapped_penalties_count_the_pending_token_on_the_device():
    """Overlapped scheduling launches a penalized decode row while its last token is still on the
    device (no read first): the same tokens as the plain loop, each prompt listed once."""
    def reqs():
        return [GenerationRequest(i, PROMPT[i:], SamplingParams(max_tokens=10, ignore_eos=True, n=1 + (i == 1),
                                                                temperature=0.7 * (i % 2), seed=i,
                                                                frequency_penalty=1.2, repetition_penalty=1.3))
                for i in range(3)]
    plain = make_llm(scheduler={"overlap": False}).generate(reqs(), use_tqdm=False)
    llm = make_llm(scheduler={"overlap": True})
    reads_first = []
    real = llm.core._needs_host_tokens
    llm.core._needs_host_tokens = lambda out: reads_first.append(real(out)) or reads_first[-1]
    overlapped = llm.generate(reqs(), use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in overlapped] == [[c.token_ids for c in o.outputs] for o in plain]
    assert reads_first.count(False) >= 8          # decode steps ran with the token pending
    assert llm.runner.penalties.ledger.tokens_admitted == sum(len(PROMPT[i:]) * (1 + (i == 1)) for i in range(3))


def test_logprobs_match_native_forward(llm):
    model = load_model(llm.model_dir, torch.float32, "cpu")
    out = run(llm, max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=5)[0].outputs[0]
    assert len(out.logprobs) == 4
    for j, lp in enumerate(out.logprobs):
        ref = log_softmax(run_greedy(model, [PROMPT + out.token_ids[:j]], 1).first_logits[0])
        assert lp.token_id == out.token_ids[j]
        assert lp.logprob == pytest.approx(ref[lp.token_id], abs=1e-4)
        assert [t for t, _ in lp.top] == np.argsort(-ref)[:5].tolist()
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, np.sort(ref)[::-1][:5], atol=1e-4)
        assert lp.top[0][0] == lp.token_id        # greedy: the sampled token is the most likely one


def test_no_logprobs_unless_asked(llm):
    assert run(llm, max_tokens=2)[0].outputs[0].logprobs is None


def test_n_seeded_completions_reproduce(llm):
    params = dict(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    a = run(llm, **params)[0]
    b = run(llm, **params)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) == 3
    assert [c.seed for c in a.outputs] == [completion_seed(7, i) for i in range(3)] and a.outputs[0].seed == 7
    single = run(llm, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)[0]
    assert single.token_ids == a.outputs[0].token_ids


def test_greedy_n_gives_equal_completions(llm, greedy):
    out = run(llm, n=3, max_tokens=6, ignore_eos=True, logprobs=True)[0]
    assert [c.token_ids for c in out.outputs] == [greedy[:6]] * 3
    assert all(len(c.logprobs) == 6 for c in out.outputs)


def test_n_in_order_stream_with_preemption_and_errors():
    """n > 1 mixed with n = 1 in a pool small enough to preempt: same tokens as a roomy pool; a request
    that cannot fit gives one error output in its place."""
    def reqs():
        return [GenerationRequest(0, PROMPT, SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=12,
                                                            ignore_eos=True)),
                GenerationRequest(1, list(range(3, 60)), SamplingParams(n=2, max_tokens=4)),    # > 6 blocks
                GenerationRequest(2, PROMPT[:4], SamplingParams(temperature=0.8, seed=4, max_tokens=12,
                                                                ignore_eos=True, logprobs=True)),
                GenerationRequest(3, PROMPT[2:], SamplingParams(n=2, max_tokens=12, ignore_eos=True))]
    roomy = make_llm().generate(reqs(), use_tqdm=False)
    small = make_llm(cache={"num_blocks": 6})
    tight = small.generate(reqs(), use_tqdm=False)
    assert small.stats().num_preemptions > 0
    assert [o.id for o in tight] == [0, 1, 2, 3]
    assert roomy[1].error is None and tight[1].error is not None and tight[1].outputs == []
    for i in (0, 2, 3):
        assert tight[i].error is None
        assert [c.token_ids for c in tight[i].outputs] == [c.token_ids for c in roomy[i].outputs]
    assert [lp.token_id for lp in tight[2].outputs[0].logprobs] == tight[2].token_ids


def test_length_cap_warns():
    llm = make_llm(max_model_len=64)
    out = run(llm, max_tokens=100000, ignore_eos=True)[0]
    assert out.warnings == ["max_tokens 100000 capped to 58 (max_model_len 64 - 6 prompt tokens)"]
    assert out.finish_reason == "length" and len(out.token_ids) == 58
    assert run(llm, max_tokens=58, ignore_eos=True)[0].warnings == []


def test_one_device_read_per_step(llm, monkeypatch):
    reads = []
    real = sampler.read_to_host
    monkeypatch.setattr(sampler, "read_to_host", lambda t: reads.append(1) or real(t))
    llm.reset_stats()
    reqs = [GenerationRequest(i, PROMPT[:3 + i], SamplingParams(max_tokens=5, ignore_eos=True, n=1 + i % 2,
                                                                logprobs=i % 3 == 0, top_logprobs=2 * (i % 3 == 0),
                                                                frequency_penalty=0.5 * (i % 2), min_tokens=2,
                                                                temperature=0.5 * (i % 2), seed=i))
            for i in range(4)]
    llm.generate(reqs, use_tqdm=False)
    assert len(reads) == llm.stats().steps > 0


def test_n_completions_share_the_cached_prompt():
    """With prefix caching, completions 1.. wait for completion 0's prompt and reuse its full blocks:
    same completions as without caching, and every sibling hits the prompt's full blocks."""
    prompt = list(range(20, 45))          # 25 tokens: 3 full blocks of 8
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    plain = make_llm().generate([GenerationRequest(0, prompt, params)], use_tqdm=False)[0]
    cached_llm = make_llm(cache={"enable_prefix_caching": True})
    cached = cached_llm.generate([GenerationRequest(0, prompt, params)], use_tqdm=False)[0]
    assert [c.token_ids for c in cached.outputs] == [c.token_ids for c in plain.outputs]
    assert cached_llm.stats().cached_prompt_tokens == 2 * 24
