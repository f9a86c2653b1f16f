"""models: the MLA model families, MoE, FP8 linear, the checkpoint loader and the tiny-model builder.

Importing this package selects no runtime (the engine does: docs/architecture.md, "platform"). The names below
are loaded on first use: ``ensure_tiny_model`` / ``make_tiny_model`` / ``load_arch`` / ``parse_arch``
need no tensor library; ``CausalLM`` and ``load_model`` import torch, so they need
``paddle_mla.platform.runtime.select()`` first (their modules say so when it was not called).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelArch": "paddle_mla.models.arch",
    "load_arch": "paddle_mla.models.arch",
    "parse_arch": "paddle_mla.models.arch",
    "CausalLM": "paddle_mla.models.deepseek",
    "GQACausalLM": "paddle_mla.models.gqa",
    "load_model": "paddle_mla.models.loader",
    "ensure_tiny_model": "paddle_mla.models.tiny",
    "make_tiny_model": "paddle_mla.models.tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'paddle_mla.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
