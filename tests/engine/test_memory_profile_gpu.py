"""The KV cache sized by the profile run, on a GPU (torch runtime).

A DeepSeek-V3-dims model (2 layers, random bf16 weights, vocab 129280), triton_mla with CUDA graphs,
``gpu_memory_utilization`` 0.9, chunked prefill at ``max_num_batched_tokens`` 8192 and
``max_num_seqs`` 512 at the model's full context, so the cache is sized by memory, not capped by
what the engine could use:

- the figures logged at start-up add up (budget - each figure = KV cache), and they match the
  memory the engine holds once it is up;
- a run whose steps are full 8192-token chunks over long cached contexts, next to decodes replayed
  as graphs, completes without running out of memory.

Both with the model's bf16 cache and with the FP8 latent cache (``cache.dtype: fp8_e4m3``: a block
takes 592 bytes a token a layer instead of 1152, and its chunks read the rows back dequantized); the
FP8 run allows 1024 sequences, as 512 at the full context would cap its twice as many blocks.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams

pytestmark = pytest.mark.gpu
LAYERS = 2
GiB = float(1 << 30)


def random_v3_model():
    from benchmarks.harness.models import dense_v3_model   # the decode benchmarks' random V3-dims weights
    from paddle_mla.platform.tensor_api import torch

    return dense_v3_model(LAYERS, runtime.device_string("gpu"), torch.bfloat16)[0]


@pytest.fixture(scope="module", params=["auto", "fp8_e4m3"])
def profiled(request):
    runtime.empty_cache()
    cfg = config_from_dict({"device": "gpu", "dtype": "bfloat16", "attention": {"backend": "triton_mla"},
                            "cuda_graph": True,
                            "cache": {"block_size": 64, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
                                      "dtype": request.param},
                            "scheduler": {"max_num_seqs": 512 if request.param == "auto" else 1024,
                                          "max_num_batched_tokens": 8192,
                                          "enable_chunked_prefill": True}})
    log = io.StringIO()
    model = random_v3_model()     # prebuilt: the run plan takes its architecture, not the tiny folder's
    with contextlib.redirect_stderr(log):
        llm = LLM(cfg, model=model)
    yield llm, log.getvalue()
    llm.close()
    runtime.empty_cache()


def test_logged_figures_add_up_and_match_the_engine(profiled):
    from paddle_mla.platform.tensor_api import torch

    llm, log = profiled
    prof = llm.runner.memory_profile
    assert prof is not None
    start = log.index("paddle_mla: KV cache sized by a profile run (GiB)")
    block = log[start:].splitlines()[:8]
    print("\n".join(block))
    assert "\n".join(block) == prof.report()
    figures = [float(re.search(r"(-?\d+\.\d+)", line[26:]).group(1)) for line in block[2:]]
    budget = float(re.search(r"= (-?\d+\.\d+)", block[1]).group(1))
    assert abs(budget - sum(figures[:-1]) - figures[-1]) <= 0.01 * len(figures)
    assert prof.kv_cache == (prof.budget - prof.weights - prof.activations - prof.sampler - prof.graph_pools
                             - prof.non_torch)
    assert prof.activations > 0.1 * GiB and prof.graph_pools > 0 and prof.weights > 4 * GiB
    fp8 = llm.runner.plan.kv.fp8
    assert prof.per_block == LAYERS * 64 * (592 if fp8 else 576 * 2)
    assert prof.num_blocks == prof.kv_cache // prof.per_block < prof.usable_blocks   # sized by memory, not capped
    assert llm.runner.limits.num_blocks == prof.num_blocks
    cache_bytes = sum(c.numel() * c.element_size() for c in llm.runner.kv_caches)
    assert cache_bytes == prof.num_blocks * prof.per_block
    free, total = torch.cuda.mem_get_info()
    used = total - free
    # Up and idle, the process holds the budget less what only steps use (activations, sampler) and
    # less what the graphs did not need of their reserve; never more than the budget.
    assert used <= prof.budget + 0.25 * GiB, (used / GiB, prof.report())
    assert used >= prof.budget - prof.activations - prof.sampler - prof.graph_pools - 0.5 * GiB, (used / GiB,
                                                                                              prof.report())


def test_full_chunks_over_long_contexts_do_not_run_out_of_memory(profiled):
    llm, _ = profiled
    vocab = llm.runner.arch.vocab_size
    rng = np.random.default_rng(0)
    shared = rng.integers(2, vocab, 12_000).tolist()
    reqs = []
    for i in range(4):          # long prompts: 8192-token chunks over up to 40k tokens of cached context
        reqs.append(GenerationRequest(id=i, prompt_token_ids=rng.integers(2, vocab, 40_000).tolist(),
                                      params=SamplingParams(max_tokens=16, ignore_eos=True)))
    for i in range(4, 100):     # a shared-prefix crowd decoding next to them (graphs), some sampled
        params = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.8 if i % 2 else 0.0,
                                top_p=0.9, top_k=50, seed=i)
        reqs.append(GenerationRequest(id=i, prompt_token_ids=shared + rng.integers(2, vocab, 300).tolist(),
                                      params=params))
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [len(o.token_ids) for o in outs] == [r.params.max_tokens for r in reqs]
    assert llm.stats().cached_prompt_tokens > 0
