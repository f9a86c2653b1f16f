"""Parameters of the multi-GPU tests: one per size, skipped where fewer GPUs are visible."""

from __future__ import annotations

import pytest

from paddle_mla.platform import runtime


def sizes(prefix: str, *counts: int) -> list:
    """``pytest.param(n, id=f"{prefix}{n}")`` for each of ``counts``, skipped below n GPUs (ids like
    tp2 / tp4 let a 4-GPU machine run the 2-GPU cases on GPUs 0,1 beside the 4-GPU ones)."""
    have = 0 if runtime.is_paddle() else runtime.gpu_count()
    return [pytest.param(n, id=f"{prefix}{n}", marks=pytest.mark.skipif(have < n, reason=f"needs {n} GPUs"))
            for n in counts]
