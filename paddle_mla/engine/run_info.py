"""What will run: the model folder check, and the resolved runtime / device / dtype / backend / model.

``model_problem`` is pure Python (``validate`` uses it without a tensor library). ``plan_run``
needs the runtime selected: it reads the checkpoint's config.json and resolves the ``RunPlan``
(``worker.plan``) the engine then builds from, before any weights load, so ``generate`` and
``bench`` can print what runs (``run_info``, a view of the plan) as their first line and fail
before work.
"""

from __future__ import annotations

import json

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paddle_mla.config.schema import EngineConfig

if TYPE_CHECKING:
    from paddle_mla.worker.plan import RunPlan

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
    parallel: str = ""             # tensor parallelism and its splits ("": one GPU)
    kv_cache_dtype: str = ""       # the KV cache's, where it is not ``dtype`` (fp8_e4m3)

    def line(self) -> str:
        device = f"{self.device} ({self.device_name})" if self.device_name else self.device
        model = self.model if self.model == self.model_path else f"{self.model} ({self.model_path})"
        dtype = self.dtype + (f" (KV cache {self.kv_cache_dtype})" if self.kv_cache_dtype else "")
        return (f"paddle-mla: runtime {self.runtime} {self.runtime_version}, device {device}, dtype {dtype}, "
                f"backend {self.backend}, model {model}" + (f", {self.parallel}" if self.parallel else ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_run(cfg: EngineConfig, model: Any = None, device_kind: str | None = None) -> "RunPlan":
    """The ``RunPlan`` of ``cfg`` (the runtime must be selected): the model folder checked, the
    checkpoint's config.json read (the tiny model built on first use; a prebuilt ``model``'s own
    architecture instead), and every ``auto`` resolved, before any weight loads. ``device_kind``:
    plan for that device rather than resolve ``cfg.device`` here (``validate``). Raises
    ModelPathError, ConfigError, ValueError or RuntimeError (device: gpu without a GPU)."""
    from paddle_mla.models import ensure_tiny_model, load_arch
    from paddle_mla.worker.plan import resolve_plan

    check_model(cfg.model)
    if model is not None:
        arch = model.arch
    elif cfg.model == TINY:
        arch = load_arch(ensure_tiny_model())
    else:
        arch = checkpoint_arch(cfg.model)
    return resolve_plan(cfg, arch, device_kind)


def checkpoint_arch(model: str):
    """The architecture of the checkpoint folder ``model``; a config.json that is not JSON or names
    no supported model is the model path's problem (one line), not a traceback."""
    from paddle_mla.models import load_arch

    try:
        return load_arch(model_dir(model))
    except json.JSONDecodeError as e:
        raise ModelPathError(f"model folder {model}: config.json is not valid JSON (line {e.lineno}: {e.msg})") from e
    except (ValueError, KeyError, TypeError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise ModelPathError(f"model folder {model}: config.json cannot be read as a supported model: {what}") from e


def run_info(plan: "RunPlan") -> RunInfo:
    """The run line's view of ``plan``."""
    model = plan.config.model
    par = plan.config.parallel
    parallel = []
    if par.tensor_parallel_size > 1:
        parallel.append(f"tensor parallel {par.tensor_parallel_size}")
        if plan.family == "mla":    # GQA splits its KV heads whatever the key says
            parallel.append(f"attention by {par.attention_split}")
        if par.expert_parallel:
            parallel.append("experts whole")
    return RunInfo(runtime=plan.runtime, runtime_version=plan.runtime_version, device=plan.device,
                   device_name=plan.device_name, dtype=plan.dtype, backend=plan.backend, model=model,
                   model_path=str(model_dir(model)), parallel=", ".join(parallel),
                   kv_cache_dtype=plan.config.cache.dtype if plan.kv.fp8 else "")


def describe_run(cfg: EngineConfig) -> tuple[RunInfo, EngineConfig]:
    """What ``cfg`` runs and the config with device and backend resolved (``plan_run``'s view)."""
    plan = plan_run(cfg)
    return run_info(plan), plan.config
