"""ModelRunner: owns the model, the KV caches and the attention backend; runs one step.

One step: host arrays from the SchedulerOutput -> ``ForwardMeta.build`` once -> ``backend.prepare``
once -> ``model.forward`` (every layer reads the same meta) -> logits of the sampling rows ->
sampler -> the single device-to-host read of the sampled tokens and their logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.attention.backend import create_backend  # noqa: E402
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch  # noqa: E402
from paddle_mla.backend_caps import check_model_backend, resolve_backend  # noqa: E402
from paddle_mla.cache.kv_cache import (allocate_index_caches, allocate_latent_caches, auto_num_blocks,  # noqa: E402
                                       bytes_per_block)
from paddle_mla.config import AUTO, EngineConfig  # noqa: E402
from paddle_mla.engine import sampler  # noqa: E402
from paddle_mla.engine.request import TokenLogprob  # noqa: E402
from paddle_mla.engine.sampling_batch import build_sampling_batch, unpack  # noqa: E402
from paddle_mla.engine.scheduler import SchedulerOutput  # noqa: E402
from paddle_mla.models import load_model  # noqa: E402


@dataclass
class StepResult:
    token_ids: np.ndarray                      # int64 [scheduled rows]: the sampled token, -1 where none
    logprobs: list[TokenLogprob | None] = field(default_factory=list)   # per scheduled row


@dataclass
class RunnerLimits:
    max_model_len: int
    num_blocks: int
    max_blocks_per_seq: int


def resolve_dtype(name: str, device_kind: str):
    if name == AUTO:
        name = "float32" if device_kind == "cpu" else "bfloat16"
    return getattr(torch, name)


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


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model_dir: str | None = None, model=None, tp=None):
        """Loads ``model_dir``, or takes a prebuilt ``model`` (benchmarks with random weights).
        ``tp``: this rank's tensor-parallel group (paddle_mla.parallel); rank 0 then has a
        ``tp_driver`` that sends each step's batch to the other ranks."""
        self.cfg = cfg
        self.tp, self.tp_driver = tp, None
        self.device_kind = _runtime.resolve_device(cfg.device)
        self.device = _runtime.device_string(self.device_kind)
        self.dtype = resolve_dtype(cfg.dtype, self.device_kind)
        self.model = model if model is not None else load_model(
            model_dir, self.dtype, self.device, quantization=cfg.quantization, tp=tp)
        self.model.reserve_moe_workspace(cfg.scheduler.max_num_batched_tokens)
        arch = self.model.arch
        self.arch = arch
        backend_name = resolve_backend(cfg.attention.backend, self.device_kind, arch.model_type)
        mismatch = check_model_backend(arch.model_type, backend_name)
        if mismatch:
            raise ValueError(mismatch)
        bs = cfg.cache.block_size
        max_model_len = resolve_max_model_len(cfg, arch.max_position_embeddings)
        elt = torch.zeros(1, dtype=self.dtype).element_size()
        index_dim = arch.indexer.head_dim if arch.indexer is not None else 0   # deepseek_v32 indexer keys
        per_block = bytes_per_block(arch.num_layers, bs, arch.mla.latent_dim + index_dim, elt)
        num_blocks = cfg.cache.num_blocks
        if num_blocks == AUTO:
            num_blocks = auto_num_blocks(self.device_kind, per_block, cfg.scheduler.max_num_seqs, max_model_len, bs,
                                         cfg.cache.gpu_memory_utilization)
        if tp is not None:   # one block pool for all ranks: the smallest rank's count
            num_blocks = tp.agree_min(num_blocks)
        self.limits = RunnerLimits(max_model_len, int(num_blocks), -(-max_model_len // bs))
        self.kv_caches = allocate_latent_caches(arch.num_layers, self.limits.num_blocks, bs, arch.mla.latent_dim,
                                                self.dtype, self.device)
        if index_dim:
            self.index_caches = allocate_index_caches(arch.num_layers, self.limits.num_blocks, bs, index_dim,
                                                      self.dtype, self.device)
            self.model.attach_index_caches(self.index_caches)
        self.backend = create_backend(backend_name, dims=arch.mla, max_num_seqs=cfg.scheduler.max_num_seqs,
                                      max_model_len=max_model_len, block_size=bs, device=self.device,
                                      dtype=self.dtype)
        self.model.set_backend(self.backend)
        self.eos_token_ids = frozenset(arch.eos_token_ids)   # masked by min_tokens; the LLM adds the tokenizer's
        self.key_windows = None
        if self.backend.name == "dsa":   # the indexer's [ks, ke), once per step with prefill tokens
            from paddle_mla.attention.dsa.key_window import KeyWindows

            self.key_windows = KeyWindows(cfg.scheduler.max_num_batched_tokens, self.device)
        self.graphs = None
        if self.use_cuda_graph():
            from paddle_mla.engine.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(self.model, self.backend, self.kv_caches, cfg.scheduler.max_num_seqs,
                                       self.limits.max_blocks_per_seq, bs, self.device)

    def use_cuda_graph(self) -> bool:
        caps = self.backend.caps
        if self.cfg.cuda_graph == AUTO:
            return self.device_kind == "gpu" and caps.cuda_graph
        if self.cfg.cuda_graph and (self.device_kind != "gpu" or not caps.cuda_graph):
            raise ValueError(f"cuda_graph: true needs a GPU and a backend that supports graphs "
                             f"(device {self.device_kind}, backend {self.backend.name!r})")
        return bool(self.cfg.cuda_graph)

    def step_batch(self, out: SchedulerOutput) -> StepBatch:
        sched = out.scheduled
        width = max(len(s.seq.block_ids) for s in sched)
        tables = np.full((len(sched), width), -1, dtype=np.int32)
        tokens = []
        for i, s in enumerate(sched):
            tables[i, :len(s.seq.block_ids)] = s.seq.block_ids
            all_ids = s.seq.token_ids()
            tokens.append(all_ids[s.num_cached:s.num_cached + s.num_new])
        return StepBatch(
            token_ids=np.fromiter((t for ids in tokens for t in ids), dtype=np.int64),
            num_new=np.array([s.num_new for s in sched], dtype=np.int32),
            num_cached=np.array([s.num_cached for s in sched], dtype=np.int32),
            block_tables=tables,
            is_prefill=np.array([s.is_prefill for s in sched], dtype=bool),
            sample_mask=np.array([s.samples for s in sched], dtype=bool),
        )

    def forward_step(self, batch: StepBatch):
        """Metadata once, the model, and the logits of the sampling rows [rows, vocab] (float32)."""
        if self.tp_driver is not None:   # tensor parallel: every rank runs this same step
            self.tp_driver.send(batch)
        meta = ForwardMeta.build(batch, self.cfg.cache.block_size, self.device, self.key_windows)
        if self.graphs is not None and self.graphs.can_run(meta):
            return self.graphs.run(meta)           # decode: every row samples
        self.backend.prepare(meta)
        hidden = self.model.forward(meta, self.kv_caches)
        rows = np.flatnonzero(batch.sample_mask)
        last_token = (np.cumsum(batch.num_new, dtype=np.int64) - 1)[rows]
        return self.model.compute_logits(hidden[torch.from_numpy(last_token).to(self.device)])

    def close(self) -> None:
        """Stop the tensor-parallel workers (a no-op otherwise)."""
        if self.tp_driver is not None:
            self.tp_driver.close()
            self.tp_driver = None

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one step: the sampled token (and logprobs where asked) of each scheduled row."""
        batch = self.step_batch(out)
        rows = np.flatnonzero(batch.sample_mask)
        result = StepResult(np.full(len(out.scheduled), -1, dtype=np.int64), [None] * len(out.scheduled))
        logits = self.forward_step(batch)
        if len(rows) == 0:
            return result
        sb = build_sampling_batch([out.scheduled[r].seq for r in rows], self.eos_token_ids, logits.shape[-1])
        host = sampler.read_to_host(sampler.sample_step(logits, sb))   # the one read of the step
        token_ids, logprobs = unpack(host, sb)
        result.token_ids[rows] = token_ids
        for r, lp in zip(rows, logprobs):     # rows: host numpy indices
            result.logprobs[int(r)] = lp
        return result
