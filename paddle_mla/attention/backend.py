"""Attention backend interface and registry.

A backend turns per-layer MLA inputs into attention outputs over the paged latent cache. The
model runner calls ``prepare(meta)`` once per step (backend metadata goes into ``meta.attn``);
every layer then calls ``forward``. Capabilities are declared in ``paddle_mla.backend_caps`` so
configs are validated before anything is loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from paddle_mla.backend_caps import BACKEND_CAPS, BackendCaps


@dataclass
class MLADims:
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class MLABackend(ABC):
    """Contract for MLA backends.

    ``forward`` receives, for the T new tokens of the step:
      - ``q_nope`` [T, H, qk_nope_head_dim] and ``q_pe`` [T, H, qk_rope_head_dim] (rope applied);
      - ``latent`` [T, kv_lora_rank + qk_rope_head_dim]: normalised compressed kv || roped k_pe;
      - ``w_kc`` [H, qk_nope_head_dim, kv_lora_rank] and ``w_vc`` [H, kv_lora_rank, v_head_dim]:
        the two halves of ``kv_b_proj`` (absorbed form);
      - ``kv_cache`` [num_blocks, block_size, 1, latent_dim] of this layer.
    It writes ``latent`` into ``kv_cache`` at ``meta.slot_mapping`` (slots < 0 skipped), then
    attends each new token causally over its request's cached + new tokens, and returns
    [T, H, v_head_dim]. Rows of padded tokens are zeros, never NaN.
    """

    name: str = ""

    def __init__(self, dims: MLADims, max_num_seqs: int, max_model_len: int, block_size: int,
                 device: str, dtype: Any, max_num_batched_tokens: int = 0):
        """``max_num_batched_tokens``: most tokens in one step (sizes step workspaces); 0: unknown,
        a backend that needs it picks a bound from the others."""
        self.dims = dims
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.dtype = dtype

    @property
    def caps(self) -> BackendCaps:
        return BACKEND_CAPS[self.name]

    def prepare(self, meta: Any) -> None:
        """Per-step backend metadata into ``meta.attn``; called once per step, never per layer."""

    @abstractmethod
    def forward(self, q_nope: Any, q_pe: Any, latent: Any, w_kc: Any, w_vc: Any,
                kv_cache: Any, meta: Any) -> Any: ...


_REGISTRY: dict[str, Callable[..., MLABackend]] = {}


def register_backend(name: str):
    def deco(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def create_backend(name: str, **kwargs: Any) -> MLABackend:
    if name == "auto":
        from paddle_mla.backend_caps import resolve_backend

        name = resolve_backend(name, "cpu" if kwargs.get("device") == "cpu" else "gpu")
    if name not in _REGISTRY:
        # Importing the module registers it; keeps unused backends (and Triton) unimported.
        import importlib

        module = {"native": "paddle_mla.attention.native", "triton_mla": "paddle_mla.attention.triton_mla.backend",
                  "dsa": "paddle_mla.attention.dsa.backend"}.get(name)
        if module is None:
            raise ValueError(f"unknown attention backend {name!r}; available: native, triton_mla, dsa")
        importlib.import_module(module)
    return _REGISTRY[name](**kwargs)
