"""ModelRunner: owns the model, the KV caches and the attention backend; runs one step.

Built from a ``RunPlan`` (worker/plan.py) in a few named steps: model, backend, inputs, caches,
graphs. One step: the scheduler's plain-data changes (sched/output.py ``StepInput``) applied to the
persistent input batch (``input_state``) -> its host arrays -> ``run_model``: the metadata built
once (the sampler's arrays ride the same upload, apart from it) -> ``backend.prepare`` once ->
``model.forward`` (every layer reads the same meta) -> logits of the sampling rows -> sampler -> the
single device-to-host read of the sampled tokens and their logprobs. ``run_model`` also runs the
memory profile's dummy steps, and its ``_forward_meta`` is what CUDA graphs capture. The host arrays
go up in one pinned copy (``staging``); ``launch`` enqueues a step without waiting, so the engine
can overlap the next one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.ops import batch_invariant  # noqa: E402
from paddle_mla.attention.backend import create_backend  # noqa: E402
from paddle_mla.attention.forward_meta import ForwardMeta, SideArrays, StepBatch, build_step  # noqa: E402
from paddle_mla.attention.row_share import build_share  # noqa: E402
from paddle_mla.cache.kv_cache import (allocate_flat_gqa_caches, allocate_index_caches,  # noqa: E402
                                       allocate_kv_caches, auto_num_blocks, bytes_per_block, usable_num_blocks)
from paddle_mla.cache.head_pool import flat_cache_blocks, head_ranges, make_block_pool  # noqa: E402
from paddle_mla.config.backends import BACKEND_CAPS  # noqa: E402
from paddle_mla.config.schema import EngineConfig  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.worker.penalties import PenaltyState  # noqa: E402
from paddle_mla.worker.plan import RunPlan, resolve_plan  # noqa: E402
from paddle_mla.sched.request import TokenLogprob  # noqa: E402
from paddle_mla.worker.input_state import InputState  # noqa: E402
from paddle_mla.worker.sampling_batch import SamplingBatch, SamplingBatchBuilder, unpack  # noqa: E402
from paddle_mla.platform.staging import PendingRead, ResultReader, Uploader  # noqa: E402
from paddle_mla.sched.output import StepInput  # noqa: E402
from paddle_mla.models import load_arch, load_model  # noqa: E402


@dataclass
class StepResult:
    token_ids: np.ndarray                      # int64 [scheduled rows]: the sampled token, -1 where none
    logprobs: list[TokenLogprob | None] = field(default_factory=list)   # per scheduled row


@dataclass
class RunnerLimits:
    max_model_len: int
    num_blocks: int
    max_blocks_per_seq: int


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model_dir: str | None = None, model=None, tp=None,
                 plan: RunPlan | None = None, eos_token_ids: frozenset = frozenset()):
        """Loads ``model_dir``, or takes a prebuilt ``model`` (benchmarks with random weights).
        ``tp``: this rank's tensor-parallel group (paddle_mla.parallel); rank 0 then has a
        ``tp_driver`` that sends each step's changes to the other ranks. ``plan``: the engine's
        ``RunPlan`` (resolved here from ``cfg`` and the checkpoint when None). ``eos_token_ids``: the
        tokenizer's, masked before min_tokens with the model's."""
        self._tokenizer_eos = frozenset(eos_token_ids)
        _runtime.select(cfg.runtime)   # the engine names the runtime; one other than the active one raises
        if plan is None:
            plan = resolve_plan(cfg, model.arch if model is not None else load_arch(model_dir))
        self.plan = plan
        self.cfg = plan.config
        self.tp, self.tp_driver = tp, None
        # parallel.attention_split: rows: this rank attends its share of each step's token rows
        self.share_rows = (tp.rank, tp.size) if tp is not None and tp.attention_rows else None
        self.device_kind = plan.device
        self.device = _runtime.device_string(plan.device)
        self.dtype = getattr(torch, plan.dtype)
        self.head_wise_swa = plan.kv.swa
        self.block_pool = None       # head-wise: attach_pool gives it, and the input state keeps tables by it
        self.graphs = None
        self._load_model(model_dir, model)
        self._build_backend()
        self._init_inputs()
        self._build_caches()
        if plan.use_cuda_graph:
            from paddle_mla.worker.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(self._forward_meta, plan.cuda_graph_sizes, plan.memory.max_blocks_per_seq,
                                       plan.memory.block_size, self.device, self._table_heads(), self.share_rows)

    def _global_swa_heads(self) -> int:
        """Head-wise SWA's KV heads over every rank (the plan holds one rank's equal share)."""
        swa = self.plan.kv.swa
        return swa.num_swa_heads * (self.tp.size if self.tp is not None else 1) if swa is not None else 0

    def _load_model(self, model_dir: str | None, model) -> None:
        t0 = time.perf_counter()
        self.model = model if model is not None else load_model(
            model_dir, self.dtype, self.device, quantization=self.plan.quantization, tp=self.tp,
            load_format=self.cfg.load_format, swa_kv_heads=self._global_swa_heads())
        _runtime.synchronize()              # start-up only: the weights are on the device
        self.load_s = time.perf_counter() - t0   # benchmarks report it
        self.model.reserve_moe_workspace(self.cfg.scheduler.max_num_batched_tokens)
        self.arch = self.model.arch
        self.eos_token_ids = frozenset(self.arch.eos_token_ids) | self._tokenizer_eos   # masked before min_tokens

    def _build_backend(self) -> None:
        """The attention backend (with its start-up workspaces) and, for dsa, the indexer's key windows."""
        plan, arch, sc = self.plan, self.arch, self.cfg.scheduler
        swa_kwargs = plan.kv.swa.backend_kwargs() if plan.kv.swa is not None else {}
        backend_kwargs = dict(index_topk=arch.indexer.topk) if plan.backend == "dsa" else {}
        if plan.backend in ("triton_mla", "dsa"):
            backend_kwargs["cuda_decode"] = self.cfg.attention.cuda_decode
        if BACKEND_CAPS[plan.backend].deterministic:     # the backends that take the mode
            backend_kwargs["deterministic"] = self.cfg.deterministic
        self.backend = create_backend(plan.backend, family=plan.family,
                                      dims=arch.gqa if plan.family == "gqa" else arch.mla,
                                      max_num_seqs=sc.max_num_seqs, max_model_len=plan.max_model_len,
                                      block_size=plan.memory.block_size, device=self.device, dtype=self.dtype,
                                      max_num_batched_tokens=sc.max_num_batched_tokens, **swa_kwargs, **backend_kwargs)
        self.model.set_backend(self.backend)
        # the backend computes prompt and output tokens on different paths (triton_mla under the mode)
        self.prompt_apart = getattr(self.backend, "prompt_apart", False)
        self.key_windows = None
        if plan.backend == "dsa":   # the indexer's [ks, ke), once per step with prefill tokens
            from paddle_mla.attention.dsa.key_window import KeyWindows

            self.key_windows = KeyWindows(sc.max_num_batched_tokens, self.device)

    def _num_blocks(self, per_block: int) -> int:
        """Blocks per KV head range: as configured, else what a profile run leaves (GPU) or the fixed
        CPU budget; under tensor parallelism the smallest rank's count."""
        plan, sc = self.plan, self.cfg.scheduler
        mem = plan.memory
        self.memory_profile = None
        num_blocks = mem.num_blocks
        if num_blocks is None and plan.device == "gpu":
            from paddle_mla.worker.memory_profile import profile_kv_cache

            self.memory_profile = profile_kv_cache(self, per_block, plan.max_model_len, plan.kv.index_dim,
                                                   plan.use_cuda_graph)
            num_blocks = self.memory_profile.num_blocks
        elif num_blocks is None:
            num_blocks = auto_num_blocks(plan.device, per_block, sc.max_num_seqs, plan.max_model_len,
                                         mem.block_size, mem.gpu_memory_utilization)
        if self.tp is not None:   # one block pool for all ranks: the smallest rank's count
            num_blocks = self.tp.agree_min(num_blocks)
        return int(num_blocks)

    def _build_caches(self) -> None:
        """The KV caches come after the backend (and its start-up workspaces): on a GPU, a profile run
        through both sizes them from what is left (worker/memory_profile.py)."""
        plan, arch, sc = self.plan, self.arch, self.cfg.scheduler
        bs, kv = plan.memory.block_size, plan.kv
        elt = 1 if kv.fp8 else torch.zeros(1, dtype=self.dtype).element_size()
        num_blocks = self._num_blocks(bytes_per_block(kv.num_layers, bs, kv.width, elt))
        # Head-wise SWA with recycling: the budget of num_blocks per KV head is re-split so each SWA
        # head's range holds what recycled rows can use and the full heads get the rest; unequal
        # ranges live in one flat cache per layer (limits.num_blocks is then the full heads' range).
        self.swa_num_blocks = None
        if kv.table_heads:
            usable = usable_num_blocks(sc.max_num_seqs, plan.max_model_len, bs)
            num_blocks, self.swa_num_blocks = head_ranges(kv.swa, num_blocks, bs, sc, usable, plan.max_model_len)
        self.limits = RunnerLimits(plan.max_model_len, int(num_blocks), plan.memory.max_blocks_per_seq)
        if self.swa_num_blocks is not None:
            self.kv_caches = allocate_flat_gqa_caches(kv.num_layers,
                                                      flat_cache_blocks(kv.swa, num_blocks, self.swa_num_blocks), bs,
                                                      arch.gqa.head_dim, self.dtype, self.device)
        else:
            self.kv_caches = allocate_kv_caches(arch, self.limits.num_blocks, bs, self.dtype, self.device, kv.fp8)
        if kv.index_dim:
            self.index_caches = allocate_index_caches(kv.num_layers, self.limits.num_blocks, bs, kv.index_dim,
                                                      self.dtype, self.device)
            self.model.attach_index_caches(self.index_caches)

    def _init_inputs(self) -> None:
        """Persistent step inputs, sized from the plan: per-request host rows (head-wise tables wait
        for the block pool: ``attach_pool``), the pinned staging and device buffers of the one upload
        per step, the pinned buffers of the one read, and each request's last sampled token on the
        device (read there by overlapped scheduling)."""
        sc, max_blocks = self.cfg.scheduler, self.plan.memory.max_blocks_per_seq
        self.inputs = None if self._table_heads() else InputState(sc.max_num_seqs, max_blocks)
        nbytes = (16 * sc.max_num_batched_tokens + 4 * sc.max_num_seqs * (self._table_heads() or 1)
                  * (max_blocks + 64) + 4096)
        self.uploader = Uploader(self.device, nbytes)
        # the row share's own metadata goes up apart (its arrays come from the step's, on the host)
        self.share_uploader = Uploader(self.device, nbytes) if self.share_rows else None
        self.reader = ResultReader(self.device, sc.max_num_seqs * 4)
        self.last_sampled = torch.zeros(sc.max_num_seqs, dtype=torch.int64, device=self.device)
        self.sampling_builder = SamplingBatchBuilder()   # row parameters kept while the rows stay
        # penalized requests' token counts per slot (allocated on the first one)
        self.penalties = PenaltyState(sc.max_num_seqs, self.arch.vocab_size, self.device)

    def _table_heads(self) -> int:
        """KV heads of a head-wise block table (0: uniform [B, max_blocks] tables)."""
        return self.plan.kv.table_heads

    def new_block_pool(self):
        """The block pool ``limits`` size: the engine's scheduler allocates from it; a tensor-parallel
        worker's own copy gives its head-wise input state the table layout (spec, per-head ranges)."""
        cache = self.cfg.cache
        return make_block_pool(self.limits.num_blocks, cache.block_size, cache.enable_prefix_caching,
                               self.head_wise_swa, self.swa_num_blocks, outputs_apart=self.prompt_apart)

    def attach_pool(self, pool) -> None:
        """The engine's block pool (LLM builds it from ``limits``): with head-wise SWA the input
        state keeps each KV head's table rows by deltas from its rows (worker/head_tables.py)."""
        self.block_pool = pool
        if self._table_heads():
            self.inputs = InputState(self.cfg.scheduler.max_num_seqs, self.limits.max_blocks_per_seq, pool)

    def use_cuda_graph(self) -> bool:
        return self.plan.use_cuda_graph

    @property
    def overlap(self) -> bool:
        """Overlapped scheduling (docs/overlap.md): ``scheduler.overlap``, auto on for a GPU. Every rank
        of a tensor-parallel group resolves it from the same config, so they agree on sharing the
        sampled ids."""
        ov = self.cfg.scheduler.overlap
        return self.device_kind == "gpu" if ov == "auto" else bool(ov)

    def worker_step(self, msg: StepInput) -> None:
        """A tensor-parallel worker's step: rank 0's changes applied to this rank's input batch, the
        model (its collectives meet rank 0's), and under overlapped scheduling rank 0's sampled ids
        into ``last_sampled``, where the next step's PENDING tokens are read. The logits stay here:
        rank 0 samples."""
        batch, host = self._gather(msg)
        self.run_model(batch, self._side_arrays(host))
        if batch.sample_mask.any():     # rank 0 sampled: it shares its ids
            self._share_sampled()

    def _share_sampled(self) -> None:
        """After a step that samples, under tensor parallelism with overlap: rank 0's ``last_sampled``
        into every rank's (every rank calls it at the same steps: the same rows sample on all)."""
        if self.tp is not None and self.overlap:
            self.tp.share_sampled(self.last_sampled)

    def _gather(self, msg: StepInput):
        if self.tp_driver is not None:   # tensor parallel: every rank applies the same changes
            self.tp_driver.send(msg)
        host = self.inputs.apply(msg)    # head-wise: [B, Hkv, width], rows by deltas
        batch = StepBatch(token_ids=host.token_ids, num_new=host.num_new, num_cached=host.num_cached,
                          block_tables=host.block_tables, is_prefill=host.is_prefill, sample_mask=host.sample_mask,
                          prompt_lens=host.prompt_lens if self.prompt_apart else None)
        return batch, host

    def run_model(self, batch: StepBatch, side: SideArrays | None = None, kv_caches=None,
                  logits_rows: int | None = None):
        """The one model call of every step: metadata and ``side`` arrays in one upload, overlapped
        scheduling's pending input ids filled on the device, then a captured decode graph or
        ``_forward_meta``. Serves the engine's steps (``forward_step``, ``launch``) and the memory
        profile's dummy steps (their own ``kv_caches``, eager, with the logits of ``logits_rows``
        rows: the sampling rows repeated). Returns (logits [rows, vocab], meta, side tensors)."""
        meta, dev = build_step(batch, self.plan.memory.block_size, self.device, self.key_windows, self.uploader,
                               side)
        if dev.pending_pos is not None:     # overlapped scheduling: tokens sampled by the step before
            ids = self.last_sampled.gather(0, dev.pending_slot)
            meta.input_ids.scatter_(0, dev.pending_pos, ids)
        if kv_caches is None and self.graphs is not None and self.graphs.can_run(meta):
            return self.graphs.run(meta), meta, dev       # decode: every row samples
        if self.share_rows:
            meta.share = build_share(batch, *self.share_rows, self.plan.memory.block_size, self.device,
                                     self.share_uploader)
        rows = meta.sample_indices
        if logits_rows is not None:
            rows = rows[torch.arange(logits_rows, dtype=torch.int64, device=self.device) % rows.shape[0]]
        return self._forward_meta(meta, kv_caches, rows), meta, dev

    def _forward_meta(self, meta: ForwardMeta, kv_caches=None, rows=None):
        """``backend.prepare`` once, every layer, and the logits of the token ``rows`` (all rows
        when None: a captured decode graph, where every row samples). CUDA-graph capture records
        this with the graphs' static meta."""
        # process state read by the model's GEMMs: set per call, so engines of both modes may
        # take turns in one process
        batch_invariant.set_enabled(self.cfg.deterministic)
        attended = meta if meta.share is None else meta.share.meta   # None: no rows of this rank's
        if attended is not None:
            self.backend.prepare(attended)
        hidden = self.model.forward(meta, self.kv_caches if kv_caches is None else kv_caches)
        return self.model.compute_logits(hidden if rows is None else hidden[rows])

    def forward_step(self, batch: StepBatch):
        """Metadata once, the model, and the logits of the sampling rows [rows, vocab] (float32). A
        batch built outside the scheduler (benchmarks, tests) goes to the tensor-parallel workers
        whole; engine steps send only the scheduler's changes (``_gather``)."""
        if self.tp_driver is not None:
            self.tp_driver.send(batch)
        return self.run_model(batch)[0]

    @staticmethod
    def _side_arrays(host) -> SideArrays:
        """The step's side arrays every rank uploads: overlapped scheduling's PENDING input tokens."""
        side = SideArrays()
        if len(host.pending_pos):
            side.pending_pos, side.pending_slot = host.pending_pos, host.pending_slot
        return side

    def launch(self, msg: StepInput) -> "LaunchedStep":
        """Enqueue one step (inputs, model, sampler, and the start of the one read) without waiting.
        Under tensor parallelism the launch and the read run in the driver's guard: a dead worker
        becomes a TensorParallelError, not a wait on a collective."""
        guard = self.tp_driver.guard if self.tp_driver is not None else contextlib.nullcontext
        with guard():
            step = self._launch(msg)
        step.guard = guard
        return step

    def _launch(self, msg: StepInput) -> "LaunchedStep":
        batch, host = self._gather(msg)
        rows = np.flatnonzero(batch.sample_mask)
        sb = None
        side = self._side_arrays(host)
        num_rows = len(msg.scheduled)
        if len(rows):
            reqs = host.requests
            # the rows' requests by a host loop (list indexing by numpy scalars costs more per row)
            reqs = [r for r, m in zip(reqs, batch.sample_mask) if m] if len(rows) < num_rows else reqs
            sb = self.sampling_builder.build(reqs, self.eos_token_ids, self.arch.vocab_size, host.slots[rows],
                                             self.penalties.ledger)
            side.sampler = sampler.device_arrays(sb)
            side.sample_slots = host.slots[rows]
        logits, _, dev = self.run_model(batch, side)
        if sb is None:
            return LaunchedStep(num_rows, rows, None, None)
        packed, ids = sampler.sample_step_ids(logits, sb, dev.sampler, self.penalties)
        self.last_sampled.scatter_(0, dev.sample_slots, ids)
        self._share_sampled()
        return LaunchedStep(num_rows, rows, sb, self.reader.start(packed))

    def close(self) -> None:
        """Stop the tensor-parallel workers, and leave the batch-invariant switch off (the mode is
        this engine's, not the process's: code that runs the model's layers outside an engine
        afterwards gets the default products)."""
        batch_invariant.set_enabled(False)
        if self.tp_driver is not None:
            self.tp_driver.close()
            self.tp_driver = None

    def execute(self, msg: StepInput) -> StepResult:
        """Run one step: the sampled token (and logprobs where asked) of each scheduled row."""
        return self.launch(msg).result()


@dataclass
class LaunchedStep:
    """A step on the device; ``result()`` does the step's one read (waiting for it)."""

    num_rows: int
    rows: np.ndarray
    sampling: SamplingBatch | None
    read: PendingRead | None
    guard: Callable = contextlib.nullcontext   # the launch's (tensor parallel: the driver's)

    def result(self) -> StepResult:
        result = StepResult(np.full(self.num_rows, -1, dtype=np.int64), [None] * self.num_rows)
        if self.sampling is None:
            return result
        with self.guard():
            host = sampler.read_to_host(self.read)   # the one read of the step
        token_ids, logprobs = unpack(host, self.sampling)
        result.token_ids[self.rows] = token_ids
        # host numpy indices (the sampling batch's and the scheduler's): no device read here
        for r in self.sampling.logprob_rows:      # the other rows' logprobs stay None
            result.logprobs[self.rows[r]] = logprobs[r]
        return result
