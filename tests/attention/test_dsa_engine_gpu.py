"""The engine on a GPU with the ``dsa`` backend, tiny deepseek_v32 model, fp32 with exact dots
(TRITON_F32_DEFAULT=ieee, set before any kernel compiles): identical greedy tokens to ``native``
with chunked prefill, prefix caching and CUDA graphs each on and off. Prompts are longer than
index_topk, so decode rows really attend a sparse selection; a graph replays decode steps whose
score rows are max_model_len wide and whose top-k follows each row's own length."""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402

from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from test_dsa_engine import workload  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.triton]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from paddle_mla.models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny_v32_gpu"), arch="deepseek_v32"))


def make_llm(model_dir: str, backend: str, chunked=False, prefix=False, graph=False) -> LLM:
    return LLM(config_from_dict({
        "model": model_dir, "device": "gpu", "dtype": "float32", "cuda_graph": graph,
        "attention": {"backend": backend},
        "cache": {"block_size": 16, "num_blocks": 64, "enable_prefix_caching": prefix},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 13 if chunked else 512,
                      "enable_chunked_prefill": chunked}}))


@pytest.fixture(scope="module")
def native(model_dir):
    llm = make_llm(model_dir, "native")
    reqs = workload(llm.runner.arch.vocab_size, n=6)
    assert max(len(r.prompt_token_ids) for r in reqs) > llm.runner.arch.indexer.topk
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


@pytest.mark.parametrize("chunked,prefix,graph", list(itertools.product([False, True], repeat=3)))
def test_dsa_matches_native_on_gpu(model_dir, native, chunked, prefix, graph):
    reqs, expected = native
    llm = make_llm(model_dir, "dsa", chunked, prefix, graph)
    assert (llm.runner.graphs is not None) == graph
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected
    if prefix:
        assert llm.stats().cached_prompt_tokens > 0
