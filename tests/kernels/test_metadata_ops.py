"""Per-step metadata custom ops (custom_ops/) against their plain-tensor references
(paddle_mla/ops/reference.py) and a plain-Python model of the semantics (fastdeploy-notes 2-3).

The compiled ops must really run here: a test is skipped only when the build is unavailable, with
the reason; PADDLE_MLA_REQUIRE_CUSTOM_OPS=1 (CI) turns that skip into a failure.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_mla.platform import runtime
from paddle_mla.ops import build, metadata, reference
from paddle_mla.platform.tensor_api import torch


@pytest.fixture(scope="module")
def ops():
    compiled = build.load_ops()
    if compiled is None:
        why = f"compiled metadata ops unavailable under {runtime.name()}: {build.unavailable_reason()}"
        if os.environ.get("PADDLE_MLA_REQUIRE_CUSTOM_OPS") == "1":
            pytest.fail(why + " (PADDLE_MLA_REQUIRE_CUSTOM_OPS=1)")
        pytest.skip(why)
    return compiled


def t(a, dtype=np.int32):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=dtype)))


def host(x) -> np.ndarray:
    return x.cpu().numpy()


# ---- plain-Python model of the semantics ---------------------------------------------------------

def model_positions(enc, dec, this, num_tokens):
    out = []
    for e, d, n in zip(enc, dec, this):
        out += range(d, d + (e if e > 0 else n if d > 0 else 0))
    return (out + [0] * num_tokens)[:num_tokens]


def model_cu_seqlens(this, dec, num_tokens):
    cu_q = np.concatenate([[0], np.cumsum(this, dtype=np.int64)])
    cu_k = np.concatenate([[0], np.cumsum(np.asarray(this, np.int64) + dec, dtype=np.int64)])
    ids = [b for b, n in enumerate(this) for _ in range(n)]
    return cu_q, cu_k, (ids + [-1] * num_tokens)[:num_tokens]


def model_slots(tables, ids, positions, block_size):
    return [-1 if b < 0 else int(tables[b][p // block_size]) * block_size + p % block_size
            for b, p in zip(ids, positions)]


# ---- a step's batch: prefill (fresh or after cached prefix/chunks), decode, idle slots ------------

@st.composite
def steps(draw):
    kinds = draw(st.lists(st.sampled_from(["prefill", "chunk", "decode", "idle"]), max_size=9))
    enc, dec, this = [], [], []
    for kind in kinds:
        cached = 0 if kind == "prefill" else draw(st.integers(1, 70))
        new = 0 if kind == "idle" else draw(st.sampled_from([1, 1, 1, 2])) if kind == "decode" else draw(
            st.integers(1, 40))
        cached = 0 if kind == "idle" else cached
        enc.append(new if kind in ("prefill", "chunk") else 0)
        dec.append(cached)
        this.append(new)
    pad = draw(st.integers(0, 6))
    block_size = draw(st.sampled_from([1, 2, 4, 16, 64]))
    need = [-(-(d + n) // block_size) for d, n in zip(dec, this)]
    width = max(need, default=0) + draw(st.integers(0, 2))
    pool = draw(st.permutations(range(max(sum(need), 1) + 7)))
    tables, used = np.full((len(kinds), width), -1, np.int32), 0
    for b, k in enumerate(need):
        tables[b, :k] = pool[used:used + k]
        used += k
    return enc, dec, this, sum(this) + pad, tables, block_size


def _check_step(ops, enc, dec, this, num_tokens, tables, block_size):
    enc_t, dec_t, this_t = t(enc), t(dec), t(this)

    pos = ops.get_position_ids(enc_t, dec_t, this_t, num_tokens)
    assert pos.dtype == torch.int64 and tuple(pos.shape) == (num_tokens,)
    ref_pos = reference.get_position_ids(enc_t, dec_t, this_t, num_tokens)
    np.testing.assert_array_equal(host(pos), host(ref_pos))
    np.testing.assert_array_equal(host(pos), model_positions(enc, dec, this, num_tokens))

    cu_q, cu_k, ids = ops.get_cu_seqlens(this_t, dec_t, num_tokens)
    for got, want in zip((cu_q, cu_k, ids), reference.get_cu_seqlens(this_t, dec_t, num_tokens)):
        assert got.dtype == torch.int32
        np.testing.assert_array_equal(host(got), host(want))
    for got, want in zip((cu_q, cu_k, ids), model_cu_seqlens(this, dec, num_tokens)):
        np.testing.assert_array_equal(host(got), want)

    slots = ops.compute_slot_mapping(t(tables), ids, pos, block_size)
    assert slots.dtype == torch.int64 and tuple(slots.shape) == (num_tokens,)
    np.testing.assert_array_equal(host(slots), host(reference.compute_slot_mapping(t(tables), ids, pos, block_size)))
    np.testing.assert_array_equal(host(slots), model_slots(tables, host(ids), host(pos), block_size))
    return host(slots)


# ---- exact cases (fastdeploy-notes sections 2 and 3) ----------------------------------------------

def test_position_ids_exact(ops):
    args = (t([3, 2]), t([1, 2]), t([1, 2]), 8)
    for fn in (ops.get_position_ids, reference.get_position_ids, metadata.get_position_ids):
        assert host(fn(*args)).tolist() == [1, 2, 3, 2, 3, 0, 0, 0]


def test_cu_seqlens_exact(ops):
    for fn in (ops.get_cu_seqlens, reference.get_cu_seqlens, metadata.get_cu_seqlens):
        cu_q, cu_k, ids = fn(t([3, 1, 0, 2]), t([0, 5, 4, 2]), 8)
        assert host(cu_q).tolist() == [0, 3, 4, 4, 6]
        assert host(cu_k).tolist() == [0, 3, 9, 13, 17]
        assert host(ids).tolist() == [0, 0, 0, 1, 3, 3, -1, -1]


def test_slot_mapping_exact(ops):
    tables = t([[10, 20], [0, 0], [0, 0], [0, 0]])
    args = (tables, t([0, 0, 0, 0, 0, 0, -1]), t([0, 1, 2, 3, 4, 5, 0], np.int64), 4)
    for fn in (ops.compute_slot_mapping, reference.compute_slot_mapping, metadata.compute_slot_mapping):
        assert host(fn(*args)).tolist() == [40, 41, 42, 43, 80, 81, -1]


def test_metadata_dispatches_to_compiled_ops(ops, monkeypatch):
    """metadata.* must run the compiled op: with the references made to fail, it still answers."""
    assert metadata.implementation() == "custom_op"

    def unused(*args):
        raise AssertionError("the plain-tensor reference ran although the compiled ops are loaded")

    for name in build.OP_NAMES:
        monkeypatch.setattr(reference, name, unused)
    assert host(metadata.get_position_ids(t([3, 2]), t([1, 2]), t([1, 2]), 8)).tolist() == [1, 2, 3, 2, 3, 0, 0, 0]
    _, _, ids = metadata.get_cu_seqlens(t([4, 2]), t([0, 6]), 6)
    slots = metadata.compute_slot_mapping(t([[10, 20], [7, 9]]), ids, t([0, 1, 2, 3, 6, 7], np.int64), 4)
    assert host(slots).tolist() == [40, 41, 42, 43, 38, 39]


def test_int64_inputs_are_accepted(ops):
    """The bindings cast other integer dtypes to the kernels' (the references accept any)."""
    enc, dec, this = t([3, 2], np.int64), t([1, 2], np.int64), t([1, 2], np.int64)
    assert host(ops.get_position_ids(enc, dec, this, 8)).tolist() == [1, 2, 3, 2, 3, 0, 0, 0]
    cu_q, _, ids = ops.get_cu_seqlens(this, dec, 4)
    assert host(cu_q).tolist() == [0, 1, 3] and cu_q.dtype == torch.int32
    slots = ops.compute_slot_mapping(t([[10, 20], [3, 4]], np.int64), ids.to(torch.int64), t([1, 2, 3, 0]), 4)
    assert host(slots).tolist() == [41, 14, 15, -1]


@pytest.mark.parametrize("case", ["empty_batch", "pure_prefill", "pure_decode", "mixed_chunked_prefix",
                                  "block_size_1", "only_padding"])
def test_edges(ops, case):
    enc, dec, this, pad, bs = {
        "empty_batch": ([], [], [], 0, 4),
        "pure_prefill": ([5, 3], [0, 0], [5, 3], 0, 4),
        "pure_decode": ([0, 0, 0], [7, 1, 16], [1, 1, 1], 2, 4),
        "mixed_chunked_prefix": ([4, 0, 3, 0], [8, 9, 0, 0], [4, 1, 3, 0], 3, 4),
        "block_size_1": ([2, 0], [3, 5], [2, 1], 1, 1),
        "only_padding": ([0, 0], [0, 0], [0, 0], 5, 4),
    }[case]
    width = max([-(-(d + n) // bs) for d, n in zip(dec, this)], default=0)
    tables = np.arange(len(this) * width, dtype=np.int32).reshape(len(this), width) * 3 + 100
    _check_step(ops, enc, dec, this, sum(this) + pad, tables, bs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=steps())
def test_randomized_vs_reference(ops, step):
    slots = _check_step(ops, *step)
    real = slots[slots >= 0]
    assert len(set(real.tolist())) == len(real), "two tokens of the step map to one cache slot"


@pytest.mark.gpu
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=steps())
def test_cuda_ops_vs_reference(ops, step):
    assert ops.with_cuda, f"the ops in {ops.build_dir} were built without CUDA kernels (nvcc missing?)"
    enc, dec, this, num_tokens, tables, bs = step
    gpu = runtime.device_string("gpu")
    enc_d, dec_d, this_d, tables_d = (t(a).to(gpu) for a in (enc, dec, this, tables))
    pos = ops.get_position_ids(enc_d, dec_d, this_d, num_tokens)
    cu_q, cu_k, ids = ops.get_cu_seqlens(this_d, dec_d, num_tokens)
    slots = ops.compute_slot_mapping(tables_d, ids, pos, bs)
    want_pos = reference.get_position_ids(t(enc), t(dec), t(this), num_tokens)
    want_cu = reference.get_cu_seqlens(t(this), t(dec), num_tokens)
    want_slots = reference.compute_slot_mapping(t(tables), want_cu[2], want_pos, bs)
    for got, want in zip((pos, cu_q, cu_k, ids, slots), (want_pos, *want_cu, want_slots)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(host(got), host(want))


@pytest.mark.gpu
def test_cuda_ops_large_batch(ops):
    """More requests and tokens than one CUDA block has threads (the reductions loop)."""
    rng = np.random.default_rng(0)
    b = 700
    this = rng.integers(0, 3, b).astype(np.int32)
    dec = rng.integers(0, 600, b).astype(np.int32)
    enc = np.where(rng.random(b) < 0.3, this, 0).astype(np.int32)
    dec = np.where((enc == 0) & (this > 0) & (dec == 0), 1, dec).astype(np.int32)
    tables = rng.integers(0, 10_000, (b, 40)).astype(np.int32)
    gpu = runtime.device_string("gpu")
    num_tokens = int(this.sum()) + 300
    got = ops.get_position_ids(t(enc).to(gpu), t(dec).to(gpu), t(this).to(gpu), num_tokens)
    np.testing.assert_array_equal(host(got), host(reference.get_position_ids(t(enc), t(dec), t(this), num_tokens)))
    got_cu = ops.get_cu_seqlens(t(this).to(gpu), t(dec).to(gpu), num_tokens)
    want_cu = reference.get_cu_seqlens(t(this), t(dec), num_tokens)
    for g, w in zip(got_cu, want_cu):
        np.testing.assert_array_equal(host(g), host(w))
    slots = ops.compute_slot_mapping(t(tables).to(gpu), got_cu[2], got, 16)
    want = reference.compute_slot_mapping(t(tables), want_cu[2], host_t(got), 16)
    np.testing.assert_array_equal(host(slots), host(want))


def host_t(x):
    return torch.from_numpy(host(x))
