"""Batch-invariant matrix products for ``deterministic: true``.

A library GEMM (cuBLAS, MKL) picks its kernel, tile and split-K from the row count M, so one row's
bits change with the batch it is in. Under the mode every dense product of the model goes through
``linear`` / ``bmm`` here instead:
- on a GPU (Triton launches there): one Triton GEMM with no split-K, so each output element is
  the same K-ordered chain of tensor-core steps whatever M and wherever its row sits (the idea of
  Thinking Machines' "Defeating Nondeterminism in LLM Inference"). Its tile follows the launch's
  size (``batch_invariant_kernels.tile_for``): the tile shape only places the chain, it does not
  change it, which a GPU test checks bit for bit;
- elsewhere (CPU; the paddle runtime): one framework matmul per row (M = 1), which is the same
  call for a row whatever the batch.
``logsumexp`` is the sampler's row reduction (logprobs, top-p's softmax), over column chunks fixed
by the vocabulary size.

The mode itself is process state (``set_enabled``): the model runner sets it from the config
before each forward (and clears it when closed), so modules below the worker need no extra argument. Default mode never
calls into this module's kernels.
"""

from __future__ import annotations

import functools

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import torch.nn.functional as F

_enabled = False


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


@functools.cache
def _triton_gpu() -> bool:
    return not _runtime.is_paddle() and _runtime.supports_triton_on("gpu")[0]


def _gpu_kernel_ok(*ts) -> bool:
    return all(t.is_cuda for t in ts) and _triton_gpu()


def rowwise(fn, x, dim: int = 0):
    """fn over each size-1 slice of ``dim`` of x, concatenated: a row's call has the same shape
    whatever the batch, so its bits do too (a framework's CPU reduction or GEMM may split or
    vectorise differently as the row count changes)."""
    if x.shape[dim] == 0:
        return fn(x)
    lead = (slice(None),) * dim     # indexing, not narrow: paddle's proxy narrows a view from its base
    return torch.cat([fn(x[lead + (slice(i, i + 1),)].contiguous()) for i in range(x.shape[dim])], dim)


def linear_rowwise(x2, w, b=None):
    """x2 [M, K] @ w[N, K]^T one row at a time (the same M = 1 call for a row in any batch)."""
    return rowwise(lambda r: F.linear(r, w, b), x2)


def linear(x, w, b=None):
    """y = x @ w^T (+ b), each row's bits independent of the other rows."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    if _gpu_kernel_ok(x2, w):
        from paddle_mla.ops.batch_invariant_kernels import gemm_nt

        y = gemm_nt(x2, w)
        if b is not None:
            y = y + b
    else:
        y = linear_rowwise(x2, w, b)
    return y.reshape(*lead, w.shape[0])


def elementwise(fn, x):
    """fn(x) for an elementwise fn, each row's bits independent of the other rows. A CPU kernel runs
    a vector body and a scalar tail over the flattened tensor, and the two round differently for
    some functions (sigmoid: a lone row of 8 router scores is all tail, the same row in a batch of 6
    is vector body, so its bits, and the token's logprobs, would follow the batch). Under the mode
    off the GPU it runs one row at a time; a GPU computes every element alike."""
    if _enabled and not x.is_cuda:
        return rowwise(fn, x)
    return fn(x)


def logsumexp(x):
    """x [B, N] -> float32 [B, 1]: log(sum(exp(row))), each row's order fixed by the row alone (the
    framework's reduction splits a row over more blocks when there are fewer rows)."""
    if _gpu_kernel_ok(x):
        from paddle_mla.ops.batch_invariant_kernels import row_logsumexp

        return row_logsumexp(x.contiguous())
    return rowwise(lambda r: torch.logsumexp(r, dim=-1, keepdim=True), x.to(torch.float32))


def bmm(a, b, out=None):
    """a [G, M, K] @ b [G, K, N] -> [G, M, N], each (g, m) row independent of the other rows;
    written into ``out`` (a view of any strides) when given."""
    if _gpu_kernel_ok(a, b):
        from paddle_mla.ops.batch_invariant_kernels import bmm_nn

        return bmm_nn(a, b, out)
    res = rowwise(lambda r: torch.bmm(r, b), a, dim=1)
    if out is None:
        return res
    out.copy_(res)
    return out


def linear_for_mode(x, w, b=None):
    """x @ w^T (+ b): ``linear`` under ``deterministic: true``, the framework's F.linear otherwise.
    The one place the model's dense products choose between the two."""
    return linear(x, w, b) if _enabled else F.linear(x, w, b)
