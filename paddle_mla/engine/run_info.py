"""What will run: the model folder check, and the resolved runtime / device / dtype / backend / model.

``model_problem`` is pure Python (``validate`` uses it without a tensor library). ``describe_run``
needs the runtime selected: it resolves ``auto`` values the way the engine does, and checks the
resolved backend against the capability table, all before any weights load, so ``generate`` and
``bench`` can print what runs as their first line and fail before work.
"""

from __future__ import annotations

import json

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from paddle_mla.config.schema import EngineConfig

TINY = "tiny"
NO_DOWNLOADS = "paddle-mla never downloads models; give a local checkpoint folder"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelPathError(ValueError):
    """The config's ``model`` is not a usable local checkpoint folder (one-line message)."""


def model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded, in one line; None when it is ``tiny`` or a folder with config.json."""
    if model == TINY:
        return None
    p = Path(model).expanduser()
    if not p.exists():
        if _HUB_ID.match(model) and not model.startswith("."):
            return (f"model {model!r} looks like a Hugging Face hub id, and there is no such local folder: "
                    f"{NO_DOWNLOADS} (e.g. huggingface-cli download {model} --local-dir DIR, then --model DIR)")
        return f"model path {model} does not exist ({NO_DOWNLOADS})"
    if not p.is_dir():
        return f"model path {model} is a file; give a checkpoint folder (config.json + *.safetensors)"
    if not (p / "config.json").is_file():
        return f"model folder {model} has no config.json; give a Hugging Face checkpoint folder " \
               "(config.json + *.safetensors)"
    return None


def check_model(model: str) -> None:
    problem = model_problem(model)
    if problem:
        raise ModelPathError(problem)


def model_dir(model: str) -> Path:
    """The folder of ``model`` (``tiny``: the cached tiny model's folder, which may not be built yet)."""
    if model == TINY:
        from paddle_mla.models.tiny import tiny_cache_dir

        return tiny_cache_dir()
    return Path(model).expanduser()


def checkpoint_model_type(model: str) -> str | None:
    """``model_type`` of the checkpoint's config.json (None when it is not there yet: tiny, unbuilt)."""
    config = model_dir(model) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def dtype_name(dtype: str, device_kind: str) -> str:
    """Config ``dtype`` -> the dtype the engine uses (auto: float32 on CPU, bfloat16 on GPU)."""
    if dtype == "auto":
        return "float32" if device_kind == "cpu" else "bfloat16"
    return dtype


@dataclass
class RunInfo:
    runtime: str                   # torch | paddle
    runtime_version: str
    device: str                    # cpu | gpu
    device_name: str | None        # the GPU's name
    dtype: str
    backend: str                   # resolved attention backend
    model: str                     # as configured
    model_path: str                # the folder it loads

    def line(self) -> str:
        device = f"{self.device} ({self.device_name})" if self.device_name else self.device
        model = self.model if self.model == self.model_path else f"{self.model} ({self.model_path})"
        return (f"paddle-mla: runtime {self.runtime} {self.runtime_version}, device {device}, dtype {self.dtype}, "
                f"backend {self.backend}, model {model}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_run(cfg: EngineConfig) -> tuple[RunInfo, EngineConfig]:
    """Resolve what ``cfg`` runs (the runtime must be selected); returns the description and the
    config with device and backend resolved. Raises ModelPathError, ConfigError (resolved backend
    unsupported there) or RuntimeError (device: gpu without a GPU)."""
    from paddle_mla.platform import runtime
    from paddle_mla.config.backends import resolved_config

    check_model(cfg.model)
    device = runtime.resolve_device(cfg.device)
    resolved = resolved_config(cfg, device, checkpoint_model_type(cfg.model))
    info = RunInfo(runtime=runtime.name(), runtime_version=runtime.version(), device=device,
                   device_name=runtime.device_name() if device == "gpu" else None,
                   dtype=dtype_name(cfg.dtype, device), backend=resolved.attention.backend, model=cfg.model,
                   model_path=str(model_dir(cfg.model)))
    return info, resolved
