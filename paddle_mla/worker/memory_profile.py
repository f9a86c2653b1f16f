"""The KV cache sized by a profile run (GPU, ``cache.num_blocks: auto``).

Before the cache exists, one dummy prefill step at ``max_num_batched_tokens`` runs through the real
model and attention backend (metadata, ``prepare``, every layer, the logits of ``max_num_seqs``
rows) and the allocator's peak is read. With CUDA graphs, one dummy decode step at
``max_num_seqs`` rows measures what the largest captured graph keeps in its private pool (graphs are
captured after the cache, so their memory is reserved up front). The cache then gets

    gpu_memory_utilization x total - weights - peak activations - sampler - graph pools - non-torch

where "weights" is every tensor allocated before the profile (weights and start-up workspaces),
"non-torch" is GPU memory the runtime's allocator does not hold (CUDA context, libraries, other
processes), and the sampler's work on the logits of ``max_num_seqs`` rows is an estimate
(``SAMPLER_LOGITS_COPIES``). One block at start-up on stderr gives each figure in GiB. On CPU the
fixed budget of ``kv_cache.auto_num_blocks`` stays.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

from paddle_mla.attention.forward_meta import StepBatch  # noqa: E402
from paddle_mla.cache.kv_cache import allocate_index_caches, allocate_kv_caches, usable_num_blocks  # noqa: E402

GiB = float(1 << 30)
# The sampler works on fp32 logits [max_num_seqs, vocab]: probabilities, sorted values and int64 sort
# indices (two fp32-sized copies) for top-k / top-p: four copies of the logits at most.
SAMPLER_LOGITS_COPIES = 4
# CUDA graph executables, and what a replay allocates outside the measured eager decode step.
GRAPH_MARGIN_BYTES = 256 << 20


@dataclass
class MemoryProfile:
    total: int                 # bytes of the GPU
    utilization: float         # cache.gpu_memory_utilization
    weights: int               # tensors allocated before the profile run (weights + start-up workspaces)
    activations: int           # peak over the dummy prefill step, above the weights and the dummy cache
    sampler: int               # estimate: SAMPLER_LOGITS_COPIES x fp32 logits of max_num_seqs rows
    graph_pools: int           # dummy decode step's peak + logits kept by the smaller graphs + margin (0: no graphs)
    non_torch: int             # used GPU memory that the runtime's allocator does not hold
    kv_cache: int              # what is left for the KV cache
    per_block: int             # bytes of one KV block over all layers
    num_blocks: int            # blocks allocated: kv_cache // per_block, at most what the engine can use
    usable_blocks: int         # max_num_seqs x blocks of max_model_len (+1): more would never be used
    prefill_tokens: int
    prefill_rows: int
    decode_rows: int

    @property
    def budget(self) -> int:
        return int(self.total * self.utilization)

    def report(self) -> str:
        g = lambda b: f"{b / GiB:8.2f}"   # noqa: E731
        cap = (f" (capped: max_num_seqs x max_model_len needs only {self.usable_blocks})"
               if self.num_blocks == self.usable_blocks and self.kv_cache // self.per_block > self.usable_blocks
               else "")
        graphs = (f"dummy decode of {self.decode_rows} rows + smaller graphs' logits + "
                  f"{GRAPH_MARGIN_BYTES / GiB:.2f} margin" if self.graph_pools else "no CUDA graphs")
        return "\n".join([
            "paddle_mla: KV cache sized by a profile run (GiB)",
            f"  GPU total               {g(self.total)} x gpu_memory_utilization {self.utilization:.2f} = "
            f"{g(self.budget).strip()}",
            f"  - weights, workspaces   {g(self.weights)}  tensors allocated before the profile run",
            f"  - peak activations      {g(self.activations)}  dummy prefill of {self.prefill_tokens} tokens in "
            f"{self.prefill_rows} row(s) + logits of {self.decode_rows} rows",
            f"  - sampler (estimate)    {g(self.sampler)}  {SAMPLER_LOGITS_COPIES} x fp32 logits of "
            f"{self.decode_rows} rows",
            f"  - CUDA graph pools      {g(self.graph_pools)}  {graphs}",
            f"  - non-torch memory      {g(self.non_torch)}  CUDA context, libraries, other processes",
            f"  = KV cache              {g(self.kv_cache)}  -> {self.num_blocks} blocks of "
            f"{self.per_block / 2**20:.2f} MiB{cap}",
        ])


def dummy_prefill_batch(num_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int,
                        vocab_size: int) -> StepBatch:
    """``num_tokens`` new tokens as prompts of up to ``max_model_len`` tokens (at most ``max_num_seqs``
    rows). Every row's block table points at the same blocks: their contents do not matter here,
    and the dummy cache stays one sequence long."""
    row_len = max(1, min(num_tokens, max_model_len))
    rows = max(1, min(max_num_seqs, -(-num_tokens // row_len)))
    total = min(num_tokens, rows * row_len)
    lens = np.full(rows, row_len, dtype=np.int32)
    lens[-1] = total - row_len * (rows - 1)
    width = -(-row_len // block_size)
    return StepBatch(token_ids=np.arange(total, dtype=np.int64) % vocab_size, num_new=lens,
                     num_cached=np.zeros(rows, dtype=np.int32),
                     block_tables=np.tile(np.arange(width, dtype=np.int32), (rows, 1)),
                     is_prefill=np.ones(rows, dtype=bool), sample_mask=np.ones(rows, dtype=bool))


def head_wise_tables(batch: StepBatch, num_kv_heads: int) -> StepBatch:
    """``batch`` with each uniform table row given to every KV head: [B, Hkv, M]."""
    return dataclasses.replace(batch, block_tables=np.repeat(batch.block_tables[:, None, :], num_kv_heads, 1))


def dummy_decode_batch(rows: int, vocab_size: int) -> StepBatch:
    """``rows`` decodes of one token after one cached token, all in block 0."""
    return StepBatch(token_ids=np.arange(rows, dtype=np.int64) % vocab_size, num_new=np.ones(rows, dtype=np.int32),
                     num_cached=np.ones(rows, dtype=np.int32), block_tables=np.zeros((rows, 1), dtype=np.int32),
                     is_prefill=np.zeros(rows, dtype=bool), sample_mask=np.ones(rows, dtype=bool))


def run_dummy_step(runner, batch: StepBatch, caches, logits_rows: int):
    """One step through ``runner.run_model`` (eager, on the dummy ``caches``), with the logits of
    ``logits_rows`` rows."""
    return runner.run_model(batch, kv_caches=caches, logits_rows=logits_rows)[0]


def _peak_above(base: int, fn) -> int:
    _runtime.synchronize()
    _runtime.reset_peak_memory()
    out = fn()
    _runtime.synchronize()
    peak = _runtime.max_memory_allocated() - base
    del out
    return max(0, peak)


def profile_kv_cache(runner, per_block: int, max_model_len: int, index_dim: int, use_graphs: bool) -> MemoryProfile:
    """Run the profile for ``runner`` (a ``ModelRunner`` whose model, backend, key windows and step
    inputs exist and whose caches do not) and size the KV cache; prints the figures to stderr."""
    cfg, arch, bs = runner.cfg, runner.arch, runner.cfg.cache.block_size
    sc = cfg.scheduler
    vocab = arch.vocab_size
    usable_blocks = usable_num_blocks(sc.max_num_seqs, max_model_len, bs)
    _runtime.synchronize()
    _runtime.empty_cache()
    weights = _runtime.memory_allocated()
    prefill = dummy_prefill_batch(sc.max_num_batched_tokens, sc.max_num_seqs, max_model_len, bs, vocab)
    decode = dummy_decode_batch(sc.max_num_seqs, vocab)
    nblk = prefill.block_tables.shape[1]
    heads = runner._table_heads()
    if heads:    # head-wise SWA: the op reads [B, Hkv, M] tables every step; profile that path
        prefill, decode = head_wise_tables(prefill, heads), head_wise_tables(decode, heads)
    caches = allocate_kv_caches(arch, nblk, bs, runner.dtype, runner.device, runner.plan.kv.fp8)
    if index_dim:
        runner.model.attach_index_caches(allocate_index_caches(arch.num_layers, nblk, bs, index_dim, runner.dtype,
                                                               runner.device))
    _runtime.synchronize()
    base = _runtime.memory_allocated()

    def step(batch):
        return lambda: run_dummy_step(runner, batch, caches, sc.max_num_seqs)

    try:
        activations = _peak_above(base, step(prefill))
        graph_pools = 0
        if use_graphs:
            from paddle_mla.worker.plan import capture_sizes

            smaller = sum(capture_sizes(sc.max_num_seqs)) - sc.max_num_seqs
            graph_pools = _peak_above(base, step(decode)) + smaller * vocab * 4 + GRAPH_MARGIN_BYTES
    except Exception as exc:   # noqa: BLE001 - the runtimes raise different OOM types; others re-raised as is
        if "out of memory" not in str(exc).lower() and not isinstance(exc, MemoryError):
            raise
        raise RuntimeError(f"the profile run (a prefill step of scheduler.max_num_batched_tokens="
                           f"{sc.max_num_batched_tokens} tokens) ran out of GPU memory before the KV cache was "
                           "allocated; lower scheduler.max_num_batched_tokens") from exc
    finally:
        if index_dim:
            runner.model.attach_index_caches([None] * arch.num_layers)
        del caches
    _runtime.synchronize()
    _runtime.empty_cache()
    free, total = _runtime.gpu_memory_info()
    non_torch = max(0, (total - free) - _runtime.memory_reserved())
    sampler = SAMPLER_LOGITS_COPIES * sc.max_num_seqs * vocab * 4
    kv = int(total * cfg.cache.gpu_memory_utilization) - weights - activations - sampler - graph_pools - non_torch
    prof = MemoryProfile(total=total, utilization=cfg.cache.gpu_memory_utilization, weights=weights,
                         activations=activations, sampler=sampler, graph_pools=graph_pools, non_torch=non_torch,
                         kv_cache=kv, per_block=per_block, num_blocks=int(min(max(kv, 0) // per_block, usable_blocks)),
                         usable_blocks=usable_blocks, prefill_tokens=int(prefill.num_new.sum()),
                         prefill_rows=len(prefill.num_new), decode_rows=sc.max_num_seqs)
    print(prof.report(), file=sys.stderr, flush=True)
    if prof.num_blocks < 1:
        raise RuntimeError(f"no memory left for the KV cache after the profile run:\n{prof.report()}\n"
                           "lower scheduler.max_num_batched_tokens or max_num_seqs, or raise "
                           "cache.gpu_memory_utilization")
    return prof
