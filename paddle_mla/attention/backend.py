"""Attention backend interfaces and registry.

A backend turns per-layer attention inputs into outputs over the paged KV cache: ``MLABackend``
for DeepSeek models (latent cache), ``GQABackend`` for qwen3 / ernie4_5 / llama (head-major K/V
caches). The model runner calls ``prepare(meta)`` once per step (backend metadata goes into
``meta.attn``); every layer then calls ``forward``. One registry holds both kinds, keyed by
(name, family): ``native`` has one of each. Capabilities are declared in
``paddle_mla.config.backends`` so configs are validated before anything is loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from paddle_mla.config.backends import BACKEND_CAPS, BackendCaps


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
    It writes ``latent`` into ``kv_cache`` at ``meta.slot_mapping`` (slots < 0 skipped; not when
    ``meta.latents_written``: a row share's metadata, whose latents the model wrote with
    ``write_cache``), then attends each new token causally over its request's cached + new tokens,
    and returns [T, H, v_head_dim]. Rows of padded tokens are zeros, never NaN.
    """

    name: str = ""
    # extend rows of at most this many new tokens run absorbed, each new token reading its whole
    # cached context (the scheduler bounds their work per step: max_num_batched_absorbed_context)
    short_max_q: int = 0

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

    def write_cache(self, latent: Any, kv_cache: Any, slot_mapping: Any) -> None:
        """``latent`` [T, latent_dim] into ``kv_cache`` at ``slot_mapping`` (slots < 0 skipped), as
        ``forward`` does first; the model calls it when a rank attends only part of the step
        (``attention.row_share``) but keeps every token's latent."""
        raise NotImplementedError(f"attention.backend {self.name!r} has no cache write of its own")


@dataclass
class GQADims:
    num_heads: int                        # query heads
    num_kv_heads: int
    head_dim: int
    softmax_scale: float

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass
class LayerRope:
    """What a GQA layer's rope is, for the backend that applies it (the op does it in-kernel)."""

    cos_sin: Any                          # float32 [max_position, rot_dim]: cos || sin, scaling included
    neox: bool                            # halves (qwen3, llama) vs interleaved pairs (ernie4_5)
    rot_dim: int                          # dims >= rot_dim pass through


class GQABackend(ABC):
    """Contract for GQA backends (docs/append_attention.md; ``attention/gqa_reference.py`` is its
    plain-tensor definition).

    ``forward`` receives, for the T new tokens of the step, q [T, Hq, D], k and v [T, Hkv, D] with
    RoPE NOT applied (per-head q/k RMSNorm already applied), this layer's ``k_cache`` / ``v_cache``
    [Hkv, num_blocks, block_size, D], the step's ``meta`` (``meta.block_tables`` uniform
    [B, max_blocks] or head-wise [B, Hkv, max_blocks]) and the layer's ``LayerRope``. It ropes q and
    k, writes k and v into the caches at each token's slot, attends causally (the last
    ``num_swa_heads`` KV heads within ``window`` + ``sink``) and returns [T, Hq, D].
    """

    name: str = ""
    family = "gqa"

    def __init__(self, dims: GQADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str,
                 dtype: Any, num_swa_heads: int = 0, window: int = 0, sink: int = 0,
                 max_num_batched_tokens: int = 0, swa_mask: bool = False):
        self.dims = dims
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.dtype = dtype
        self.num_swa_heads, self.window, self.sink = num_swa_heads, window, sink
        self.swa_mask = swa_mask    # walk the whole row and mask (same outputs; the native reference masks anyway)

    @property
    def caps(self) -> BackendCaps:
        return BACKEND_CAPS[self.name]

    def prepare(self, meta: Any) -> None:
        """Per-step backend metadata into ``meta.attn``; called once per step, never per layer."""

    @abstractmethod
    def forward(self, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, meta: Any,
                layer_rope: LayerRope) -> Any: ...


_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {}
# Importing the module registers its backend; keeps unused backends (and Triton) unimported.
_MODULES = {("native", "mla"): "paddle_mla.attention.native",
            ("triton_mla", "mla"): "paddle_mla.attention.triton_mla.backend",
            ("dsa", "mla"): "paddle_mla.attention.dsa.backend",
            ("native", "gqa"): "paddle_mla.attention.native_gqa",
            ("append_attn", "gqa"): "paddle_mla.attention.append_attn"}


# ``deterministic: true``: keys per split of every row's split-KV attention (``triton_mla``, ``dsa``,
# ``append_attn``), counted from the row's first key, whatever the batch (the split count then follows
# the row's length alone): at least DETERMINISTIC_SPLIT_TOKENS, doubled until a row of max_model_len
# takes at most DETERMINISTIC_MAX_SPLITS. Why the cap: the decode workspace holds every row's splits at
# once (max_num_seqs x splits fp32 partial rows: 4.3 GB at V3 dims, 256 rows and 128k in splits of
# 2048, 1.1 GB in splits of 8192). The size follows max_model_len alone, never max_num_seqs or the
# batch, so every configuration of one max_model_len splits a row alike.
DETERMINISTIC_SPLIT_TOKENS = 2048
DETERMINISTIC_MAX_SPLITS = 16


def deterministic_split_tokens(max_model_len: int) -> int:
    """Keys per split under ``deterministic: true`` for rows of up to ``max_model_len`` tokens."""
    split = DETERMINISTIC_SPLIT_TOKENS
    while -(-max_model_len // split) > DETERMINISTIC_MAX_SPLITS:
        split *= 2
    return split


def register_backend(name: str):
    """Class decorator: registers an MLABackend or GQABackend subclass under (name, its family)."""
    def deco(cls):
        cls.name = name
        _REGISTRY[(name, "gqa" if issubclass(cls, GQABackend) else "mla")] = cls
        return cls

    return deco


def create_backend(name: str, family: str = "mla", **kwargs: Any):
    """The ``family`` (mla | gqa) backend called ``name``, built with ``kwargs`` (its constructor's).
    ``name`` is a resolved one: ``auto`` is resolved once, in the run plan (``worker.plan``)."""
    key = (name, family)
    if key not in _REGISTRY:
        import importlib

        module = _MODULES.get(key)
        if module is None:
            names = sorted(n for n, f in _MODULES if f == family)
            raise ValueError(f"unknown attention backend {name!r} for {family.upper()} models; "
                             f"available: {', '.join(names)}")
        importlib.import_module(module)
    return _REGISTRY[key](**kwargs)
