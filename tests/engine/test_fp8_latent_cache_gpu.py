"""``cache.dtype: fp8_e4m3`` in the engine on a GPU: triton_mla against native on the same FP8 cache,
fp32 compute (exact fp32 dots, as test_engine_gpu.py asks), with chunked prefill, prefix caching and
CUDA graphs each on and off, and under preemption; a bf16 run completes (at V3's attention dims the
CUDA op over FP8 rows is test_mla_cuda_decode_engine_gpu.py's)."""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402

from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from test_engine_equivalence import workload  # noqa: E402

pytestmark = pytest.mark.gpu
BLOCK = 16


def make_llm(backend: str, dtype: str = "float32", chunked=False, prefix=False, graph=False, num_blocks=128) -> LLM:
    return LLM(config_from_dict({
        "model": "tiny", "device": "gpu", "dtype": dtype, "cuda_graph": graph, "attention": {"backend": backend},
        "cache": {"block_size": BLOCK, "num_blocks": num_blocks, "enable_prefix_caching": prefix,
                  "dtype": "fp8_e4m3"},
        "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 13 if chunked else 1024,
                      "enable_chunked_prefill": chunked}}))


@pytest.fixture(scope="module")
def native_fp8():
    llm = make_llm("native")
    reqs = workload(llm.runner.arch.vocab_size, seed=5)
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


@pytest.mark.parametrize("chunked,prefix,graph", list(itertools.product([False, True], repeat=3)))
def test_triton_mla_matches_native_on_fp8_cache(native_fp8, chunked, prefix, graph):
    reqs, expected = native_fp8
    llm = make_llm("triton_mla", chunked=chunked, prefix=prefix, graph=graph)
    assert llm.runner.kv_caches[0].dtype.itemsize == 1
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    if prefix:
        assert llm.stats().cached_prompt_tokens > 0


def test_preemption_on_fp8_cache(native_fp8):
    reqs, expected = native_fp8
    llm = make_llm("triton_mla", graph=True, num_blocks=4)   # a request takes up to 3, two at once 6
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert llm.stats().num_preemptions > 0


def test_bf16_run_over_fp8_cache_completes(native_fp8):
    """bf16 compute over the FP8 cache runs to the end on the Triton decode: the tiny model's latent
    (32 + 16) is not the CUDA op's 512 + 64; the op over FP8 rows in the engine is
    test_mla_cuda_decode_engine_gpu.py's FP8 case."""
    reqs, _ = native_fp8
    llm = make_llm("triton_mla", dtype="bfloat16", graph=True)
    assert llm.runner.backend.cuda is None
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert all(len(o.token_ids) == r.params.max_tokens for o, r in zip(outs, reqs))
