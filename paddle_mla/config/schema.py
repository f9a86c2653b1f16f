"""Typed engine configuration: dataclasses, YAML loading, ``--set a.b=c`` overrides, validation.

Precedence is CLI ``--set`` > YAML file > defaults. Every key is type-checked; an unknown key is an
error naming the closest valid key; every error names the file and the key. ``load_config``
collects all errors and raises one ``ConfigError`` listing them (``paddle-mla validate`` prints
them). This module imports no tensor library.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from paddle_mla.config.backends import BACKEND_CAPS, check_backend, resolve_backend

AUTO = "auto"


@dataclass
class AttentionConfig:
    # auto: triton_mla on a GPU (when triton is importable), native on CPU; resolved by
    # backend_caps.resolve_backend once the device is known, and validated again then
    backend: Literal["auto", "native", "triton_mla", "dsa", "append_attn"] = AUTO
    # Head-wise sliding-window attention (GQA models; docs/head_wise_swa.md): the last
    # ratio x num_key_value_heads KV heads of every layer see only the first sink_tokens keys and
    # the last sliding_window keys; 0 = every head sees the whole context (today's outputs).
    head_wise_swa_ratio: float = 0.0
    sliding_window: int = 0       # W, tokens (required > 0 when the ratio is > 0)
    sink_tokens: int = 0          # S, tokens
    # skip: SWA heads read only their sinks and window (head-wise tables, per-head pools); mask: the
    # seed's baseline, uniform tables and one pool, SWA heads walk the whole context and mask it
    # (same outputs, a benchmark reference; no recycling)
    swa_mode: Literal["skip", "mask"] = "skip"
    # triton_mla / dsa decode rows through the mla_decode CUDA op (docs/mla_decode.md) where it can
    # serve: a compute capability 9.0 GPU, custom ops built with CUDA, bf16 compute (over a bf16 or
    # an FP8 cache), kv_lora 512 + rope 64; everywhere else, and with false, the portable Triton decode
    cuda_decode: bool = True


@dataclass
class CacheConfig:
    block_size: int = 64
    num_blocks: Union[int, Literal["auto"]] = AUTO
    enable_prefix_caching: bool = False
    gpu_memory_utilization: float = 0.9
    swa_recycle: bool = False     # give SWA heads' blocks that left every future window back to their pool
    # auto: the model's dtype; fp8_e4m3: MLA latents stored as FP8 with a scale a token (1.95x the tokens
    # a GiB; backends native and triton_mla; its decode time and error: docs/fp8_latent_cache.md)
    dtype: Literal["auto", "fp8_e4m3"] = AUTO


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = False
    # per-step cap on the work of the extend rows that the attention backend runs absorbed (short
    # extends: a prefix hit's few new tokens, each re-reading the whole cached context; triton_mla),
    # counted as new tokens x context tokens; the first such row of a step always runs. It keeps a
    # step that admits many prefix hits as short as a few decode steps (ITL p99). 0: no cap
    max_num_batched_absorbed_context: int = 0
    # overlapped scheduling: the host schedules and builds step N+1 while the GPU runs step N (same
    # outputs); auto: on for a GPU, off on CPU (where every copy is synchronous: nothing to hide)
    overlap: Union[bool, Literal["auto"]] = AUTO


@dataclass
class SamplingConfig:
    """Defaults for requests that do not set their own sampling fields."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    ignore_eos: bool = False


@dataclass
class ParallelConfig:
    """Scale-out on one host (docs/scaling_out.md). ``tensor_parallel_size`` N: the model split over N
    ranks (N GPUs, or N CPU processes over gloo), torch runtime only;
    ``data_parallel_size`` M: M engine replicas sharing one input stream; ``expert_parallel``: the
    routed experts placed whole on the N ranks (contiguous ranges) instead of split by width;
    ``attention_split`` (MLA under tensor parallelism): ``heads`` splits every layer's attention
    heads over the ranks; ``rows`` gives each rank the whole attention of its share of the step's
    tokens over the replicated latent cache (data-parallel attention), so a rank reads its rows'
    part of the cache a step instead of all of it."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel: bool = False
    attention_split: Literal["heads", "rows"] = "heads"

    @property
    def attention_rows(self) -> bool:
        return self.attention_split == "rows"


@dataclass
class EngineConfig:
    model: str = "tiny"
    runtime: Literal["auto", "paddle", "torch"] = AUTO
    device: Literal["auto", "cpu", "gpu"] = AUTO
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = AUTO
    # FP8 block-scaled checkpoints: auto keeps FP8 weights as FP8 where FP8 kernels run (a GPU,
    # sm_89+) and dequantizes them to `dtype` elsewhere; none always dequantizes; fp8 requires the
    # FP8 kernels (an error where they cannot run).
    quantization: Literal["auto", "none", "fp8"] = AUTO
    # auto: read the checkpoint; dummy (for benchmarks, vLLM's name): random weights of the
    # checkpoint's layout made on each rank's device from config.json alone (DeepSeek and GQA families;
    # FP8 as published when config.json has an FP8 quantization_config). Outputs are noise.
    load_format: Literal["auto", "dummy"] = AUTO
    seed: int = 0
    max_model_len: Union[int, Literal["auto"]] = AUTO
    cuda_graph: Union[bool, Literal["auto"]] = AUTO
    # true: batch-invariant mode: every reduction of a row (attention splits, GEMM tiles, MoE
    # configs) has an order fixed by the row alone, so greedy tokens do not depend on the batch,
    # chunking, prefix caching or DP size. triton_mla and dsa only (docs/determinism.md)
    deterministic: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid configuration:\n  " + "\n  ".join(errors))


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` or raise ``TypeError``. No silent truncation."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if isinstance(value, str) and value.lower() in typing.get_args(tp):
            return value.lower()
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise TypeError
    if origin is Union:
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg)
            except TypeError:
                continue
        raise TypeError
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError
    raise TypeError


def _apply(obj: Any, data: dict[str, Any], source: str, prefix: str, errors: list[str],
           origins: dict[str, str] | None = None) -> None:
    """Set ``data`` onto ``obj``; ``origins`` records which source set each key (for range errors)."""
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            errors.append(f"{source}: unknown key '{path}'{hint}")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                errors.append(f"{source}: '{path}' must be a mapping of "
                              f"{', '.join(f.name for f in dataclasses.fields(tp))}")
                continue
            _apply(getattr(obj, key), value, source, f"{path}.", errors, origins)
            continue
        try:
            setattr(obj, key, _coerce(value, tp))
            if origins is not None:
                origins[path] = source
        except TypeError:
            errors.append(f"{source}: '{path}' is {value!r}; allowed: {_describe(tp)}")


def _check_ranges(cfg: EngineConfig, errors: list[str]) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(msg)

    need(cfg.model.strip() != "", "'model' (the model path) is empty; give a local checkpoint folder "
         "(config.json + *.safetensors), or tiny for the built-in test model")
    need(cfg.cache.block_size > 0 and cfg.cache.block_size & (cfg.cache.block_size - 1) == 0,
         f"'cache.block_size' is {cfg.cache.block_size}; allowed: a power of two >= 1")
    need(cfg.cache.num_blocks == AUTO or cfg.cache.num_blocks > 0,
         f"'cache.num_blocks' is {cfg.cache.num_blocks}; allowed: 'auto' or an integer > 0")
    need(0.0 < cfg.cache.gpu_memory_utilization <= 1.0,
         f"'cache.gpu_memory_utilization' is {cfg.cache.gpu_memory_utilization}; allowed: (0, 1]")
    need(cfg.max_model_len == AUTO or cfg.max_model_len > 0,
         f"'max_model_len' is {cfg.max_model_len}; allowed: 'auto' or an integer > 0")
    need(cfg.scheduler.max_num_seqs > 0, f"'scheduler.max_num_seqs' is {cfg.scheduler.max_num_seqs}; allowed: > 0")
    need(cfg.scheduler.max_num_batched_tokens > 0,
         f"'scheduler.max_num_batched_tokens' is {cfg.scheduler.max_num_batched_tokens}; allowed: > 0")
    s = cfg.sampling
    need(s.temperature >= 0.0, f"'sampling.temperature' is {s.temperature}; allowed: >= 0 (0 means greedy)")
    need(0.0 < s.top_p <= 1.0, f"'sampling.top_p' is {s.top_p}; allowed: (0, 1]")
    need(s.top_k >= -1, f"'sampling.top_k' is {s.top_k}; allowed: 0 or -1 (all tokens) or a positive integer")
    need(s.max_tokens >= 1, f"'sampling.max_tokens' is {s.max_tokens}; allowed: >= 1")
    need(not (cfg.quantization == "fp8" and cfg.device == "cpu"),
         "'quantization: fp8' needs FP8 kernels, which run only on a GPU (sm_89+: no FP8 dot on CPU); "
         "use quantization: auto (dequantizes FP8 weights on CPU) or none, or device: gpu")
    a = cfg.attention
    need(0.0 <= a.head_wise_swa_ratio <= 1.0,
         f"'attention.head_wise_swa_ratio' is {a.head_wise_swa_ratio}; allowed: a number in [0, 1]")
    need(a.sliding_window >= 0, f"'attention.sliding_window' is {a.sliding_window}; allowed: an integer >= 1")
    need(a.sink_tokens >= 0, f"'attention.sink_tokens' is {a.sink_tokens}; allowed: an integer >= 0")
    need(not (a.head_wise_swa_ratio > 0 and a.sliding_window == 0),
         f"'attention.head_wise_swa_ratio' is {a.head_wise_swa_ratio} but 'attention.sliding_window' is not set; "
         "set the window W in tokens (an integer >= 1)")
    need(a.swa_mode in ("skip", "mask"), f"'attention.swa_mode' is {a.swa_mode!r}; allowed: skip, mask")
    need(not (a.swa_mode == "mask" and cfg.cache.swa_recycle),
         "'cache.swa_recycle' is true with 'attention.swa_mode: mask'; mask mode keeps uniform tables (every "
         "head holds the whole context), so there is nothing to recycle: use swa_mode: skip or swa_recycle: false")
    par = cfg.parallel
    need(par.tensor_parallel_size >= 1, f"'parallel.tensor_parallel_size' is {par.tensor_parallel_size}; allowed: >= 1")
    need(par.data_parallel_size >= 1, f"'parallel.data_parallel_size' is {par.data_parallel_size}; allowed: >= 1")
    need(not (par.tensor_parallel_size > 1 and cfg.runtime == "paddle"),
         "'parallel.tensor_parallel_size' > 1 needs runtime: torch (tensor parallelism is torch-only: "
         "it runs on torch.distributed; the paddle runtime has no paddle.distributed path)")
    need(not (par.tensor_parallel_size > 1 and cfg.deterministic),
         "'deterministic: true' with 'parallel.tensor_parallel_size' > 1: the ranks' all-reduce picks its "
         "algorithm (and so its summation order) by message size, which follows the batch; use "
         "tensor_parallel_size 1 (data_parallel_size is fine) or deterministic: false")
    backend = cfg.attention.backend
    if backend == AUTO and cfg.device != AUTO:
        backend = resolve_backend(backend, cfg.device)
    if backend in BACKEND_CAPS:   # auto with device auto is checked once the device is known (before weights load)
        errors.extend(check_backend(cfg, backend))


def swa_heads(ratio: float, num_kv_heads: int) -> int:
    """Number of SWA heads, ``ratio x num_kv_heads``, which must be a whole number (the last ones of
    every layer are the SWA heads). Needs the architecture, so it runs when the checkpoint is known."""
    exact = ratio * num_kv_heads
    n = round(exact)
    if abs(exact - n) > 1e-9 * max(1, num_kv_heads):
        allowed = ", ".join(f"{k}/{num_kv_heads}" for k in range(num_kv_heads + 1))
        raise ConfigError([f"'attention.head_wise_swa_ratio' {ratio} x num_key_value_heads {num_kv_heads} = "
                           f"{exact:g} is not a whole number of heads; allowed ratios: {allowed}"])
    return n


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=c' -> (['a', 'b'], yaml-parsed c)."""
    if "=" not in text:
        raise ConfigError([f"--set {text!r}: expected KEY=VALUE, e.g. --set scheduler.max_num_seqs=8"])
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip().split("."), value


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> EngineConfig:
    """Defaults, then the YAML file, then ``--set`` overrides; raise ConfigError listing all errors."""
    cfg = EngineConfig()
    errors: list[str] = []
    origins: dict[str, str] = {}
    if path is not None:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError([f"{p}: config file not found"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([yaml_error_text(p, exc)]) from None
        if not isinstance(data, dict):
            raise ConfigError([f"{p}: the top level must be a mapping of config keys"])
        _apply(cfg, data, str(p), "", errors, origins)
    for text in overrides:
        keys, value = parse_override(text)
        _apply(cfg, _nest(keys, value), f"--set {text}", "", errors, origins)
    ranges: list[str] = []
    _check_ranges(cfg, ranges)
    for msg in ranges:   # name the file or --set that gave the value, where the message leads with its key
        key = msg[1:msg.find("'", 1)] if msg.startswith("'") else ""
        errors.append(f"{origins[key]}: {msg}" if key in origins else msg)
    if errors:
        raise ConfigError(errors)
    return cfg


def yaml_error_text(path: Path, exc: Exception) -> str:
    """``path:line:column: not valid YAML: problem`` (PyYAML's own text names its input '<unicode string>')."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> EngineConfig:
    cfg = EngineConfig()
    errors: list[str] = []
    _apply(cfg, data, source, "", errors)
    _check_ranges(cfg, errors)
    if errors:
        raise ConfigError(errors)
    return cfg
