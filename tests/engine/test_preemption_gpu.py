"""Preemption under triton_mla + CUDA graphs + bf16: every request completes.

A cache of 24 blocks of 16 tokens for 8 concurrent requests that each grow to ~6 blocks forces the
scheduler to preempt (free the blocks, recompute later). Every request must still finish with its
full length, and the decode steps must have run as graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.graph_replays import count_graph_replays

from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("prefix", [False, True])
def test_preemption_with_triton_graphs_bf16_completes_every_request(prefix):
    llm = LLM(config_from_dict({
        "device": "gpu", "dtype": "bfloat16", "cuda_graph": True, "attention": {"backend": "triton_mla"},
        "cache": {"block_size": 16, "num_blocks": 24, "enable_prefix_caching": prefix},
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "enable_chunked_prefill": True}}))
    assert llm.runner.graphs is not None
    replays = count_graph_replays(llm)
    vocab = llm.runner.arch.vocab_size
    rng = np.random.default_rng(0)
    shared = rng.integers(2, vocab, 16).tolist()
    reqs = [GenerationRequest(id=i, prompt_token_ids=(shared if prefix else []) + rng.integers(
                2, vocab, int(rng.integers(20, 50))).tolist(),
                params=SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0 if i % 2 else 0.7, seed=i))
            for i in range(16)]
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [len(o.token_ids) for o in outs] == [40] * len(reqs)
    assert all(o.finish_reason == "length" for o in outs)
    assert all(0 <= t < vocab for o in outs for t in o.token_ids)
    assert llm.stats().num_preemptions > 0
    assert replays["n"] > 0
    llm.close()
