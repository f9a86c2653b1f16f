"""``deterministic: true`` with prefix caching, a multi-turn conversation: the second turn's prompt
repeats the first turn's outputs. Under the mode ``triton_mla`` computes prompt and output tokens on
different paths, so the first turn's blocks that hold outputs must not serve the second turn's
prompt (``BlockPool(outputs_apart=True)``): its tokens and logprob bits then equal a run without
the prefix cache. Tiny model, CPU, fp32, Triton interpreter."""

from __future__ import annotations

import pytest

from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

pytestmark = [pytest.mark.triton, pytest.mark.slow]

PROMPT = [5 + (i * 37) % 200 for i in range(13)]     # ends inside the second 8-token block


def _llm(prefix: bool) -> LLM:
    return LLM(config_from_dict({
        "device": "cpu", "dtype": "float32", "deterministic": True, "attention": {"backend": "triton_mla"},
        "cache": {"block_size": 8, "num_blocks": 64, "enable_prefix_caching": prefix},
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 256}}))


def _run(llm, i, prompt, n):
    req = GenerationRequest(id=i, prompt_token_ids=prompt,
                            params=SamplingParams(max_tokens=n, ignore_eos=True, logprobs=True))
    out = llm.generate([req], use_tqdm=False)[0]
    return out.token_ids, [lp.logprob for lp in out.outputs[0].logprobs]


def _two_turns(monkeypatch, outputs_apart: bool):
    from paddle_mla.worker import model_runner

    make = model_runner.make_block_pool
    monkeypatch.setattr(model_runner, "make_block_pool",
                        lambda *a, **kw: make(*a, **{**kw, "outputs_apart": kw["outputs_apart"] and outputs_apart}))
    llm = _llm(prefix=True)
    first, _ = _run(llm, 0, PROMPT, 12)
    second = PROMPT + first[:6]
    return second, _run(llm, 1, second, 8), llm.core.scheduler.cached_prompt_tokens


def test_second_turn_keeps_its_bits_with_the_prefix_cache(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    second, got, cached = _two_turns(monkeypatch, outputs_apart=True)
    assert cached == 8        # block 0 only: block 1 holds the first turn's outputs from position 13
    assert got == _run(_llm(prefix=False), 1, second, 8)


def test_without_the_output_mark_the_second_turn_changes_bits(monkeypatch):
    """The control: let the second turn reuse the first turn's output blocks, and its logprob bits
    differ from the run without the cache (positions 13-15 came from the decode path)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    second, got, cached = _two_turns(monkeypatch, outputs_apart=False)
    assert cached == 16
    ref = _run(_llm(prefix=False), 1, second, 8)
    assert got[1] != ref[1]
