"""The engine on the tiny model (CPU, fp32): prefix caching, chunked prefill and preemption each on
and off give the same greedy tokens as the run with all of them off; prefix hits are counted
exactly; metadata is built once per step whatever the layer count; triton_mla (under the Triton
interpreter) matches native."""

from __future__ import annotations

import random

import pytest

from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

BLOCK = 8


def make_llm(**over) -> LLM:
    base = {"device": "cpu", "dtype": "float32", "cache": {"block_size": BLOCK, "num_blocks": 256},
            "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512}}
    for key, value in over.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update(value)
        else:
            base[key] = value
    return LLM(config_from_dict(base))


def workload(vocab: int, seed: int = 0, n: int = 8) -> list[GenerationRequest]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(3 * BLOCK + 3)]
    reqs = []
    for i in range(n):
        head = shared[: rng.choice([0, BLOCK - 1, BLOCK, 2 * BLOCK + 1, len(shared)])]
        tail = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 2 * BLOCK + 3))]
        reqs.append(GenerationRequest(id=i, prompt_token_ids=head + tail,
                                      params=SamplingParams(max_tokens=16, ignore_eos=True)))
    return reqs


@pytest.fixture(scope="module")
def baseline():
    llm = make_llm()
    reqs = workload(llm.runner.arch.vocab_size)
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


VARIANTS = {
    # Two at a time, so later requests find the blocks earlier ones filled.
    "prefix": {"cache": {"enable_prefix_caching": True}, "scheduler": {"max_num_seqs": 2}},
    "chunked": {"scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 7}},
    "preempt": {"cache": {"num_blocks": 12}},
    "all": {"cache": {"enable_prefix_caching": True, "num_blocks": 10},
            "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 12}},
}


def check_variant(llm: LLM, variant: str, reqs, expected) -> None:
    """``llm`` (built with ``VARIANTS[variant]``) gives ``expected``, and the feature really ran."""
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    st = llm.stats()
    if "num_blocks" in VARIANTS[variant].get("cache", {}):
        assert st.num_preemptions > 0, "the small pool must force preemption"
    if VARIANTS[variant].get("cache", {}).get("enable_prefix_caching"):
        assert st.cached_prompt_tokens > 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_features_do_not_change_greedy_tokens(baseline, variant):
    check_variant(make_llm(**VARIANTS[variant]), variant, *baseline)


def test_hit_rate_matches_shared_fraction():
    llm = make_llm(cache={"enable_prefix_caching": True}, scheduler={"max_num_seqs": 1})
    vocab = llm.runner.arch.vocab_size
    rng = random.Random(1)
    shared = [rng.randrange(3, vocab) for _ in range(4 * BLOCK)]
    reqs = [GenerationRequest(id=i, prompt_token_ids=shared + [rng.randrange(3, vocab) for _ in range(4 * BLOCK)],
                              params=SamplingParams(max_tokens=2, ignore_eos=True)) for i in range(6)]
    llm.generate(reqs, use_tqdm=False)
    st = llm.stats()
    # Every request but the first finds the whole shared half in the cache.
    assert st.prompt_tokens == 6 * 8 * BLOCK
    assert st.cached_prompt_tokens == 5 * 4 * BLOCK
    assert st.prefix_cache_hit_rate == pytest.approx(5 / 12)


def test_metadata_built_once_per_step(monkeypatch):
    from paddle_mla.attention import forward_meta
    from paddle_mla.ops import metadata

    llm = make_llm(scheduler={"enable_chunked_prefill": True, "max_num_batched_tokens": 9})
    assert llm.runner.arch.num_layers >= 2
    counts = {"slot": 0, "pos": 0, "prepare": 0}

    def counting(name, fn):
        def wrapped(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(forward_meta.meta_ops, "compute_slot_mapping",
                        counting("slot", metadata.compute_slot_mapping))
    monkeypatch.setattr(forward_meta.meta_ops, "get_position_ids", counting("pos", metadata.get_position_ids))
    monkeypatch.setattr(llm.runner.backend, "prepare", counting("prepare", llm.runner.backend.prepare))
    reqs = workload(llm.runner.arch.vocab_size, seed=3, n=4)
    llm.generate(reqs, use_tqdm=False)
    steps = llm.stats().steps
    assert steps > 1
    assert counts == {"slot": steps, "pos": steps, "prepare": steps}


def test_seeded_sampling_is_batch_independent():
    llm = make_llm()
    vocab = llm.runner.arch.vocab_size
    p = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=1234, max_tokens=8, ignore_eos=True)
    target = GenerationRequest(id="t", prompt_token_ids=[5, 6, 7, 8, 9], params=p)
    alone = llm.generate([target], use_tqdm=False)[0].token_ids
    others = [GenerationRequest(id=i, prompt_token_ids=[(i * 7 + j) % (vocab - 3) + 3 for j in range(9)],
                                params=SamplingParams(temperature=1.0, max_tokens=5)) for i in range(5)]
    mixed = llm.generate(others[:2] + [target] + others[2:], use_tqdm=False)[2].token_ids
    assert alone == mixed and len(alone) == 8


@pytest.mark.triton
def test_triton_mla_matches_native_under_interpreter(baseline):
    reqs, expected = baseline
    reqs, expected = reqs[:3], expected[:3]
    for over in ({}, VARIANTS["all"]):
        llm = make_llm(attention={"backend": "triton_mla"}, **over)
        assert [o.token_ids for o in llm.generate(reqs, use_tqdm=False)] == expected
