"""The DSA tie rule end to end: on a tiny deepseek_v32 checkpoint built to tie (2 indexer heads, so
the top-k boundary of many rows falls among equal zero scores; tests/helpers/dsa_tie_model.py),
every path gives the tokens of the plain ``native`` run on every request: prefix caching + chunked
prefill + a small KV pool, preemption, and ``dsa`` (Triton interpreter on CPU) plain, with them and in
deterministic mode.
CPU fp32; ``native`` runs on both runtimes. GPU variants: test_dsa_ties_engine_gpu.py."""

from __future__ import annotations

import random

import pytest
from helpers.dsa_tie_model import make_tie_model

from paddle_mla.platform import runtime
from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.platform.tensor_api import torch
from paddle_mla.sched.request import GenerationRequest, SamplingParams

BLOCK = 8
INDEX_HEADS = 2
CPU_TRITON = pytest.mark.skipif(not runtime.supports_triton_on("cpu")[0],
                                reason=runtime.supports_triton_on("cpu")[1] or "Triton on CPU")
# prefix caching, chunks of at most 24 tokens and a pool too small for all requests at once
ALL = {"cache": {"enable_prefix_caching": True, "num_blocks": 16},
       "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 24, "max_num_seqs": 3}}
PREEMPT = {"cache": {"num_blocks": 12}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tie_model(tmp_path_factory.mktemp("tiny_v32_ties"), index_heads=INDEX_HEADS))


def make_llm(model_dir, device: str = "cpu", **over) -> LLM:
    base = {"model": model_dir, "device": device, "dtype": "float32",
            "cache": {"block_size": BLOCK, "num_blocks": 256},
            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 512}}
    for key, value in over.items():
        base.setdefault(key, {}).update(value) if isinstance(value, dict) else base.__setitem__(key, value)
    return LLM(config_from_dict(base))


def tie_workload(vocab: int, n: int = 6) -> list[GenerationRequest]:
    """Prompts of 10 to 66 tokens (index_topk 16), some sharing a 27-token prefix."""
    rng = random.Random(0)
    shared = [rng.randrange(3, vocab) for _ in range(3 * BLOCK + 3)]
    return [GenerationRequest(id=i, prompt_token_ids=shared[: rng.choice([0, BLOCK, len(shared)])]
                              + [rng.randrange(3, vocab) for _ in range(rng.randrange(10, 40))],
                              params=SamplingParams(max_tokens=8, ignore_eos=True)) for i in range(n)]


def count_boundary_ties(monkeypatch):
    """Spy on the reference top-k: a list that counts the rows whose k-th and (k+1)-th largest
    scores are equal and finite (the rule decides which keys those rows attend)."""
    from paddle_mla.attention.dsa import reference

    seen = [0]
    topk_ref = reference.topk_ref

    def spy(scores, topk):
        if scores.shape[1] > topk:
            vals = torch.topk(scores, topk + 1, dim=-1)[0]
            tied = (vals[:, topk - 1] == vals[:, topk]) & (vals[:, topk] > float("-inf"))
            seen[0] += int(torch.sum(tied.to(torch.int64)))
        return topk_ref(scores, topk)

    monkeypatch.setattr(reference, "topk_ref", spy)
    return seen


@pytest.fixture(scope="module")
def baseline(model_dir):
    llm = make_llm(model_dir)
    assert llm.runner.arch.indexer.n_heads == INDEX_HEADS
    reqs = tie_workload(llm.runner.arch.vocab_size)
    assert max(len(r.prompt_token_ids) for r in reqs) > 3 * llm.runner.arch.indexer.topk
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


@pytest.mark.parametrize("variant", ["prefix_chunked_small_pool", "preempt"])
def test_native_paths_keep_tokens_through_ties(model_dir, baseline, variant, monkeypatch):
    reqs, expected = baseline
    ties = count_boundary_ties(monkeypatch)
    llm = make_llm(model_dir, **(ALL if variant != "preempt" else PREEMPT))
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    assert ties[0] > 50          # the rule really decides: many rows tie at their top-k boundary
    st = llm.stats()
    if variant == "preempt":
        assert st.num_preemptions > 0
    else:
        assert st.cached_prompt_tokens > 0


@CPU_TRITON
@pytest.mark.triton
@pytest.mark.parametrize("variant", ["plain", "prefix_chunked_small_pool", "deterministic"])
def test_dsa_keeps_native_tokens_through_ties(model_dir, baseline, variant):
    """``deterministic`` (docs/dsa.md): the batch-invariant plan reaches the backend and keeps the tokens."""
    reqs, expected = baseline
    over = {"plain": {}, "prefix_chunked_small_pool": ALL, "deterministic": {"deterministic": True}}[variant]
    llm = make_llm(model_dir, attention={"backend": "dsa"}, **over)
    assert llm.runner.backend.deterministic == (variant == "deterministic")
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
