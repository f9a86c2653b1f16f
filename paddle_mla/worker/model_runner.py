"""ModelRunner: owns the model, the KV caches and the attention backend; runs one step.

One step: host arrays from the SchedulerOutput -> ``ForwardMeta.build`` once -> ``backend.prepare``
once -> ``model.forward`` (every layer reads the same meta) -> logits of the sampling rows ->
sampler -> the single device-to-host read of the sampled tokens and their logprobs. The host
arrays come from persistent per-request state (``input_state``) and go up in one pinned copy
(``staging``); ``launch`` enqueues a step without waiting, so the LLM can overlap the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.attention.backend import create_backend  # noqa: E402
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch  # noqa: E402
from paddle_mla.config.backends import check_model_backend, resolve_backend  # noqa: E402
from paddle_mla.cache.kv_cache import (allocate_flat_gqa_caches, allocate_index_caches,  # noqa: E402
                                       allocate_kv_caches, auto_num_blocks, bytes_per_block, kv_width,
                                       usable_num_blocks)
from paddle_mla.cache.head_pool import flat_cache_blocks, head_ranges  # noqa: E402
from paddle_mla.cache.swa import head_wise_swa  # noqa: E402
from paddle_mla.config.schema import AUTO, EngineConfig  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.sched.request import TokenLogprob  # noqa: E402
from paddle_mla.worker.input_state import InputState, gather_step  # noqa: E402
from paddle_mla.worker.sampling_batch import SamplingBatch, SamplingBatchBuilder, unpack  # noqa: E402
from paddle_mla.platform.staging import PendingRead, ResultReader, Uploader  # noqa: E402
from paddle_mla.sched.scheduler import SchedulerOutput  # noqa: E402
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
        _runtime.select(cfg.runtime)   # the engine names the runtime; one other than the active one raises
        self.tp, self.tp_driver = tp, None
        self.device_kind = _runtime.resolve_device(cfg.device)
        self.device = _runtime.device_string(self.device_kind)
        self.dtype = resolve_dtype(cfg.dtype, self.device_kind)
        t0 = time.perf_counter()
        self.model = model if model is not None else load_model(
            model_dir, self.dtype, self.device, quantization=cfg.quantization, tp=tp, load_format=cfg.load_format)
        _runtime.synchronize()              # start-up only: the weights are on the device
        self.load_s = time.perf_counter() - t0   # benchmarks report it
        self.model.reserve_moe_workspace(cfg.scheduler.max_num_batched_tokens)
        arch = self.model.arch
        self.arch = arch
        backend_name = resolve_backend(cfg.attention.backend, self.device_kind, arch.model_type)
        mismatch = check_model_backend(arch.model_type, backend_name)
        if mismatch:
            raise ValueError(mismatch)
        # head-wise SWA plan (None at ratio 0): ConfigError on MLA checkpoints or for a ratio that
        # is not a whole number of KV heads
        gqa_dims = getattr(arch, "gqa", None)   # ModelArch.gqa (GQA branch): num_kv_heads
        self.head_wise_swa = head_wise_swa(cfg, arch.family, gqa_dims.num_kv_heads if gqa_dims else 0)
        # head-wise: each step uploads [B, Hkv, width] tables, kept by deltas (attach_pool gives the pool)
        self.block_pool = None
        swa_kwargs = self.head_wise_swa.backend_kwargs() if self.head_wise_swa is not None else {}
        bs = cfg.cache.block_size
        max_model_len = resolve_max_model_len(cfg, arch.max_position_embeddings)
        elt = torch.zeros(1, dtype=self.dtype).element_size()
        index_dim = arch.indexer.head_dim if arch.indexer is not None else 0   # deepseek_v32 indexer keys
        per_block = bytes_per_block(arch.num_layers, bs, kv_width(arch), elt)
        gqa = arch.family == "gqa"      # GQA: a head-major (K, V) pair per layer; MLA: one latent cache
        dsa = backend_name == "dsa"
        dsa_kwargs = dict(index_topk=arch.indexer.topk, deterministic=cfg.deterministic) if dsa else {}
        self.backend = create_backend(backend_name, family=arch.family, dims=arch.gqa if gqa else arch.mla,
                                      max_num_seqs=cfg.scheduler.max_num_seqs,
                                      max_model_len=max_model_len, block_size=bs, device=self.device,
                                      dtype=self.dtype, max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
                                      **swa_kwargs, **dsa_kwargs)
        self.model.set_backend(self.backend)
        self.eos_token_ids = frozenset(arch.eos_token_ids)   # masked by min_tokens; the LLM adds the tokenizer's
        self.key_windows = None
        if self.backend.name == "dsa":   # the indexer's [ks, ke), once per step with prefill tokens
            from paddle_mla.attention.dsa.key_window import KeyWindows

            self.key_windows = KeyWindows(cfg.scheduler.max_num_batched_tokens, self.device)
        # The caches come after the backend (and its start-up workspaces): on a GPU, a profile run
        # through both sizes them from what is left (engine/memory_profile.py).
        self.memory_profile = None
        num_blocks = cfg.cache.num_blocks
        if num_blocks == AUTO and self.device_kind == "gpu":
            from paddle_mla.worker.memory_profile import profile_kv_cache

            self.memory_profile = profile_kv_cache(self, per_block, max_model_len, index_dim, self.use_cuda_graph())
            num_blocks = self.memory_profile.num_blocks
        elif num_blocks == AUTO:
            num_blocks = auto_num_blocks(self.device_kind, per_block, cfg.scheduler.max_num_seqs, max_model_len, bs,
                                         cfg.cache.gpu_memory_utilization)
        if tp is not None:   # one block pool for all ranks: the smallest rank's count
            num_blocks = tp.agree_min(num_blocks)
        # Head-wise SWA with recycling: the budget of num_blocks per KV head is re-split so each SWA
        # head's range holds what recycled rows can use and the full heads get the rest; unequal
        # ranges live in one flat cache per layer (limits.num_blocks is then the full heads' range).
        swa = self.head_wise_swa
        self.swa_num_blocks = None
        if swa is not None and swa.head_wise_tables:
            usable = usable_num_blocks(cfg.scheduler.max_num_seqs, max_model_len, bs)
            num_blocks, self.swa_num_blocks = head_ranges(swa, int(num_blocks), bs, cfg.scheduler, usable)
        self.limits = RunnerLimits(max_model_len, int(num_blocks), -(-max_model_len // bs))
        if self.swa_num_blocks is not None:
            self.kv_caches = allocate_flat_gqa_caches(arch.num_layers,
                                                      flat_cache_blocks(swa, num_blocks, self.swa_num_blocks), bs,
                                                      arch.gqa.head_dim, self.dtype, self.device)
        else:
            self.kv_caches = allocate_kv_caches(arch, self.limits.num_blocks, bs, self.dtype, self.device)
        if index_dim:
            self.index_caches = allocate_index_caches(arch.num_layers, self.limits.num_blocks, bs, index_dim,
                                                      self.dtype, self.device)
            self.model.attach_index_caches(self.index_caches)
        self._init_inputs()
        self.graphs = None
        if self.use_cuda_graph():
            from paddle_mla.worker.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(self.model, self.backend, self.kv_caches, cfg.scheduler.max_num_seqs,
                                       self.limits.max_blocks_per_seq, bs, self.device, self._table_heads())

    def _init_inputs(self) -> None:
        """Persistent step inputs, sized from the limits: per-request host rows, the pinned staging
        and device buffers of the one upload per step, the pinned buffers of the one read, and each
        request's last sampled token on the device (read there by overlapped scheduling)."""
        sc, lim = self.cfg.scheduler, self.limits
        self.inputs = InputState(sc.max_num_seqs, lim.max_blocks_per_seq)
        nbytes = (16 * sc.max_num_batched_tokens + 4 * sc.max_num_seqs * (self._table_heads() or 1)
                  * (lim.max_blocks_per_seq + 64) + 4096)
        self.uploader = Uploader(self.device, nbytes)
        self.reader = ResultReader(self.device, sc.max_num_seqs * 4)
        self.last_sampled = torch.zeros(sc.max_num_seqs, dtype=torch.int64, device=self.device)
        self.sampling_builder = SamplingBatchBuilder()   # row parameters kept while the rows stay

    def _table_heads(self) -> int:
        """KV heads of a head-wise block table (0: uniform [B, max_blocks] tables)."""
        swa = self.head_wise_swa
        return swa.num_kv_heads if swa is not None and swa.head_wise_tables else 0

    def attach_pool(self, pool) -> None:
        """The engine's block pool (LLM builds it from ``limits``): with head-wise SWA the input
        state keeps each KV head's table rows by deltas from its rows (engine/head_tables.py)."""
        self.block_pool = pool
        if self._table_heads():
            self.inputs = InputState(self.cfg.scheduler.max_num_seqs, self.limits.max_blocks_per_seq, pool)

    def use_cuda_graph(self) -> bool:
        caps = self.backend.caps
        if self.cfg.cuda_graph == AUTO:
            return self.device_kind == "gpu" and caps.cuda_graph
        if self.cfg.cuda_graph and (self.device_kind != "gpu" or not caps.cuda_graph):
            raise ValueError(f"cuda_graph: true needs a GPU and a backend that supports graphs "
                             f"(device {self.device_kind}, backend {self.backend.name!r})")
        return bool(self.cfg.cuda_graph)

    def step_batch(self, out: SchedulerOutput) -> StepBatch:
        """The step's host arrays from the persistent per-request state (block-table rows by deltas,
        new tokens sliced, never the whole token list). PENDING tokens are filled on the device."""
        return self._gather(out)[0]

    def _gather(self, out: SchedulerOutput):
        host = gather_step(self.inputs, out.scheduled)    # head-wise: [B, Hkv, width], rows by deltas
        batch = StepBatch(token_ids=host.token_ids, num_new=host.num_new, num_cached=host.num_cached,
                          block_tables=host.block_tables, is_prefill=host.is_prefill, sample_mask=host.sample_mask)
        return batch, host

    def _forward(self, batch: StepBatch, extra: dict | None = None):
        if self.tp_driver is not None:   # tensor parallel: every rank runs this same step
            self.tp_driver.send(batch)
        meta = ForwardMeta.build(batch, self.cfg.cache.block_size, self.device, self.key_windows, self.uploader,
                                 extra)
        if "pending_pos" in meta.extra:     # overlapped scheduling: tokens sampled by the step before
            ids = self.last_sampled.gather(0, meta.extra["pending_slot"])
            meta.input_ids.scatter_(0, meta.extra["pending_pos"], ids)
        if self.graphs is not None and self.graphs.can_run(meta):
            return self.graphs.run(meta), meta       # decode: every row samples
        self.backend.prepare(meta)
        hidden = self.model.forward(meta, self.kv_caches)
        return self.model.compute_logits(hidden[meta.sample_indices]), meta

    def forward_step(self, batch: StepBatch):
        """Metadata once, the model, and the logits of the sampling rows [rows, vocab] (float32)."""
        return self._forward(batch)[0]

    def launch(self, out: SchedulerOutput) -> "LaunchedStep":
        """Enqueue one step (inputs, model, sampler, and the start of the one read) without waiting."""
        batch, host = self._gather(out)
        rows = np.flatnonzero(batch.sample_mask)
        sb = None
        extra: dict[str, np.ndarray] = {}
        if len(rows):
            sched = out.scheduled
            # the rows' sequences by a host loop (list indexing by numpy scalars costs more per row)
            seqs = [s.seq for s, m in zip(sched, batch.sample_mask) if m] if len(rows) < len(sched) \
                else [s.seq for s in sched]
            sb = self.sampling_builder.build(seqs, self.eos_token_ids, self.arch.vocab_size)
            extra = {"s_" + k: v for k, v in sampler.device_arrays(sb).items()}
            extra["sample_slots"] = host.slots[rows]
        if len(host.pending_pos):
            extra.update(pending_pos=host.pending_pos, pending_slot=host.pending_slot)
        logits, meta = self._forward(batch, extra)
        if sb is None:
            return LaunchedStep(len(out.scheduled), rows, None, None)
        dev = {k[2:]: v for k, v in meta.extra.items() if k.startswith("s_")}
        packed, ids = sampler.sample_step_ids(logits, sb, dev)
        self.last_sampled.scatter_(0, meta.extra["sample_slots"], ids)
        return LaunchedStep(len(out.scheduled), rows, sb, self.reader.start(packed))

    def close(self) -> None:
        """Stop the tensor-parallel workers (a no-op otherwise)."""
        if self.tp_driver is not None:
            self.tp_driver.close()
            self.tp_driver = None

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one step: the sampled token (and logprobs where asked) of each scheduled row."""
        return self.launch(out).result()


@dataclass
class LaunchedStep:
    """A step on the device; ``result()`` does the step's one read (waiting for it)."""

    num_rows: int
    rows: np.ndarray
    sampling: SamplingBatch | None
    read: PendingRead | None

    def result(self) -> StepResult:
        result = StepResult(np.full(self.num_rows, -1, dtype=np.int64), [None] * self.num_rows)
        if self.sampling is None:
            return result
        host = sampler.read_to_host(self.read)   # the one read of the step
        token_ids, logprobs = unpack(host, self.sampling)
        result.token_ids[self.rows] = token_ids
        # host numpy indices (the sampling batch's and the scheduler's): no device read here
        for r in self.sampling.logprob_rows:      # the other rows' logprobs stay None
            result.logprobs[self.rows[r]] = logprobs[r]
        return result
