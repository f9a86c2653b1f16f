"""Works around a Triton interpreter bug (seen in Triton 3.9) that only CPU runs meet.

The interpreter labels the result of a comparison with the *operand's* type instead of int1. For a
block that is harmless (the data stay numpy bools), but a scalar comparison splatted into a block
then becomes int32 data, so ``mask & (scalar >= 0)`` reaches ``tl.load`` as an int32 mask and the
interpreter rejects it ("mask has unsupported dtype"). Compiled kernels are unaffected. The kernels
are right as written, so the interpreter is corrected here, once, rather than each kernel bent
around it: comparisons are relabelled int1, which is what the compiler produces.
"""

from __future__ import annotations

import os

_applied = False


def apply() -> None:
    """Patch the interpreter's comparisons (idempotent; a no-op unless TRITON_INTERPRET=1)."""
    global _applied
    if _applied or os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None or not hasattr(builder, "binary_op"):
        return
    compares = {np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal}
    binary_op = builder.binary_op

    def binary_op_int1_compares(self, lhs, rhs, op):
        out = binary_op(self, lhs, rhs, op)
        if op in compares and out.dtype != tl.int1:
            out = handle(out.data.astype(np.bool_), tl.int1)
        return out

    builder.binary_op = binary_op_int1_compares
    _applied = True
