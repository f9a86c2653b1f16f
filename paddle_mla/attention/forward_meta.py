"""Per-step metadata, built ONCE per step by the model runner (docs/architecture.md, "One step, end to end").

Host-side lengths come from the scheduler (numpy); device tensors are computed by the metadata
custom ops (``paddle_mla.ops.metadata``) from small uploaded arrays. The arrays go up through an
``platform.staging.Uploader``: one pinned, non-blocking copy per step (with the runner's
``SideArrays``, which come back apart from the metadata), never a pageable ``.to(device)``. No layer
recomputes any of it, and nothing here reads a device tensor back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.ops import metadata as meta_ops


@dataclass
class StepBatch:
    """Host-side description of one step, in scheduler order (plain data)."""

    token_ids: np.ndarray        # int64 [T]: the new tokens of every request, concatenated
    num_new: np.ndarray          # int32 [B]: tokens computed this step per request
    num_cached: np.ndarray       # int32 [B]: tokens already in the KV cache (prefix hit + earlier chunks)
    block_tables: np.ndarray     # int32 [B, max_blocks]: physical block ids, -1 padded
    is_prefill: np.ndarray       # bool [B]: request is still consuming its prompt this step
    sample_mask: np.ndarray      # bool [B]: request samples a token after this step (last chunk or decode)
    # int32 [B]: each request's prompt length, for backends whose path depends on it (``prompt_apart``);
    # None: not gathered
    prompt_lens: np.ndarray | None = None


@dataclass
class SideArrays:
    """Host arrays that go up in the step's one copy beside the metadata but are not attention
    metadata: the sampler's per-row arrays and overlapped scheduling's pending tokens."""

    sampler: dict[str, np.ndarray] = field(default_factory=dict)   # worker.sampler.device_arrays
    sample_slots: np.ndarray | None = None   # int64 [sampling rows]: each row's slot (last sampled ids)
    pending_pos: np.ndarray | None = None    # int64: token rows whose id the step before samples
    pending_slot: np.ndarray | None = None   # int64: the slot each of them reads it from


@dataclass
class SideTensors:
    """``SideArrays`` on the device (None where the arrays were None)."""

    sampler: dict[str, Any] = field(default_factory=dict)
    sample_slots: Any = None
    pending_pos: Any = None
    pending_slot: Any = None


_SIDE_FIELDS = ("sample_slots", "pending_pos", "pending_slot")


@dataclass
class MLAStepPlan:
    """What an MLA backend's ``prepare`` decides once per step (``triton_mla``, ``dsa``): which extend
    rows run through the absorbed decode kernel (``short_split``: a ``ShortSplit``) and the extend
    kernels' plan for the rest (``extend_plan``: an ``ExtendPlan``); for ``dsa``, the first row of a
    dense tail (``dense_from``: None when the step runs sparse) and the step's sparse workspace
    (``dsa_ws``, made by its first layer). Empty in decode-only steps."""
    short_split: Any = None
    extend_plan: Any = None
    segments: Any = None     # ``triton_mla`` under the mode: the prompt rows' ``SegmentPlan``
    dense_from: int | None = None
    dsa_ws: dict | None = None


@dataclass
class GQAStepPlan:
    """What the ``native`` GQA backend's ``prepare`` computes once per step: the query offsets on the host."""
    cu_seqlens_q_host: np.ndarray


@dataclass
class ForwardMeta:
    num_reqs: int
    num_tokens: int
    block_size: int
    # host side, known from the scheduler
    seq_lens_q: np.ndarray
    num_cached: np.ndarray
    seq_lens_k: np.ndarray
    max_seqlen_q: int
    max_seqlen_k: int
    is_decode_only: bool
    sample_mask: np.ndarray
    # device side
    input_ids: Any               # int64 [T]
    positions: Any               # int64 [T]: num_cached + i for the i-th new token
    cu_seqlens_q: Any            # int32 [B+1]
    cu_seqlens_k: Any            # int32 [B+1]: counts the cached prefix
    batch_id_per_token: Any      # int32 [T]
    slot_mapping: Any            # int64 [T]
    block_tables: Any            # int32 [B, max_blocks]
    seq_lens_k_dev: Any          # int32 [B]
    logits_indices: Any          # int64 [B]: row of each request's last new token
    attn: MLAStepPlan | GQAStepPlan | None = None   # the backend's step plan: backend.prepare(meta), once
    # deepseek_v32 indexer: each token's key window [ks, ke) in the step's concatenated gathered keys
    # (int32 [T]); None in pure-decode steps and for models without an indexer
    index_ks: Any = None
    index_ke: Any = None
    # the leading rows with one new token each (the scheduler puts decodes first): attention runs
    # them through the decode kernel, and only the rows after them through extend
    num_decode_reqs: int = 0
    num_decode_tokens: int = 0
    sample_indices: Any = None   # int64 [sampling rows]: token row of each sampling request's last new token
    prompt_lens: np.ndarray | None = None   # host int32 [B] (``StepBatch.prompt_lens``)
    # parallel.attention_split: rows: this rank's share of the token rows and its attention metadata
    # (``attention.row_share.RowShare``); None: the step is attended whole
    share: Any = None
    # a share's metadata: the model wrote every latent of the step already, so the backend only attends
    latents_written: bool = False

    @staticmethod
    def build(batch: StepBatch, block_size: int, device: str, key_windows: Any = None,
              uploader: Any = None) -> "ForwardMeta":
        """The step's metadata (``build_step`` without side arrays)."""
        return build_step(batch, block_size, device, key_windows, uploader)[0]


def build_step(batch: StepBatch, block_size: int, device: str, key_windows: Any = None, uploader: Any = None,
               side: SideArrays | None = None) -> tuple[ForwardMeta, SideTensors]:
    """The step's metadata and its ``side`` arrays on the device, all in one upload.
    ``key_windows`` (``attention.dsa.key_window.KeyWindows``, deepseek_v32): fills ``index_ks``/
    ``index_ke`` with one kernel launch, skipped when the step is pure decode. ``uploader``
    (``platform.staging.Uploader``; a throwaway one when None) carries the step's arrays."""
    if uploader is None:
        from paddle_mla.platform.staging import Uploader

        uploader = Uploader(device)
    num_new = batch.num_new.astype(np.int32, copy=False)
    num_cached = batch.num_cached.astype(np.int32, copy=False)
    seq_lens_k = num_cached + num_new
    num_tokens = int(num_new.sum())
    enc = np.where(batch.is_prefill, num_new, 0).astype(np.int32)
    last = np.cumsum(num_new, dtype=np.int64) - 1
    names = ["this", "dec", "enc", "tables", "ids", "lens_k", "last", "sample"]
    arrays = [num_new, num_cached, enc, batch.block_tables.astype(np.int32, copy=False),
              batch.token_ids.astype(np.int64, copy=False), seq_lens_k, last, last[batch.sample_mask]]
    side = side or SideArrays()
    riders: dict = {("sampler", k): v for k, v in side.sampler.items()}
    riders.update((k, a) for k in _SIDE_FIELDS if (a := getattr(side, k)) is not None)
    names += list(riders)
    arrays += list(riders.values())
    dev = dict(zip(names, uploader.commit([uploader.add(a) for a in arrays])))
    side_dev = SideTensors(sampler={k: dev[("sampler", k)] for k in side.sampler},
                           **{k: dev.get(k) for k in _SIDE_FIELDS})
    this_dev, dec_dev, enc_dev, tables_dev = dev["this"], dev["dec"], dev["enc"], dev["tables"]
    positions = meta_ops.get_position_ids(enc_dev, dec_dev, this_dev, num_tokens)
    cu_q, cu_k, batch_ids = meta_ops.get_cu_seqlens(this_dev, dec_dev, num_tokens)
    # slot_mapping serves the MLA caches; GQA's op writes K/V through the tables itself, so a
    # head-wise [B, Hkv, M] table gives it head 0's row only to keep the one shape it takes
    slot_tables = tables_dev if tables_dev.dim() == 2 else tables_dev[:, 0].contiguous()
    slots = meta_ops.compute_slot_mapping(slot_tables, batch_ids, positions, block_size)
    decode_only = bool(len(num_new) > 0 and (num_new == 1).all() and not batch.is_prefill.any())
    num_decode = leading_single_token_rows(num_new)
    ks = ke = None
    if key_windows is not None and not decode_only:
        ks, ke = key_windows.compute(cu_q, cu_k, dec_dev, batch_ids, num_tokens)
    return ForwardMeta(
        num_reqs=len(num_new),
        num_tokens=num_tokens,
        block_size=block_size,
        seq_lens_q=num_new,
        num_cached=num_cached,
        seq_lens_k=seq_lens_k,
        max_seqlen_q=int(num_new.max(initial=0)),
        max_seqlen_k=int(seq_lens_k.max(initial=0)),
        is_decode_only=decode_only,
        sample_mask=batch.sample_mask,
        input_ids=dev["ids"],
        positions=positions,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        batch_id_per_token=batch_ids,
        slot_mapping=slots,
        block_tables=tables_dev,
        seq_lens_k_dev=dev["lens_k"],
        logits_indices=dev["last"],
        index_ks=ks,
        index_ke=ke,
        num_decode_reqs=num_decode,
        num_decode_tokens=num_decode,
        sample_indices=dev["sample"],
        prompt_lens=batch.prompt_lens,
    ), side_dev


def leading_single_token_rows(num_new: np.ndarray) -> int:
    """How many rows at the head of the batch compute exactly one token (host numpy)."""
    other = np.flatnonzero(num_new != 1)
    return int(other[0]) if len(other) else len(num_new)
