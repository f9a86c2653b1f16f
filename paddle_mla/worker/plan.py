"""RunPlan: every start-up decision, made once, before anything is built (docs/architecture.md, "config" and "worker").

``resolve_plan(cfg, arch)`` turns the ``EngineConfig`` and the checkpoint's architecture (its
config.json) into one frozen ``RunPlan``: runtime, device, dtype, quantization, attention backend,
KV layout (MLA latent or GQA head-major, with the head-wise SWA plan), memory budget, CUDA-graph
sizes and max_model_len. The model runner builds every component from it, the engine's run line
(``engine.run_info``) is a view of it, and ``paddle-mla validate`` prints it. No other module
repeats these rules.

This module imports no tensor library (``validate`` uses it); the runtime must be selected, since
the device, the runtime's version and the FP8 kernel check come from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paddle_mla.cache.swa import HeadWiseSwa, head_wise_swa
from paddle_mla.config.backends import BACKEND_CAPS, resolved_config
from paddle_mla.config.schema import AUTO, EngineConfig
from paddle_mla.platform import runtime

if TYPE_CHECKING:
    from paddle_mla.models.arch import ModelArch

MLA_LATENT = "mla_latent"          # one [num_blocks, block_size, 1, latent (+ indexer key)] cache per layer
GQA_HEAD_MAJOR = "gqa_head_major"  # K and V [num_kv_heads, num_blocks, block_size, head_dim] per layer


@dataclass(frozen=True)
class KVLayout:
    kind: str                       # MLA_LATENT | GQA_HEAD_MAJOR
    num_layers: int
    width: int                      # elements one token stores per layer (kv_cache.kv_width; FP8: its bytes)
    index_dim: int                  # deepseek_v32 indexer key width (0: no indexer cache)
    swa: HeadWiseSwa | None         # head-wise SWA plan (None: every head sees the whole context)
    fp8: bool = False               # MLA latents in the FP8 format of cache.fp8_latent (cache.dtype: fp8_e4m3)

    @property
    def table_heads(self) -> int:
        """KV heads of a head-wise block table (0: uniform [B, max_blocks] tables)."""
        return self.swa.num_kv_heads if self.swa is not None and self.swa.head_wise_tables else 0


@dataclass(frozen=True)
class MemoryPlan:
    block_size: int
    num_blocks: int | None          # as configured; None: sized at start-up (GPU profile run, CPU fixed budget)
    gpu_memory_utilization: float
    max_blocks_per_seq: int         # block-table width: blocks of max_model_len


@dataclass(frozen=True)
class RunPlan:
    config: EngineConfig            # the config with device and attention backend resolved
    runtime: str                    # torch | paddle
    runtime_version: str
    device: str                     # cpu | gpu
    device_name: str | None         # the GPU's name
    dtype: str                      # float32 | bfloat16 | float16
    quantization: str               # fp8: FP8 checkpoint weights stay FP8; none: dequantized to dtype
    backend: str                    # the attention backend
    model_type: str
    family: str                     # mla | gqa
    kv: KVLayout
    memory: MemoryPlan
    max_model_len: int
    cuda_graph_sizes: tuple[int, ...]   # decode batch sizes captured as CUDA graphs (empty: eager only)

    @property
    def use_cuda_graph(self) -> bool:
        return bool(self.cuda_graph_sizes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``validate`` prints it as YAML); the config is printed on its own."""
        out = dataclasses.asdict(self)
        del out["config"]
        out["cuda_graph_sizes"] = list(self.cuda_graph_sizes)
        if self.memory.num_blocks is None:
            out["memory"]["num_blocks"] = "auto (profile run on a GPU, fixed budget on CPU)"
        return out


def dtype_name(dtype: str, device_kind: str) -> str:
    """Config ``dtype`` -> the dtype the engine uses (auto: float32 on CPU, bfloat16 on GPU)."""
    if dtype == AUTO:
        return "float32" if device_kind == "cpu" else "bfloat16"
    return dtype


def resolve_max_model_len(cfg: EngineConfig, max_position_embeddings: int) -> int:
    limit = max_position_embeddings
    if not cfg.scheduler.enable_chunked_prefill:
        # A prompt runs whole in one step, so it must fit the step's token budget.
        limit = min(limit, cfg.scheduler.max_num_batched_tokens)
    if cfg.max_model_len == AUTO:
        return limit
    if cfg.max_model_len > max_position_embeddings:
        raise ValueError(f"max_model_len {cfg.max_model_len} exceeds the model's max_position_embeddings "
                         f"{max_position_embeddings}")
    if cfg.max_model_len > limit:
        raise ValueError(f"max_model_len {cfg.max_model_len} exceeds scheduler.max_num_batched_tokens "
                         f"{cfg.scheduler.max_num_batched_tokens} with chunked prefill off; enable "
                         "scheduler.enable_chunked_prefill or raise max_num_batched_tokens")
    return cfg.max_model_len


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes captured as graphs: powers of two below ``max_num_seqs``, then it."""
    sizes, n = [], 1
    while n < max_num_seqs:
        sizes.append(n)
        n *= 2
    sizes.append(max_num_seqs)
    return tuple(sizes)


def graph_sizes(cfg: EngineConfig, device_kind: str, backend: str) -> tuple[int, ...]:
    """``cuda_graph`` auto: graphs on a GPU with a backend that supports them. ``true`` where they
    cannot run never gets here: ``config.backends.check_backend`` rejects it (``resolved_config``)."""
    use = device_kind == "gpu" and BACKEND_CAPS[backend].cuda_graph if cfg.cuda_graph == AUTO else cfg.cuda_graph
    return capture_sizes(cfg.scheduler.max_num_seqs) if use else ()


def resolve_quantization(quantization: str, device_kind: str) -> str:
    """Config ``quantization`` -> fp8 (FP8 checkpoint weights stay FP8 here) or none."""
    from paddle_mla.models.loader import resolve_keep_fp8

    return "fp8" if resolve_keep_fp8(quantization, device_kind) else "none"


def check_cache_dtype(cache_dtype: str, gpu_here: bool) -> None:
    """cache.dtype fp8_e4m3 on a GPU needs FP8 conversions (compute capability 8.9+): refused while
    planning, before any weight is read. CPUs run the codec (and validate plans a GPU config anywhere)."""
    if cache_dtype == AUTO or not gpu_here:
        return
    from paddle_mla.models.fp8 import fp8_kernels_available

    ok, why = fp8_kernels_available("gpu")
    if not ok:
        raise ValueError(f"cache.dtype {cache_dtype} cannot run on this GPU: {why}; use cache.dtype: auto")


def kv_layout(cfg: EngineConfig, arch: "ModelArch") -> KVLayout:
    """The per-rank cache layout: under tensor parallelism a rank holds its share of the KV heads."""
    from paddle_mla.cache.kv_cache import kv_width
    from paddle_mla.models.sharding import local_arch

    par = cfg.parallel
    local = local_arch(arch, par.tensor_parallel_size, par.attention_rows)
    gqa = local.family == "gqa"
    # ConfigError on MLA checkpoints, for a ratio that is not a whole number of KV heads, or for SWA
    # and full heads that do not split evenly over the tensor-parallel ranks
    swa = head_wise_swa(cfg, local.family, arch.gqa.num_kv_heads if gqa else 0, cfg.parallel.tensor_parallel_size)
    fp8 = cfg.cache.dtype != AUTO       # resolved_config refused it for GQA and deepseek_v32 checkpoints
    return KVLayout(kind=GQA_HEAD_MAJOR if gqa else MLA_LATENT, num_layers=local.num_layers,
                    width=kv_width(local, fp8), fp8=fp8,
                    index_dim=local.indexer.head_dim if local.indexer is not None else 0, swa=swa)


def resolve_plan(cfg: EngineConfig, arch: "ModelArch", device_kind: str | None = None) -> RunPlan:
    """The plan of ``cfg`` for a checkpoint of ``arch`` (the runtime selected). ``device_kind``:
    the device to plan for (``validate`` plans a config's named device on any machine); None
    resolves ``cfg.device`` here (RuntimeError for device: gpu without a GPU). Raises ConfigError
    (the resolved backend does not support the config or the checkpoint) or ValueError."""
    device = device_kind or runtime.resolve_device(cfg.device)
    resolved = resolved_config(cfg, device, arch.model_type)
    backend = resolved.attention.backend
    max_model_len = resolve_max_model_len(resolved, arch.max_position_embeddings)
    bs = resolved.cache.block_size
    num_blocks = resolved.cache.num_blocks
    memory = MemoryPlan(block_size=bs, num_blocks=None if num_blocks == AUTO else int(num_blocks),
                        gpu_memory_utilization=resolved.cache.gpu_memory_utilization,
                        max_blocks_per_seq=-(-max_model_len // bs))
    gpu_here = device == "gpu" and runtime.gpu_available()
    check_cache_dtype(resolved.cache.dtype, gpu_here)
    return RunPlan(config=resolved, runtime=runtime.name(), runtime_version=runtime.version(), device=device,
                   device_name=runtime.device_name() if gpu_here else None,
                   dtype=dtype_name(resolved.dtype, device),
                   quantization=resolve_quantization(resolved.quantization, device), backend=backend,
                   model_type=arch.model_type, family=arch.family, kv=kv_layout(resolved, arch), memory=memory,
                   max_model_len=max_model_len, cuda_graph_sizes=graph_sizes(resolved, device, backend))
