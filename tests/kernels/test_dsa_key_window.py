"""``[ks, ke)`` key windows of the DSA indexer: the Triton kernel (interpreter on CPU, or GPU) and the
vectorised tensor reference against the per-token loop (seed 000's cases, cached prefixes, chunked
requests, zero-length rows), and how ``ForwardMeta.build`` uses them (skipped in pure decode)."""

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.attention.dsa.key_window import KeyWindows
from paddle_mla.attention.dsa.reference import key_window_ref
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.platform.tensor_api import torch

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
TRITON_OK = runtime.supports_triton_on("gpu" if runtime.gpu_available() else "cpu")[0]

# (num_new, num_cached) per request
CASES = {
    "one_prefill": ([7], [0]),
    "batch_of_prefills": ([5, 1, 9, 3], [0, 0, 0, 0]),
    "prefill_and_decodes": ([1, 6, 1, 1, 4], [12, 0, 30, 2, 0]),
    "cached_prefixes": ([4, 3, 8], [16, 5, 64]),
    "chunked_requests": ([32, 32, 1], [64, 0, 99]),
    "zero_length_rows": ([0, 5, 0, 0, 3, 0], [7, 0, 4, 0, 2, 9]),
    "long_rows_multi_block": ([700, 1, 300], [1000, 50, 0]),
}


def _step(num_new, num_cached, block_size=16):
    num_new, num_cached = np.array(num_new, np.int32), np.array(num_cached, np.int32)
    width = max(1, -(-int((num_new + num_cached).max()) // block_size))
    tables = np.arange(len(num_new) * width, dtype=np.int32).reshape(len(num_new), width)
    is_prefill = (num_new > 1) | (num_cached == 0)
    return StepBatch(token_ids=np.zeros(int(num_new.sum()), np.int64), num_new=num_new, num_cached=num_cached,
                     block_tables=tables, is_prefill=is_prefill, sample_mask=np.ones(len(num_new), bool))


def _expected(num_new, num_cached):
    cu_k = np.concatenate([[0], np.cumsum(np.array(num_new) + np.array(num_cached))])
    return key_window_ref(cu_k, np.array(num_cached), np.array(num_new))


def _impls():
    out = [pytest.param(False, id="tensor_ref")]
    out.append(pytest.param(True, id="triton", marks=pytest.mark.skipif(not TRITON_OK, reason="no Triton launcher")))
    return out


@pytest.mark.parametrize("use_triton", _impls())
@pytest.mark.parametrize("case", sorted(CASES))
def test_key_windows_match_loop(case, use_triton):
    num_new, num_cached = CASES[case]
    kw = KeyWindows(2048, DEV, use_triton=use_triton)
    meta = ForwardMeta.build(_step(num_new, num_cached), 16, DEV, key_windows=kw)
    ks_ref, ke_ref = _expected(num_new, num_cached)
    assert meta.index_ks is not None and meta.index_ks.shape[0] == len(ks_ref)
    np.testing.assert_array_equal(meta.index_ks.cpu().numpy(), ks_ref)
    np.testing.assert_array_equal(meta.index_ke.cpu().numpy(), ke_ref)
    # the window of each token ends at its own key: ke - ks == position + 1
    np.testing.assert_array_equal(ke_ref - ks_ref, meta.positions.cpu().numpy() + 1)


@pytest.mark.parametrize("use_triton", _impls())
def test_buffers_are_reused_not_reallocated(use_triton):
    kw = KeyWindows(64, DEV, use_triton=use_triton)
    a = ForwardMeta.build(_step([5, 3], [0, 2]), 16, DEV, key_windows=kw)
    ptr = kw.ks.data_ptr()
    b = ForwardMeta.build(_step([2, 1, 4], [9, 0, 1]), 16, DEV, key_windows=kw)
    assert kw.ks.data_ptr() == ptr and b.index_ks.data_ptr() == ptr
    np.testing.assert_array_equal(b.index_ke.cpu().numpy(), _expected([2, 1, 4], [9, 0, 1])[1])
    del a


def test_pure_decode_skips_the_kernel():
    class Never:
        def compute(self, *args):
            raise AssertionError("key windows computed in a pure-decode step")

    meta = ForwardMeta.build(_step([1, 1, 1], [5, 9, 2]), 16, DEV, key_windows=Never())
    assert meta.is_decode_only and meta.index_ks is None and meta.index_ke is None


def test_missing_input_and_overflow_are_clear_errors():
    kw = KeyWindows(8, DEV, use_triton=False)
    z = torch.zeros(2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens_k is missing"):
        kw.compute(z, None, z, z, 1)
    with pytest.raises(ValueError, match="exceed"):
        ForwardMeta.build(_step([9], [0]), 16, DEV, key_windows=kw)
