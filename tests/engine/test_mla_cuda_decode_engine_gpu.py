"""The SM90 MLA CUDA ops inside the engine: a random 2-layer model at V3's attention dims (16 heads,
latent 512 + rope 64, bf16) under triton_mla (the ``mla_decode`` op) and, with V3.2's indexer, under
dsa (the ``mla_sparse`` op runs every decode row), and under triton_mla over an FP8 latent cache
(``cache.dtype: fp8_e4m3``: both runs read the same rounded rows), with CUDA graphs, prefix caching, chunked prefill
and a cache small enough to force preemption, once with the CUDA ops (``attention.cuda_decode:
true``) and once with Triton.
Every request completes in both, the decode steps replay as graphs, and the two runs differ only
as two bf16 kernels may: every shared position's logprob within ``TOL`` of the other run's, and
where greedy tokens part, a near-tie (helpers/greedy_agreement.py). A random model has many
near-ties, so equal whole sequences prove little either way; the logprobs are the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.graph_replays import count_graph_replays
from helpers.greedy_agreement import near_tie_report

from paddle_mla.platform import runtime
from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.triton]
SMALL_V3 = dict(hidden_size=1024, intermediate_size=2048, vocab_size=4096, num_attention_heads=16,
                num_key_value_heads=16)
# dsa's top-k: above every context here, so each row selects all its keys and both runs attend the
# same ones (-1 padded rows through the sparse kernels). Under a top-k that cuts, the first bf16
# difference between two kernels changes the indexer's inputs, near-ties in its scores then select
# other keys, and the logprobs part by more than two kernels' rounding (H200, largest shared-position
# difference: CUDA vs Triton 0.078-0.095 at top-64 and 0.016 here; Triton's 32- vs 16-slot tiles
# alike, 0.077 and 0.016)
TOPK = 256
TOL = 0.05   # nats: a few bf16 ulps of a logit of this model's size (|logit| ~ 1), far below a wrong row's effect


def _generate(backend_name: str, cuda_decode: bool, prefix: bool, index_topk: int = TOPK, cache_dtype: str = "auto"):
    from benchmarks.harness.dims import V3_DENSE, V32_INDEXER
    from benchmarks.harness.models import dense_v3_model, v32_model
    from paddle_mla.platform.tensor_api import torch

    dev, dims = runtime.device_string("gpu"), dict(V3_DENSE, **SMALL_V3)
    if backend_name == "dsa":
        model = v32_model(2, dev, torch.bfloat16, dims=dims, indexer=dict(V32_INDEXER, index_topk=index_topk))[0]
    else:
        model = dense_v3_model(2, dev, torch.bfloat16, dims=dims)[0]
    llm = LLM(config_from_dict({
        "device": "gpu", "dtype": "bfloat16", "cuda_graph": True,
        "attention": {"backend": backend_name, "cuda_decode": cuda_decode},
        "cache": {"block_size": 16, "num_blocks": 40, "enable_prefix_caching": prefix, "dtype": cache_dtype},
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "enable_chunked_prefill": True}}), model=model)
    backend = llm.runner.backend
    replays = count_graph_replays(llm)
    rng = np.random.default_rng(0)
    shared = rng.integers(2, 4000, 32).tolist()
    reqs = [GenerationRequest(id=i, prompt_token_ids=(shared if prefix else []) + rng.integers(
                2, 4000, int(rng.integers(20, 80))).tolist(),
                params=SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.0, logprobs=True,
                                      top_logprobs=4))
            for i in range(16)]
    outs = llm.generate(reqs, use_tqdm=False)
    stats = llm.stats()
    llm.close()
    return backend, outs, stats, replays["n"]


@pytest.mark.parametrize("backend_name,cache_dtype", [("triton_mla", "auto"), ("dsa", "auto"),
                                                      ("triton_mla", "fp8_e4m3")])
@pytest.mark.parametrize("prefix", [False, True])
def test_cuda_decode_in_the_engine_matches_triton(backend_name, cache_dtype, prefix):
    from paddle_mla.attention.triton_mla import cuda_decode
    from paddle_mla.platform.tensor_api import torch

    why = cuda_decode.unavailable_reason(512, 576, torch.bfloat16, runtime.device_string("gpu"))
    if why:
        pytest.skip(f"mla_decode CUDA op unavailable: {why}")
    runs = {}
    for on in (True, False):
        backend, outs, stats, replays = _generate(backend_name, on, prefix, cache_dtype=cache_dtype)
        if backend_name == "dsa":
            assert backend.sparse_cfg.cuda == on
        else:
            assert (backend.cuda is not None) == on
        assert [o.error for o in outs] == [None] * 16
        assert [len(o.token_ids) for o in outs] == [48] * 16
        assert stats.num_preemptions > 0 and replays > 0
        runs[on] = [(list(o.token_ids), o.outputs[0].logprobs) for o in outs]
    reports = [near_tie_report(*a, *b, tol=TOL) for a, b in zip(runs[True], runs[False])]
    problems = [f"request {i}: {p}" for i, (_, _, ps) in enumerate(reports) for p in ps]
    summary = (f"{sum(r[0] == 48 for r in reports)} of 16 sequences equal; first differing positions "
               f"{sorted(r[0] for r in reports)}; largest shared-position logprob difference "
               f"{max(r[1] for r in reports):.4f}")
    assert not problems, summary + "\n" + "\n".join(problems[:10])
    print(summary)
