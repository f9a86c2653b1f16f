"""attention (tensor code: selects the runtime before its modules import torch)."""

from paddle_mla import runtime as _runtime

_runtime.select()
