"""``deterministic: true``'s matrix products (``ops.batch_invariant``): a row's output bits are the
same alone and at any position of batches of several sizes, and the products match the framework's
own within rounding. On CPU (both runtimes) the one-row-at-a-time path; on a GPU the Triton GEMM of
one tile config (bf16 and fp32). The mode switch is process state the model runner sets per step."""

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.platform.tensor_api import F, torch

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
DTYPES = ["float32", "bfloat16"] if DEV != "cpu" else ["float32"]


def _t(a, dtype="float32"):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(DEV).to(getattr(torch, dtype))


def _np(t):
    return t.to(torch.float32).cpu().numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", [(64, 96), (300, 130), (1024, 512)])
def test_linear_row_is_the_same_in_any_batch(dtype, K, N):
    from paddle_mla.ops import batch_invariant as bi

    rng = np.random.default_rng(K + N)
    x = _t(rng.standard_normal((70, K)), dtype)
    w = _t(rng.standard_normal((N, K)) * K ** -0.5, dtype)
    b = _t(rng.standard_normal(N), dtype)
    alone = [bi.linear(x[i:i + 1], w, b) for i in (0, 33, 69)]
    for size in (2, 5, 17, 64):
        for pos in (0, size // 2, size - 1):
            rows = [j for j in range(1, 70) if j not in (0, 33, 69)][:size - 1]
            for probe, a in zip((0, 33, 69), alone):
                order = rows[:pos] + [probe] + rows[pos:]
                got = bi.linear(x[_t(np.array(order)).to(torch.int64)], w, b)
                assert bool((got[pos] == a[0]).all()), (size, pos, probe)
    ref = F.linear(x.to(torch.float32), w.to(torch.float32), b.to(torch.float32))
    tol = 1e-4 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(_np(bi.linear(x, w, b)), _np(ref), atol=tol * 4, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_row_is_the_same_in_any_batch(dtype):
    from paddle_mla.ops import batch_invariant as bi

    rng = np.random.default_rng(1)
    a = _t(rng.standard_normal((3, 40, 48)), dtype)
    b = _t(rng.standard_normal((3, 48, 80)) * 0.15, dtype)
    alone = bi.bmm(a[:, 7:8], b)
    for lo, hi in ((0, 40), (5, 9), (7, 30)):
        assert bool((bi.bmm(a[:, lo:hi], b)[:, 7 - lo] == alone[:, 0]).all())
    tol = 1e-4 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(_np(bi.bmm(a, b)), _np(torch.bmm(a.to(torch.float32), b.to(torch.float32))),
                               atol=tol * 4, rtol=tol)


def test_mode_switch_is_off_by_default_and_routes_the_model_linear(monkeypatch):
    from paddle_mla.models.fp8 import linear
    from paddle_mla.ops import batch_invariant as bi

    assert not bi.enabled()
    calls = []
    real = bi.linear
    monkeypatch.setattr(bi, "linear", lambda *a: calls.append(a) or real(*a))
    rng = np.random.default_rng(3)
    x, w = _t(rng.standard_normal((3, 8))), _t(rng.standard_normal((5, 8)))
    linear(x, w)
    assert calls == [], "default mode must not take the batch-invariant GEMM"
    try:
        bi.set_enabled(True)
        assert bi.enabled()
        got = linear(x, w)
        assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is w
        assert bool((got == real(x, w)).all())
    finally:
        bi.set_enabled(False)


def test_sigmoid_router_weights_of_a_row_are_the_same_in_any_batch():
    """DeepSeek-V3's router (sigmoid scores, noaux_tc, 8 experts): under the mode a token's expert
    weights have the same bits alone and at any position of batches of several sizes. A CPU sigmoid
    over the whole [T, 8] scores rounds a lone row (all of it the kernel's scalar tail) unlike the
    same row in a batch (its vector body); the determinism check found the logprobs moving."""
    from paddle_mla.models.arch import MoESpec
    from paddle_mla.models.moe import route
    from paddle_mla.ops import batch_invariant as bi

    spec = MoESpec(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0,
                   topk_method="noaux_tc", scoring_func="sigmoid", n_group=2, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5)
    rng = np.random.default_rng(5)
    x = _t(rng.standard_normal((40, 16)) * 0.25)   # logits near 0: sigmoid mid-range, where the paths part
    gate = _t(rng.standard_normal((8, 16)))
    bias = _t(rng.standard_normal(8) * 0.05)
    try:
        bi.set_enabled(True)
        for probe in range(40):
            ids1, w1 = route(spec, x[probe:probe + 1], gate, bias)
            for size in (2, 6, 17):
                rows = [j for j in range(40) if j != probe][:size - 1]
                order = rows[:size // 2] + [probe] + rows[size // 2:]
                ids, w = route(spec, x[_t(np.array(order)).to(torch.int64)], gate, bias)
                assert bool((ids[size // 2] == ids1[0]).all()), (probe, size)
                assert bool((w[size // 2] == w1[0]).all()), (probe, size)
    finally:
        bi.set_enabled(False)


@pytest.mark.triton
def test_triton_gemm_rows_match_alone_and_reference():
    """The GPU path's kernel itself (run by the interpreter on CPU): fp32, edges in M, N and K."""
    from paddle_mla.ops.batch_invariant_kernels import bmm_nn, gemm_nt

    rng = np.random.default_rng(2)
    x, w = _t(rng.standard_normal((70, 100))), _t(rng.standard_normal((130, 100)) * 0.1)
    full = gemm_nt(x, w)
    np.testing.assert_allclose(_np(full), _np(F.linear(x, w)), atol=1e-4, rtol=1e-4)
    for lo, hi in ((5, 6), (0, 3), (5, 69)):
        assert bool((gemm_nt(x[lo:hi], w)[0] == full[lo]).all())
    a, b = _t(rng.standard_normal((2, 9, 40))), _t(rng.standard_normal((2, 40, 24)))
    np.testing.assert_allclose(_np(bmm_nn(a, b)), _np(torch.bmm(a, b)), atol=1e-4, rtol=1e-4)
    # a transposed view (the W_UK product's q_nope.transpose(0, 1)) reads through its strides
    at = _t(rng.standard_normal((9, 2, 40))).transpose(0, 1)
    np.testing.assert_allclose(_np(bmm_nn(at, b)), _np(torch.bmm(at.contiguous(), b)), atol=1e-4, rtol=1e-4)


@pytest.mark.triton
def test_row_logsumexp_kernel_alone_and_in_a_batch():
    """The sampler's row reduction under the mode (the GPU path's kernel, interpreted on CPU):
    matches the framework's, a row alone equals itself among others, an all -inf row gives -inf."""
    from paddle_mla.ops.batch_invariant_kernels import row_logsumexp

    rng = np.random.default_rng(4)
    x = _t(rng.standard_normal((9, 3000)) * 4)
    x[5] = float("-inf")
    x[2, 100:] = float("-inf")
    got = row_logsumexp(x)
    finite = [i for i in range(9) if i != 5]
    np.testing.assert_allclose(_np(got)[finite], _np(torch.logsumexp(x[finite], dim=-1, keepdim=True)), rtol=1e-6)
    assert float(got[5, 0]) == float("-inf")
    assert bool((row_logsumexp(x[2:3])[0] == got[2]).all())


@pytest.mark.triton
def test_row_logsumexp_over_several_chunks():
    """Rows longer than one chunk (a vocabulary's width): the folded chunks match the framework's
    reduction, an all -inf chunk folds in as nothing, a row's bits do not follow the batch, and a NaN
    is not hidden."""
    from paddle_mla.ops.batch_invariant_kernels import LSE_CHUNK, row_logsumexp

    rng = np.random.default_rng(5)
    n = 2 * LSE_CHUNK + 123
    x = _t(rng.standard_normal((3, n)) * 4)
    x[1, :LSE_CHUNK] = float("-inf")            # the first chunk of row 1 is empty
    x[2, : n - 5] = float("-inf")               # row 2 lives in the tail of its last chunk
    got = row_logsumexp(x)
    np.testing.assert_allclose(_np(got), _np(torch.logsumexp(x, dim=-1, keepdim=True)), rtol=1e-6)
    for i in range(3):
        assert bool((row_logsumexp(x[i:i + 1])[0] == got[i]).all()), i
    x[0, LSE_CHUNK + 7] = float("nan")           # a NaN anywhere in a row makes it NaN, as torch's does
    assert bool(torch.isnan(row_logsumexp(x)[0]).all()) and bool(torch.isfinite(row_logsumexp(x)[1]).all())
