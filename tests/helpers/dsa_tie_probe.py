"""A one-program Triton kernel around ``topk_select``'s buffered tie pick, so a test can hand it
candidates in any order: the real candidate pass appends in the order its programs run, which the
interpreter makes column order, so only this reaches the out-of-order case on a CPU. Imported
inside tests (it imports Triton)."""

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import triton
import triton.language as tl

from paddle_mla.attention.dsa.topk_select import _earliest_ties


@triton.jit
def _probe_kernel(equal_ptr, col_ptr, out_ptr, n, need, CAP: tl.constexpr):
    j = tl.arange(0, CAP)
    valid = j < n
    equal = (tl.load(equal_ptr + j, mask=valid, other=0) != 0) & valid
    col = tl.load(col_ptr + j, mask=valid, other=0)
    take = _earliest_ties(equal, col, need + tl.zeros((), tl.int32))
    tl.store(out_ptr + j, take.to(tl.int32), mask=valid)


def earliest_ties(equal, col, need: int, cap: int):
    """int32 tensors ``equal`` (0/1) and ``col`` of one buffer (length <= cap) -> int32 0/1: taken."""
    out = equal.new_zeros(equal.shape[0])
    _probe_kernel[(1,)](equal, col, out, equal.shape[0], need, CAP=cap)
    return out
