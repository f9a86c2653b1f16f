"""The compiled ``append_attention`` op (C++ on CPU) against the plain-tensor reference
(``attention.gqa_reference``), under whichever runtime is selected (the suite runs under both).

Random paged inputs (tests/helpers/append_attention_cases.py): block sizes 16 and 64 (and 4, to cross many
block edges), GQA group sizes 1, 2 and 3, head dims that are not powers of two, partial rotary dims,
neox and interleaved RoPE, uniform and head-wise tables, SWA heads whose out-of-window blocks are -1
and NaN-poisoned, zero-length rows and padding tokens. Outputs and both caches must agree.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from helpers.append_attention_cases import Case, make_data, run_case
from paddle_mla.attention.gqa_reference import append_attention_reference
from paddle_mla.ops import append_attention as op
from paddle_mla.platform.tensor_api import torch

pytestmark = pytest.mark.skipif(op.implementation() != "custom_op", reason="custom ops not built")

REQS = {
    "mixed": ((0, 5), (4, 1), (7, 9), (15, 2), (0, 1)),
    "edges": ((3, 1), (15, 1), (0, 0), (0, 17), (16, 1), (63, 1), (64, 3)),   # decodes on block edges, empty row
    "long": ((70, 6), (129, 1), (0, 40)),
}
SHAPES = [  # hq, hkv, head_dim, rot_dim, neox
    (3, 3, 12, 12, True),    # group 1
    (4, 2, 10, 6, False),    # group 2, partial interleaved rope
    (6, 2, 24, 24, False),   # group 3
    (9, 3, 40, 32, True),    # group 3, partial neox rope
]
TABLES = [  # block_size, head_wise, (num_swa_heads, window, sink)
    (16, False, (0, 0, 0)),
    (64, False, (0, 0, 0)),
    (4, True, (0, 0, 0)),
    (16, True, (1, 5, 2)),
    (16, True, (2, 20, 16)),
    (64, False, (1, 3, 0)),
    (4, True, (1, 1, 4)),
]


def assert_same(got, want, atol, rtol):
    for name, g, w in zip(("out", "k_cache", "v_cache"), got, want):
        np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, equal_nan=True, err_msg=name)


# every (table, shape) pair once, the batches taking turns (keeps the file at seconds, not minutes)
COMBOS = [(t, s, sorted(REQS)[(ti + si) % len(REQS)]) for ti, t in enumerate(TABLES) for si, s in enumerate(SHAPES)]


def combo_id(combo) -> str:
    (bs, hw, swa), shape, reqs = combo
    return "bs{}{}swa{}-h{}x{}d{}r{}{}-{}".format(bs, "hw" if hw else "", swa[0], *shape[:4], "n" if shape[4] else "i",
                                                reqs)


@pytest.mark.parametrize("table,shape,reqs", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_cpu_op_matches_reference_fp32(table, shape, reqs):
    hq, hkv, d, rot, neox = shape
    bs, head_wise, swa = table
    swa = (min(swa[0], hkv), swa[1], swa[2])
    c = Case(REQS[reqs], hq, hkv, d, rot, neox, bs, head_wise, swa, pad=2,
             seed=zlib.crc32(repr((reqs, shape, table)).encode()) % 1000)
    data = make_data(c)
    got = run_case(c, op.append_attention, torch.float32, "cpu", data)
    want = run_case(c, append_attention_reference, torch.float32, "cpu", data)
    assert not np.isnan(got[0]).any()
    assert np.all(got[0][-2:] == 0), "padding tokens must come back as zeros"
    assert_same(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("table", [TABLES[0], TABLES[3]], ids=["bs16", "bs16hw-swa"])
def test_cpu_op_half_dtypes(dtype, table):
    """bf16 / fp16 storage: the same math in fp32; the op's caches and output are rounded to the dtype."""
    bs, head_wise, swa = table
    c = Case(REQS["mixed"], 6, 2, 24, 16, True, bs, head_wise, swa, pad=1, seed=7)
    data = make_data(c)
    dt = getattr(torch, dtype)
    rounded = lambda xs: [torch.from_numpy(x).to(dt).to(torch.float32).numpy() for x in xs]  # noqa: E731
    data.Q, data.K, data.V = rounded(data.Q), rounded(data.K), rounded(data.V)
    got = run_case(c, op.append_attention, dt, "cpu", data)
    # the reference in fp32 on the same rounded inputs (Paddle's CPU kernels lack fp16 index_select)
    want = run_case(c, append_attention_reference, torch.float32, "cpu", data)
    tol = 2e-2 if dtype == "bfloat16" else 3e-3
    assert_same(got, want, atol=tol, rtol=tol)


def test_strided_q_k_v_views():
    """q, k, v as column slices of one fused projection (token stride > heads * dim)."""
    c = Case(REQS["mixed"], 4, 2, 12, 12, True, 16)
    data = make_data(c)

    def via_fused(q, k, v, *rest, **kw):
        fused = torch.cat([q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], -1)
        nq, nk = q.shape[1] * q.shape[2], k.shape[1] * k.shape[2]
        views = (fused[:, :nq].reshape(q.shape), fused[:, nq:nq + nk].reshape(k.shape),
                 fused[:, nq + nk:].reshape(v.shape))
        return op.append_attention(*views, *rest, **kw)

    got = run_case(c, via_fused, torch.float32, "cpu", data)
    want = run_case(c, append_attention_reference, torch.float32, "cpu", data)
    assert_same(got, want, atol=2e-5, rtol=1e-4)


def test_swa_zero_heads_is_plain_causal():
    """num_swa_heads = 0 ignores window and sink."""
    base = Case(REQS["long"], 4, 2, 16, 16, False, 16, True)
    data = make_data(base)
    plain = run_case(base, op.append_attention, torch.float32, "cpu", data)
    odd = run_case(Case(REQS["long"], 4, 2, 16, 16, False, 16, True, (0, 3, 1)), op.append_attention,
                   torch.float32, "cpu", data)
    for a, b in zip(plain, odd):
        np.testing.assert_array_equal(a, b)


def test_bad_shapes_are_rejected():
    q = torch.zeros(2, 3, 8)
    kv = torch.zeros(2, 2, 8)      # 3 query heads over 2 KV heads
    cache = torch.zeros(2, 4, 4, 8)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    with pytest.raises(Exception, match="multiple of num_kv_heads"):
        op.append_attention(q, kv, kv, cache, cache.clone(), i32([[0]]), i32([0, 2]), i32([2]), i32([0, 0]),
                            torch.tensor([0, 1], dtype=torch.int64), torch.zeros(4, 8), torch.zeros(2, 3, 8),
                            softmax_scale=1.0, neox=True, rot_dim=8)


def test_invariant_split_must_be_a_multiple_of_64_and_the_cpu_op_ignores_it():
    c = Case(REQS["long"], 4, 2, 16, 16, True, 16, False, (0, 0, 0), seed=3)
    data = make_data(c)
    with pytest.raises(Exception, match="multiple of 64"):
        run_case(c, op.append_attention, torch.float32, "cpu", data, batch_invariant=True, invariant_split=100)
    plain = run_case(c, op.append_attention, torch.float32, "cpu", data, batch_invariant=True)
    split = run_case(c, op.append_attention, torch.float32, "cpu", data, batch_invariant=True, invariant_split=64)
    for a, b in zip(plain, split):
        np.testing.assert_array_equal(a, b)


SWA_TABLES = [t for t in TABLES if t[2][0]]


@pytest.mark.parametrize("table", SWA_TABLES, ids=lambda t: f"bs{t[0]}{'hw' if t[1] else ''}swa{t[2]}")
@pytest.mark.parametrize("reqs", sorted(REQS))
def test_swa_mask_mode_equals_skip_mode(table, reqs):
    """swa_mask=True (SWA heads walk every key j <= p and mask the rest: the benchmarks' uniform
    baseline) gives the same outputs and caches as the default, which walks only sinks + window.
    The CPU loops see the same visible keys in the same order, so the results are bit-identical;
    both match the reference. Head-wise cases keep their -1, NaN-poisoned slots: mask mode must
    not read them either."""
    bs, head_wise, swa = table
    c = Case(REQS[reqs], 6, 2, 24, 16, True, bs, head_wise, swa, pad=1,
             seed=zlib.crc32(repr((reqs, table)).encode()) % 1000)
    data = make_data(c)
    skip = run_case(c, op.append_attention, torch.float32, "cpu", data)
    mask = run_case(c, op.append_attention, torch.float32, "cpu", data, swa_mask=True)
    assert not np.isnan(mask[0]).any()
    for a, b in zip(skip, mask):
        np.testing.assert_array_equal(a, b)
    want = run_case(c, append_attention_reference, torch.float32, "cpu", data)
    assert_same(mask, want, atol=2e-5, rtol=1e-4)


def test_swa_mask_mode_masks_on_uniform_tables():
    """On uniform tables every block of the context is present, so mask mode reads keys outside the
    window and must drop them: its output differs from plain causal attention and equals the
    reference's per-head window."""
    c = Case(REQS["long"], 4, 2, 16, 16, False, 16, False, (1, 3, 1), seed=3)
    data = make_data(c)
    mask = run_case(c, op.append_attention, torch.float32, "cpu", data, swa_mask=True)
    causal = run_case(Case(REQS["long"], 4, 2, 16, 16, False, 16, False), op.append_attention, torch.float32, "cpu",
                      data)
    want = run_case(c, append_attention_reference, torch.float32, "cpu", data)
    assert_same(mask, want, atol=2e-5, rtol=1e-4)
    assert np.abs(mask[0][:, 2:] - causal[0][:, 2:]).max() > 1e-3, "SWA heads (query heads 2, 3) must differ"
    np.testing.assert_array_equal(mask[0][:, :2], causal[0][:, :2])  # full heads: plain causal


@pytest.mark.parametrize("table", [t for t in TABLES if t[1]], ids=lambda t: f"bs{t[0]}hw-swa{t[2]}")
@pytest.mark.parametrize("fn", ["op", "reference"])
def test_flat_cache_with_per_head_ranges(table, fn):
    """Per-head cache ranges: one flat [total, bs, D] array per layer, head g's blocks at global ids
    base[g] + local, ranges of unequal size with gaps between them (the SWA heads' ranges smaller in
    the engine). Outputs equal the head-major [Hkv, num_blocks, bs, D] layout's, and every head's
    range holds what that head's slice holds there."""
    bs, _, swa = table
    c = Case(REQS["mixed"], 6, 2, 24, 16, True, bs, True, swa, pad=1, seed=21)
    data = make_data(c)
    call = op.append_attention if fn == "op" else append_attention_reference
    bases = [5, 5 + data.num_blocks + 3]          # gaps: 5 blocks before head 0, 3 between the heads
    got = run_case(c, call, torch.float32, "cpu", data, flat_bases=bases)
    want = run_case(c, call, torch.float32, "cpu", data)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_flat_cache_needs_head_wise_tables():
    c = Case(REQS["mixed"], 4, 2, 16, 16, True, 16)   # uniform tables
    data = make_data(c)
    q = torch.zeros(3, 4, 16)
    kv = torch.zeros(3, 2, 16)
    flat = torch.zeros(8, 16, 16)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    with pytest.raises(Exception, match="head-wise"):
        op.append_attention(q, kv, kv, flat, flat.clone(), i32([[0]]), i32([0, 3]), i32([3]), i32([0, 0, 0]),
                            torch.tensor([0, 1, 2], dtype=torch.int64), torch.from_numpy(data.cos_sin),
                            torch.zeros(3, 4, 16), softmax_scale=1.0, neox=True, rot_dim=16)
