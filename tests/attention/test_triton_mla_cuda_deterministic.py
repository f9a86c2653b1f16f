"""``triton_mla`` under ``deterministic: true`` with the CUDA decode: the wiring, on CPU.

The SM90 op itself runs only on a GPU (tests/kernels/test_mla_decode_cuda_gpu.py holds its
batch-invariance test). Here its launch is replaced by the plain-tensor reference, and everything
around it is the real code: the backend picks the CUDA decoder in this mode, the decoder builds the
batch-invariant plan (each row's splits its own length over the split size), and the extend tokens
of output positions (a preempted request's recomputed outputs) go through the same decoder as pseudo
rows of one token each (the op's 64-row programs hold one token's heads, padded below 64 heads);
prompt rows take the segmented expanded extend. The step must equal ``native``'s.
"""

import dataclasses


import numpy as np
import pytest
from helpers.mixed_batch_cases import DIMS, make_case, run_backend
from helpers.triton_kernel_helpers import device_and_tolerance

pytestmark = pytest.mark.triton

DEV, TOL = device_and_tolerance()
# decode rows (one on a page boundary), then extend rows over cached contexts and a fresh prompt
ROWS = [(37, 1), (16, 1), (130, 1), (90, 20), (0, 13), (64, 17)]
# the decode rows and the 20-token row are output tokens (the latter recomputed after a preemption)
PROMPT_LENS = [30, 10, 100, 90, 13, 81]
SPLIT = 64  # keys a split: one 64-key tile, so contexts past 64 keys take several splits
WIDE = dataclasses.replace(DIMS, num_heads=64)   # one token's heads fill a 64-row program


@pytest.fixture
def reference_op(monkeypatch):
    """The CUDA decode made available, its launch computed by the reference; returns the launches
    seen as (rows, tiles a window, whether every row's split count is its own windows')."""
    if DEV != "cpu":
        pytest.skip("the wiring test replaces the op; on a GPU the op itself runs in the GPU tests")
    from paddle_mla.attention.triton_mla import backend, cuda_decode
    from paddle_mla.attention.triton_mla.reference import mla_decode_ref

    calls = []

    def fake_op(q, kv_cache, block_tables, seq_lens, out, num_splits, cu_tiles, split_start, tiles_per_prog,
                partial_out, partial_lse, batch, softmax_scale, launch):
        tiles = -(-seq_lens[:batch].long().numpy() // launch.block_n)
        window = int(tiles_per_prog[0])
        own_windows = np.array_equal(num_splits[:batch].numpy(), np.maximum(-(-tiles // window), 1))
        calls.append((batch, window, own_windows))
        out[:batch] = mla_decode_ref(q[:batch].float(), kv_cache.float(), block_tables[:batch], seq_lens[:batch],
                                     WIDE.kv_lora_rank, softmax_scale).to(out.dtype)
        return out

    monkeypatch.setattr(backend, "unavailable_reason", lambda *a: "")
    monkeypatch.setattr(cuda_decode.op, "LATENT_DIM", WIDE.kv_lora_rank)
    monkeypatch.setattr(cuda_decode.op, "mla_decode", fake_op)
    return calls


def _step(dims=WIDE, **kwargs):
    import torch

    case = make_case(ROWS, page=8, device=DEV, dtype=torch.float32, seed=7, dims=dims, prompt_lens=PROMPT_LENS)
    got, _, meta = run_backend("triton_mla", case, DEV, dims=dims, cuda_decode=True, **kwargs)
    native, _, _ = run_backend("native", case, DEV, dims=dims)
    torch.testing.assert_close(got, native, atol=TOL, rtol=TOL)
    return meta


def test_deterministic_mode_runs_decode_and_extend_rows_through_the_cuda_decode(reference_op):
    meta = _step(deterministic=True, split_tokens=SPLIT)
    # the 3 decode rows in one launch and every recomputed output token as a pseudo row of its own in
    # another, both on the batch-invariant plan of one-tile windows (rows of up to 147 keys take 3
    # splits); the two prompt rows go expanded, one segment each
    assert reference_op == [(3, 1, True), (20, 1, True)]
    assert meta.attn.short_split.groups == 20
    assert [tuple(r[3:5]) for r in meta.attn.segments.records] == [(0, 13), (0, 81)]


def test_default_mode_gives_the_cuda_decode_the_decode_rows_alone(reference_op):
    """Outside the mode the op serves the decode rows on the balanced plan (one window a program,
    across rows), and the extend rows keep the Triton paths."""
    _step()
    ((rows, window, _),) = reference_op
    assert rows == 3 and window > 1


def test_deterministic_mode_below_64_heads_takes_the_op_too(reference_op):
    """At 4 heads the op pads a pseudo row to a 64-row program; in the mode those are only recomputed
    output tokens (prompt rows run expanded), so the op serves decode and pseudo rows there too."""
    meta = _step(dims=DIMS, deterministic=True, split_tokens=SPLIT)
    assert reference_op == [(3, 1, True), (20, 1, True)]
    assert meta.attn.short_split.groups == 20     # one token a group: the op's programs hold one token
