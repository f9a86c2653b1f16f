"""The DSA tie rule on a GPU: on the checkpoint built to tie (test_dsa_ties_engine.py), ``dsa`` gives
the GPU ``native`` run's tokens on every request with chunked prefill, prefix caching and CUDA
graphs each on and off (decode steps replay the graphed top-k, whose candidates the GPU appends in
any order), also in deterministic mode. fp32 with exact dots (TRITON_F32_DEFAULT=ieee, set before any
kernel compiles)."""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402

from test_dsa_ties_engine import make_llm, tie_workload  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.triton]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from helpers.dsa_tie_model import make_tie_model

    return str(make_tie_model(tmp_path_factory.mktemp("tiny_v32_ties_gpu"), index_heads=2))


def gpu_llm(model_dir: str, backend: str, chunked=False, prefix=False, graph=False, deterministic=False):
    return make_llm(model_dir, "gpu", cuda_graph=graph, deterministic=deterministic, attention={"backend": backend},
                    cache={"block_size": 16, "num_blocks": 64, "enable_prefix_caching": prefix},
                    scheduler={"max_num_seqs": 3, "max_num_batched_tokens": 24 if chunked else 512,
                               "enable_chunked_prefill": chunked})


@pytest.fixture(scope="module")
def native(model_dir):
    llm = gpu_llm(model_dir, "native")
    reqs = tie_workload(llm.runner.arch.vocab_size)
    return reqs, [o.token_ids for o in llm.generate(reqs, use_tqdm=False)]


@pytest.mark.parametrize("chunked,prefix,graph", list(itertools.product([False, True], repeat=3)))
def test_dsa_ties_match_native_on_gpu(model_dir, native, chunked, prefix, graph):
    reqs, expected = native
    llm = gpu_llm(model_dir, "dsa", chunked, prefix, graph)
    assert (llm.runner.graphs is not None) == graph
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    assert [o.token_ids for o in outs] == expected


@pytest.mark.parametrize("graph", [False, True])
def test_dsa_deterministic_matches_native_on_gpu(model_dir, native, graph):
    """The batch-invariant plan (one sparse split, column-order candidates; docs/dsa.md) keeps the tokens."""
    reqs, expected = native
    llm = gpu_llm(model_dir, "dsa", chunked=True, prefix=True, graph=graph, deterministic=True)
    assert llm.runner.backend.forced_splits == 1
    assert [o.token_ids for o in llm.generate(reqs, use_tqdm=False)] == expected
