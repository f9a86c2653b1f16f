"""``append_attn`` (the compiled op reading head-wise [B, Hkv, M] tables) against ``native`` (the
plain-tensor reference) through the whole engine with head-wise SWA, fp32: identical greedy tokens
with prefix caching, chunked prefill and preemption, recycling on and off. CPU here (the C++ op);
the GPU variant runs the CUDA op with an fp32 cache, CUDA graphs (3-D static tables) on and off.
The checkpoint and engine configs are those of tests/test_head_wise_swa_oracle.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from test_head_wise_swa_oracle import _engine, checkpoint, engine_tokens  # noqa: E402,F401

from paddle_mla.ops import append_attention as op  # noqa: E402

# (ratio, window, recycle): windows shorter than every prompt, so SWA rows hold -1 slots
CASES = [(0.5, 5, True), (0.5, 5, False), (1.0, 6, True)]


@pytest.fixture(autouse=True)
def _needs_op():
    if op.implementation() != "custom_op":
        pytest.skip("custom ops not built")


@pytest.mark.parametrize("ratio,window,recycle", CASES)
def test_head_wise_append_attn_matches_native_cpu(checkpoint, ratio, window, recycle):
    _, path = checkpoint
    got = engine_tokens(_engine(path, "append_attn", ratio, window, recycle, tight=True))
    want = engine_tokens(_engine(path, "native", ratio, window, recycle, tight=True))
    assert got == want


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("ratio,window,recycle", CASES)
def test_head_wise_append_attn_matches_native_gpu(checkpoint, ratio, window, recycle, graph):
    """The CUDA op with an fp32 cache and head-wise tables; CUDA graphs replay 3-D static tables."""
    if not op.implementation(True) == "custom_op":
        pytest.skip("CUDA custom op not built")
    _, path = checkpoint
    llm = _engine(path, "append_attn", ratio, window, recycle, tight=True, device="gpu", cuda_graph=graph)
    assert (llm.runner.graphs is not None) == graph
    got = engine_tokens(llm)
    want = engine_tokens(_engine(path, "native", ratio, window, recycle, tight=True, device="gpu"))
    assert got == want
