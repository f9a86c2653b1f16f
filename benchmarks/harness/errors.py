"""Error metrics of a benchmarked output against its anchor or reference (tensor methods only: no
import of torch, so any runtime's tensors work)."""

from __future__ import annotations


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in fp32 (b is the reference; a zero reference does not divide by zero)."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def max_abs_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def raise_on_failed(outs) -> None:
    """A benchmark must not time or compare requests that failed (a failed request is fast and empty)."""
    errors = [o.error for o in outs if o.error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(outs)} requests failed, e.g. {errors[0]}")
