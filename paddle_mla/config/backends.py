"""What each attention backend supports, as plain data, so configs are validated before any
model or tensor library is loaded (docs/architecture.md, "config")."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paddle_mla.config.schema import EngineConfig


@dataclass(frozen=True)
class BackendCaps:
    families: tuple[str, ...]          # model families: "mla", "gqa"
    chunked_prefill: bool
    prefix_cache: bool
    cuda_graph: bool
    cpu: bool                           # runs on CPU (Triton ones only under TRITON_INTERPRET=1)
    implemented: bool = True
    note: str = ""
    head_wise_swa: bool = False         # attention.head_wise_swa_ratio > 0 (GQA models only)
    # deterministic: true (batch-invariant tokens): every reduction of the backend has an order
    # fixed by the row alone (docs/determinism.md)
    deterministic: bool = False
    fp8_cache: bool = False             # cache.dtype: fp8_e4m3 (MLA latent caches)


BACKEND_CAPS: dict[str, BackendCaps] = {
    "native": BackendCaps(("mla", "gqa"), chunked_prefill=True, prefix_cache=True, cuda_graph=False, cpu=True,
                          head_wise_swa=True, fp8_cache=True),
    "triton_mla": BackendCaps(("mla",), chunked_prefill=True, prefix_cache=True, cuda_graph=True, cpu=True,
                              deterministic=True, fp8_cache=True,
                              note="on CPU only under TRITON_INTERPRET=1 with runtime: torch"),
    "dsa": BackendCaps(("mla",), chunked_prefill=True, prefix_cache=True, cuda_graph=True, cpu=True,
                       deterministic=True, note="DeepSeek-V3.2 (deepseek_v32) only; on CPU only under "
                                                "TRITON_INTERPRET=1 with runtime: torch"),
    "append_attn": BackendCaps(("gqa",), chunked_prefill=True, prefix_cache=True, cuda_graph=True, cpu=True,
                               note="the append_attention custom op: C++ on CPU, CUDA on the GPU",
                               head_wise_swa=True, deterministic=True),
}


# Checkpoint model_types whose attention is GQA (the others are MLA); models/arch.py parses them.
GQA_MODEL_TYPES = ("qwen3", "ernie4_5", "llama", "qwen3_moe", "ernie4_5_moe")


def model_family(model_type: str | None) -> str:
    """``gqa`` for the GQA checkpoints, ``mla`` for DeepSeek ones (and when not known yet)."""
    return "gqa" if model_type in GQA_MODEL_TYPES else "mla"


def resolve_backend(name: str, device_kind: str, model_type: str | None = None) -> str:
    """``auto`` -> on a GPU when triton is importable, ``dsa`` for deepseek_v32 checkpoints and
    ``triton_mla`` for the other MLA ones; else ``native``. Other names as given.
    GQA checkpoints resolve to ``append_attn`` on a GPU, ``native`` on CPU. The engine resolves
    its backend once, in the run plan (``worker.plan``, through ``resolved_config``)."""
    if name != "auto":
        return name
    if model_family(model_type) == "gqa":
        return "append_attn" if device_kind == "gpu" else "native"
    if device_kind == "gpu" and importlib.util.find_spec("triton") is not None:
        return "dsa" if model_type == "deepseek_v32" else "triton_mla"
    return "native"


def resolved_config(cfg: EngineConfig, device_kind: str, model_type: str | None = None) -> EngineConfig:
    """A copy of ``cfg`` with the backend and device resolved for ``device_kind`` (cpu | gpu) and the
    checkpoint's ``model_type``, checked against the capability table (``ConfigError`` listing the
    problems)."""
    from paddle_mla.config.schema import ConfigError

    backend = resolve_backend(cfg.attention.backend, device_kind, model_type)
    out = dataclasses.replace(cfg, device=device_kind,
                              attention=dataclasses.replace(cfg.attention, backend=backend))
    errors = check_backend(out)
    mismatch = check_model_backend(model_type, backend, cfg.cache.dtype) if model_type else None
    if mismatch:
        errors.append(mismatch)
    if errors:
        source = f"attention.backend auto resolved to {backend!r} on {device_kind}: " \
            if cfg.attention.backend == "auto" else ""
        raise ConfigError([source + e for e in errors])
    return out


def check_backend(cfg: EngineConfig, name: str | None = None) -> list[str]:
    """Errors for a backend/feature combination the backend does not support, naming alternatives
    (``name``: the backend to check, default the config's)."""
    name = name or cfg.attention.backend
    caps = BACKEND_CAPS[name]
    errors: list[str] = []
    ready = [n for n, c in BACKEND_CAPS.items() if c.implemented]
    if not caps.implemented:
        errors.append(f"'attention.backend' is {name!r}: {caps.note}; available: {', '.join(ready)}")
        return errors

    def alternatives(pred) -> str:
        names = [n for n, c in BACKEND_CAPS.items() if c.implemented and pred(c)]
        return ", ".join(names) or "none"

    if cfg.cuda_graph is True and not caps.cuda_graph:
        errors.append(f"'cuda_graph: true' is not supported by attention.backend {name!r}; "
                      f"set cuda_graph: false, or use {alternatives(lambda c: c.cuda_graph)}")
    if cfg.cuda_graph is True and cfg.device == "cpu":
        errors.append("'cuda_graph: true' needs device: gpu (or auto on a GPU machine)")
    if cfg.scheduler.enable_chunked_prefill and not caps.chunked_prefill:
        errors.append(f"'scheduler.enable_chunked_prefill' is not supported by {name!r}; "
                      f"use {alternatives(lambda c: c.chunked_prefill)}")
    if cfg.cache.enable_prefix_caching and not caps.prefix_cache:
        errors.append(f"'cache.enable_prefix_caching' is not supported by {name!r}; "
                      f"use {alternatives(lambda c: c.prefix_cache)}")
    if cfg.attention.head_wise_swa_ratio > 0 and not caps.head_wise_swa:
        errors.append(f"'attention.head_wise_swa_ratio' > 0 is not supported by {name!r}; "
                      f"use {alternatives(lambda c: c.head_wise_swa)} on a GQA model")
    if cfg.deterministic and not caps.deterministic:
        errors.append(f"'deterministic: true' is not supported by attention.backend {name!r} (its attention "
                      f"reductions follow the batch); use {alternatives(lambda c: c.deterministic)}, "
                      f"or deterministic: false")
    if cfg.cache.dtype != "auto" and not caps.fp8_cache:
        errors.append(f"'cache.dtype: {cfg.cache.dtype}' is not supported by attention.backend {name!r}; "
                      f"use {alternatives(lambda c: c.fp8_cache)} (MLA models other than deepseek_v32), "
                      "or cache.dtype: auto")
    if cfg.device == "cpu" and not caps.cpu:
        errors.append(f"attention.backend {name!r} needs a GPU; on CPU use {alternatives(lambda c: c.cpu)}")
    return errors


def check_model_backend(model_type: str, backend: str, cache_dtype: str = "auto") -> str | None:
    """The error for a checkpoint/backend pair that cannot work together (known once config.json is read)."""
    family = model_family(model_type)
    caps = BACKEND_CAPS.get(backend)
    if caps is not None and family not in caps.families:
        fits = [n for n, c in BACKEND_CAPS.items() if family in c.families and c.implemented
                and (n != "dsa" or model_type == "deepseek_v32")]
        return (f"attention.backend {backend!r} runs {'/'.join(caps.families).upper()} models; this {model_type!r} "
                f"checkpoint is {family.upper()}: use {' or '.join(fits)}")
    if model_type == "deepseek_v32" and backend == "triton_mla":
        return ("a deepseek_v32 checkpoint needs sparse attention: set attention.backend: dsa on the GPU "
                "(or native); triton_mla is dense")
    # a backend without FP8 rows was refused by check_backend already: one error a cause
    if cache_dtype != "auto" and (caps is None or caps.fp8_cache) and (family == "gqa" or model_type == "deepseek_v32"):
        return (f"'cache.dtype: {cache_dtype}' stores MLA latents; this {model_type!r} checkpoint "
                f"{'is GQA' if family == 'gqa' else 'runs sparse attention (dsa), whose kernels read a bf16 cache'}: "
                "use cache.dtype: auto")
    if model_type != "deepseek_v32" and backend == "dsa":
        return (f"attention.backend 'dsa' is for deepseek_v32 checkpoints; this one is {model_type!r}: "
                "use triton_mla on the GPU (or native)")
    return None
