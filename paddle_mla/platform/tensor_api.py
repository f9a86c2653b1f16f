"""The tensor library as this package sees it: the real torch, or Paddle behind its torch proxy.

Tests and tools outside the package take ``torch`` from here so that they build the same kind of
tensors the package computes with. Import only after ``paddle_mla.runtime.select()``.
"""

from paddle_mla.platform import runtime

if runtime._selected is None:
    raise ImportError("call paddle_mla.runtime.select() before importing paddle_mla.platform.tensor_api")

import torch  # noqa: E402,F401  (re-exported)
import torch.nn.functional as F  # noqa: E402,F401,N812

__all__ = ["torch", "F"]
