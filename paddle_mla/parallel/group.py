"""The tensor-parallel group of one engine: process-group set-up and the model's collectives.

torch.distributed only (NCCL on GPUs, gloo on CPU); the paddle runtime has no path here yet, so
``parallel.tensor_parallel_size`` > 1 is refused there (config validation and ``launcher``).

The latent cache is replicated: every rank holds the whole MLA latent cache of every request, as
vLLM does for MLA under TP. MLA's cache is one ``kv_lora_rank + qk_rope_head_dim`` vector per
token shared by all heads, so splitting the heads cannot split the cache; each rank computes the
same latent (``kv_a_proj_with_mqa`` is replicated) and writes it into its own copy, with the same
block ids, so the scheduler, block tables and prefix cache stay those of one engine. The cost is
cache memory that does not shrink with N (the weights do). Under ``parallel.attention_split: rows``
the cache stays replicated but each rank reads only its rows' part of it
(``paddle_mla.attention.row_share``); splitting its memory by request too, as SGLang's
DP-attention does, would need a scheduler and a block pool per rank.
"""

from __future__ import annotations

import gc
import os
import threading
from datetime import timedelta

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from paddle_mla.models.sharding import split_range, vocab_chunk  # noqa: E402
from paddle_mla.parallel.worker import Rendezvous  # noqa: E402

# torch >= 2.13 names it all_gather_single; the GPU machine's torch 2.11 has only the old name
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# aborts every communicator of the process (NCCL: ncclCommAbort, local; gloo: closes its pairs);
# older torch without it: destroy, which then only runs once no peer is left to wait for
_ABORT_ALL = getattr(dist.distributed_c10d, "_abort_process_group", None) or dist.destroy_process_group


def master_store(size: int, timeout_s: float = 120.0):
    """Rank 0's store on a free port (the OS picks it, so no race between engines)."""
    return dist.TCPStore("127.0.0.1", 0, size, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class TPGroup:
    """Rank ``rank`` of ``size``: the collectives the sharded model calls (in the same order on
    every rank, CUDA-graph capturable on NCCL).

    ``expert_parallel``: the loader places the routed experts whole on the ranks. Tokens need no
    dispatch: after the attention all-reduce every rank holds every token, so each rank runs its
    own experts on the tokens routed to them, and the block's one all-reduce (routed + shared
    partials, as under TP) is the combine. An all-to-all would only move tokens a rank already has
    (it pays where ranks hold different tokens, which they never do here: under ``attention_rows``
    too the attention outputs are gathered to every rank before the MLP).

    ``attention_rows`` (``parallel.attention_split: rows``, MLA): each rank attends its share of the
    step's tokens with all heads (``paddle_mla.attention.row_share``) and ``gather_rows`` puts the
    shares together on every rank, in place of the o_proj all-reduce."""

    def __init__(self, rank: int, size: int, device_kind: str, threads_before: int | None = None,
                 expert_parallel: bool = False, attention_rows: bool = False):
        self.rank, self.size, self.device_kind = rank, size, device_kind
        self.expert_parallel, self.attention_rows = expert_parallel, attention_rows
        self._threads_before = threads_before
        self._open = True
        self._lock = threading.Lock()     # leave() from close and from atexit must abort once

    # -- set-up -----------------------------------------------------------------------------
    @staticmethod
    def join(rank: int, rdzv: Rendezvous, store=None, expert_parallel: bool = False,
             attention_rows: bool = False) -> "TPGroup":
        if rdzv.device_kind == "gpu":
            # NVLink multicast (NVLS) stays off, as the GPU machines require; NCCL reads it at init
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            torch.cuda.set_device(rank)
        threads_before = None
        if rdzv.device_kind == "cpu":
            # N ranks share the cores: each takes its share of intra-op threads, or their spinning
            # OpenMP threads starve each other (measured: a tiny CPU step 20 ms -> 1.2 s on 2 cores)
            threads_before = torch.get_num_threads()
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // rdzv.size))
        if store is None:
            store = dist.TCPStore(rdzv.host, rdzv.port, rdzv.size, False, timeout=timedelta(seconds=120))
        dist.init_process_group("nccl" if rdzv.device_kind == "gpu" else "gloo", store=store, rank=rank,
                                world_size=rdzv.size, timeout=timedelta(seconds=rdzv.timeout_s))
        return TPGroup(rank, rdzv.size, rdzv.device_kind, threads_before, expert_parallel, attention_rows)

    def leave(self, runner=None, drain: bool = False) -> None:
        """Leave the group without waiting on any peer: drop ``runner``'s CUDA graphs (their captured
        collectives hold the communicator), then abort the communicator.

        Abort, not destroy: NCCL's destroy waits for every rank to destroy too, so a rank that
        destroys while a peer is gone, or before the peer gets there, hangs. Shutdown is ordered
        instead (the workers leave first, then rank 0), and each rank's abort is local.
        ``drain``: finish this rank's queued work first; only where its peers are known to have run
        the matching collectives (a worker after rank 0's goodbye), or the wait could be endless."""
        if drain:
            _runtime.synchronize()  # no graph is freed while it still runs
        if runner is not None and getattr(runner, "graphs", None) is not None:
            runner.graphs = None
            gc.collect()            # the graphs' executables are freed now, before the communicator
        with self._lock:
            if self._open and dist.is_initialized():
                self._open = False
                try:
                    _ABORT_ALL()
                except Exception:  # noqa: BLE001 - a communicator already broken by a dead peer
                    pass
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def abort(self) -> None:
        """Best effort, from the watchdog thread: unblock collectives waiting on a dead rank (NCCL
        kernels spin otherwise). ``leave`` still runs at close."""
        try:
            backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
            backend.abort()
        except Exception:  # noqa: BLE001 - nothing more to do; the launcher's watchdog exits
            pass

    def agree_min(self, value: int) -> int:
        """The smallest ``value`` over the ranks (e.g. KV blocks: free memory differs per GPU)."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.cpu()[0])

    def _device(self) -> str:
        return _runtime.device_string(self.device_kind)

    # -- the model's collectives ------------------------------------------------------------
    def all_reduce(self, x):
        """Sum of the ranks' partial ``x`` (row-parallel outputs), in place."""
        dist.all_reduce(x)
        return x

    def gather_rows(self, local, num_rows: int):
        """Every rank's ``local`` [chunk, hidden] share of the step's token rows (rank r holds rows
        [r * chunk, (r + 1) * chunk); the last ranks' shares padded) -> the first ``num_rows`` rows,
        in order, on every rank."""
        out = torch.empty(self.size * local.shape[0], *local.shape[1:], dtype=local.dtype, device=local.device)
        _ALL_GATHER(out, local.contiguous())
        return out[:num_rows]

    def share_sampled(self, ids):
        """Rank 0's ``last_sampled`` into every rank's, in stream order: under overlapped scheduling a
        worker's decode rows take their input tokens from it on the device, as rank 0's do."""
        dist.broadcast(ids, src=0)
        return ids

    def vocab_range(self, vocab_size: int) -> tuple[int, int]:
        return split_range(vocab_size, self.rank, self.size)

    def embed(self, ids, weight, start: int):
        """Vocab-parallel lookup: rows of ids in this rank's [start, start + rows), zeros elsewhere,
        then summed over the ranks (each id is found on exactly one rank)."""
        local = ids - start
        inside = (local >= 0) & (local < weight.shape[0])
        h = F.embedding(torch.where(inside, local, torch.zeros_like(local)), weight)
        return self.all_reduce(h * inside.unsqueeze(-1).to(h.dtype))

    def pad_vocab_rows(self, weight, vocab_size: int):
        """An LM-head shard padded with zero rows to the common chunk, so the gather is uniform."""
        chunk = vocab_chunk(vocab_size, self.size)
        if weight.shape[0] == chunk:
            return weight
        pad = torch.zeros(chunk - weight.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
        return torch.cat([weight, pad], 0)

    def gather_vocab(self, local, vocab_size: int):
        """[rows, chunk] logits of each rank -> [rows, vocab_size] on every rank."""
        rows, chunk = local.shape
        out = torch.empty(self.size * rows, chunk, dtype=local.dtype, device=local.device)
        _ALL_GATHER(out, local.contiguous())
        return out.view(self.size, rows, chunk).permute(1, 0, 2).reshape(rows, self.size * chunk)[:, :vocab_size]
