"""models (tensor code: selects the runtime before its modules import torch)."""

from paddle_mla import runtime as _runtime

_runtime.select()

from paddle_mla.models.arch import ModelArch, load_arch, parse_arch
from paddle_mla.models.deepseek import CausalLM
from paddle_mla.models.gqa import GQACausalLM
from paddle_mla.models.loader import load_model
from paddle_mla.models.tiny import ensure_tiny_model, make_tiny_model

__all__ = ["CausalLM", "GQACausalLM", "ModelArch", "ensure_tiny_model", "load_arch", "load_model", "make_tiny_model", "parse_arch"]
