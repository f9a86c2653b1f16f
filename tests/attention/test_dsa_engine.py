"""The engine (scheduler + ModelRunner) on the tiny deepseek_v32 model, CPU fp32: prefix caching,
chunked prefill and preemption keep the greedy tokens of the plain run (the indexer key cache
follows the latent cache's blocks); dsa under the Triton interpreter matches native; a V3.2
checkpoint under triton_mla is a config error naming dsa."""

from __future__ import annotations

import random

import pytest

from paddle_mla.platform import runtime
from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

BLOCK = 8
# these run dsa on the CPU device: the Triton interpreter, also on a machine with a GPU
CPU_TRITON = pytest.mark.skipif(not runtime.supports_triton_on("cpu")[0],
                                reason=runtime.supports_triton_on("cpu")[1] or "Triton on CPU")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from paddle_mla.models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny_v32_engine"), arch="deepseek_v32"))


def make_llm(model_dir, **over) -> LLM:
    base = {"model": model_dir, "device": "cpu", "dtype": "float32",
            "cache": {"block_size": BLOCK, "num_blocks": 256},
            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 512}}
    for key, value in over.items():
        base.setdefault(key, {}).update(value) if isinstance(value, dict) else base.__setitem__(key, value)
    return LLM(config_from_dict(base))


def workload(vocab: int, n: int = 5) -> list[GenerationRequest]:
    rng = random.Random(0)
    shared = [rng.randrange(3, vocab) for _ in range(3 * BLOCK + 3)]
    return [GenerationRequest(id=i, prompt_token_ids=shared[: rng.choice([0, BLOCK, len(shared)])]
                              + [rng.randrange(3, vocab) for _ in range(rng.randrange(10, 30))],
                              params=SamplingParams(max_tokens=6, ignore_eos=True)) for i in range(n)]


@pytest.fixture(scope="module")
def baseline(model_dir):
    llm = make_llm(model_dir)
    assert llm.runner.arch.indexer.topk < 20
    reqs = workload(llm.runner.arch.vocab_size)
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


ALL = {"cache": {"enable_prefix_caching": True, "num_blocks": 14},
       "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 12, "max_num_seqs": 2}}
PREEMPT = {"cache": {"num_blocks": 11}}


@pytest.mark.parametrize("variant", ["all", "preempt"])
def test_prefix_chunked_preempt_keep_tokens(model_dir, baseline, variant):
    reqs, expected = baseline
    llm = make_llm(model_dir, **(ALL if variant == "all" else PREEMPT))
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    st = llm.stats()
    if variant == "all":
        assert st.cached_prompt_tokens > 0
    else:
        assert st.num_preemptions > 0


@CPU_TRITON
def test_dsa_engine_matches_native(model_dir, baseline, monkeypatch):
    """Also counts the steps by how dsa ran them: all sparse, all dense (every extend row's context fits
    the top-k, no decode rows) and split (decode rows sparse, a dense tail); chunked prefill makes all three."""
    from paddle_mla.attention.dsa.backend import DSABackend

    kinds = []
    prepare = DSABackend.prepare

    def spy(self, meta):
        prepare(self, meta)
        if not meta.is_decode_only:
            start = meta.attn.dense_from
            kinds.append("sparse" if start is None else "split" if start else "dense")

    monkeypatch.setattr(DSABackend, "prepare", spy)
    reqs, expected = baseline
    reqs, expected = reqs[:3], expected[:3]
    for over in ({}, ALL):
        llm = make_llm(model_dir, attention={"backend": "dsa"}, **over)
        assert [o.token_ids for o in llm.generate(reqs, use_tqdm=False)] == expected
    assert {"sparse", "dense", "split"} <= set(kinds), kinds


def test_v32_under_triton_mla_is_a_config_error(model_dir):
    with pytest.raises(ValueError, match="dsa"):
        make_llm(model_dir, attention={"backend": "triton_mla"})


def test_backend_auto_picks_dsa_for_a_v32_checkpoint_on_a_gpu(model_dir):
    from paddle_mla.config.backends import resolved_config
    from paddle_mla.config.schema import load_config
    from paddle_mla.engine.run_info import checkpoint_model_type

    assert checkpoint_model_type(model_dir) == "deepseek_v32"
    cfg = load_config(None, (f"model={model_dir}",))
    assert resolved_config(cfg, "gpu", checkpoint_model_type(model_dir)).attention.backend == "dsa"
    assert resolved_config(cfg, "cpu", checkpoint_model_type(model_dir)).attention.backend == "native"
    assert make_llm(model_dir).runner.backend.name == "native"     # auto on this CPU box


@CPU_TRITON
def test_dsa_workspaces_once_per_step_not_per_layer(model_dir, baseline, monkeypatch):
    """A step with prefill tokens allocates its indexer workspace in its first layer only; decode steps
    reuse the start-up one."""
    from paddle_mla.attention.dsa.backend import DSABackend

    reqs, expected = baseline
    llm = make_llm(model_dir, attention={"backend": "dsa"})
    assert llm.runner.arch.num_layers > 1
    allocs, steps = [], []
    alloc, forward = DSABackend._alloc, type(llm.runner).run_model
    monkeypatch.setattr(DSABackend, "_alloc", lambda self, *a: allocs.append(a) or alloc(self, *a))
    monkeypatch.setattr(type(llm.runner), "run_model",
                        lambda self, batch, *a, **k: steps.append(batch) or forward(self, batch, *a, **k))
    assert [o.token_ids for o in llm.generate(reqs[:2], use_tqdm=False)] == expected[:2]
    prefill_steps = sum(bool(b.is_prefill.any()) for b in steps)
    assert prefill_steps >= 1 and len(steps) > prefill_steps
    assert len(allocs) == prefill_steps + 1      # + the decode workspace, once


@CPU_TRITON
def test_dsa_prefill_scores_in_row_chunks(model_dir, baseline, monkeypatch):
    """Prefill rows scored a few at a time through a small buffer (as 8k-token chunks against a 128k
    context are): the same tokens as the plain run."""
    from paddle_mla.attention.dsa import backend as dsa_backend

    reqs, expected = baseline
    monkeypatch.setattr(dsa_backend, "PREFILL_SCORE_BYTES", 4 * 64 * 5)    # 5 rows of 64 keys
    monkeypatch.setattr(dsa_backend, "PREFILL_TOPK_ROWS", 3)
    llm = make_llm(model_dir, attention={"backend": "dsa"})
    assert [o.token_ids for o in llm.generate(reqs[:3], use_tqdm=False)] == expected[:3]
    assert llm.runner.backend._prefill["score_rows"] == 3
