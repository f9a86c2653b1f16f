"""``append_attn`` (the compiled op reading head-wise [B, Hkv, M] tables) against ``native`` (the
plain-tensor reference) through the whole engine with head-wise SWA, fp32: identical greedy tokens
with prefix caching, chunked prefill and preemption, recycling on and off. CPU here (the C++ op);
the GPU variant runs the CUDA op with an fp32 cache, CUDA graphs (3-D static tables) on and off.
The checkpoint and engine configs are those of tests/models/test_head_wise_swa_oracle.py.
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


# mask mode (attention.swa_mode: mask): uniform tables, one pool, the op walks the whole row and masks
MASK_CASES = [(0.5, 5), (1.0, 6), (0.5, 64)]


@pytest.mark.parametrize("ratio,window", MASK_CASES)
def test_swa_mask_mode_matches_skip_mode_cpu(checkpoint, ratio, window):
    """The seed's baseline (uniform tables, every head walks the whole row and masks) gives the tokens
    of head-wise tables with skipping, and of the native reference, with prefix hits, chunks and
    preemption; its pool is one uniform BlockPool."""
    from paddle_mla.cache.block_pool import BlockPool

    _, path = checkpoint
    masked = _engine(path, "append_attn", ratio, window, False, tight=True, swa_mode="mask")
    assert type(masked.pool) is BlockPool and masked.runner.backend.swa_mask
    got = engine_tokens(masked)
    assert got == engine_tokens(_engine(path, "append_attn", ratio, window, False, tight=True))
    assert got == engine_tokens(_engine(path, "native", ratio, window, False, tight=True, swa_mode="mask"))


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graphs", "eager"])
def test_swa_mask_mode_matches_native_gpu(checkpoint, graph):
    """The CUDA op in mask mode (2-D tables, SWA heads masked while walking the whole row), fp32."""
    if not op.implementation(True) == "custom_op":
        pytest.skip("CUDA custom op not built")
    _, path = checkpoint
    got = engine_tokens(_engine(path, "append_attn", 0.5, 5, False, tight=True, device="gpu", cuda_graph=graph,
                                swa_mode="mask"))
    assert got == engine_tokens(_engine(path, "native", 0.5, 5, False, tight=True, device="gpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graphs", "eager"])
def test_per_head_ranges_append_attn_matches_native_gpu(checkpoint, graph):
    """Recycling re-splits the budget into per-head ranges of one flat cache (global ids): the CUDA op
    (eager and replayed from CUDA graphs) gives the native reference's tokens, fp32."""
    if not op.implementation(True) == "custom_op":
        pytest.skip("CUDA custom op not built")
    _, path = checkpoint
    llm = _engine(path, "append_attn", 0.5, 5, True, tight=True, device="gpu", cuda_graph=graph, num_blocks=16)
    assert llm.runner.swa_num_blocks == 14 and llm.runner.kv_caches[0][0].dim() == 3
    got = engine_tokens(llm)
    assert got == engine_tokens(_engine(path, "native", 0.5, 5, True, tight=True, device="gpu", num_blocks=16))
