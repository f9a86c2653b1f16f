"""The head-wise SWA benchmark's modes (its GPU run and the host-side profile of the same schedule)."""

from __future__ import annotations

MODES = {   # attention keys (ratio, swa_mode) and cache.swa_recycle of each mode
    "uniform_mask": {"head_wise_swa_ratio": 0.5, "swa_mode": "mask", "recycle": False},
    "headwise": {"head_wise_swa_ratio": 0.5, "swa_mode": "skip", "recycle": False},
    "headwise_recycle": {"head_wise_swa_ratio": 0.5, "swa_mode": "skip", "recycle": True},
    "full": {"head_wise_swa_ratio": 0.0, "recycle": False},
}
DEFAULT_MODES = "uniform_mask,headwise,headwise_recycle"
