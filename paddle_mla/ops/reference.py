"""Plain-tensor references of the per-step metadata ops (the step's metadata in docs/architecture.md).

They are the oracle for the compiled custom ops and the fallback when those are not built. Every
output size comes from host-known arguments, so none of them syncs the device.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch


def _batch_ids(cu_end, num_tokens: int):
    """Request index of each token t given inclusive cumsum ``cu_end`` [B]; -1 past the last token."""
    t = torch.arange(num_tokens, dtype=cu_end.dtype, device=cu_end.device)
    b = torch.searchsorted(cu_end.contiguous(), t, right=True)
    total = cu_end[-1:] if cu_end.numel() > 0 else torch.zeros(1, dtype=cu_end.dtype, device=cu_end.device)
    return torch.where(t < total, b, torch.full_like(b, -1))


def get_position_ids(seq_lens_encoder, seq_lens_decoder, seq_lens_this_time, num_tokens: int):
    """Positions of the step's tokens, int64 [num_tokens], zeros past the real tokens.

    A request with ``enc > 0`` new prompt tokens contributes ``enc`` tokens at positions
    ``dec + i``; a decoding request (enc == 0, dec > 0) contributes ``this`` tokens at ``dec + i``.
    """
    enc = seq_lens_encoder.to(torch.int64)
    dec = seq_lens_decoder.to(torch.int64)
    this = seq_lens_this_time.to(torch.int64)
    n = torch.where(enc > 0, enc, torch.where(dec > 0, this, torch.zeros_like(this)))
    if n.numel() == 0:
        return torch.zeros(num_tokens, dtype=torch.int64, device=enc.device)
    cu = torch.cumsum(n, dim=0)
    b = _batch_ids(cu, num_tokens)
    valid = b >= 0
    bc = b.clamp(min=0)
    t = torch.arange(num_tokens, dtype=torch.int64, device=enc.device)
    pos = dec[bc] + t - (cu[bc] - n[bc])
    return torch.where(valid, pos, torch.zeros_like(pos))


def get_cu_seqlens(seq_lens_this_time, seq_lens_decoder, num_tokens: int):
    """(cu_seqlens_q int32 [B+1], cu_seqlens_k int32 [B+1] counting cached tokens,
    batch_id_per_token int32 [num_tokens], -1 for padding)."""
    this = seq_lens_this_time.to(torch.int64)
    dec = seq_lens_decoder.to(torch.int64)
    zero = torch.zeros(1, dtype=torch.int64, device=this.device)
    cu_q = torch.cat([zero, torch.cumsum(this, dim=0)])
    cu_k = torch.cat([zero, torch.cumsum(this + dec, dim=0)])
    if this.numel() == 0:
        ids = torch.full((num_tokens,), -1, dtype=torch.int64, device=this.device)
    else:
        ids = _batch_ids(cu_q[1:], num_tokens)
    return cu_q.to(torch.int32), cu_k.to(torch.int32), ids.to(torch.int32)


def compute_slot_mapping(block_tables, batch_id_per_token, positions, block_size: int):
    """slot = block_tables[b, pos // B] * B + pos % B (int64); -1 where batch_id < 0."""
    b = batch_id_per_token.to(torch.int64)
    pos = positions.to(torch.int64)
    valid = b >= 0
    bc = b.clamp(min=0)
    col = pos // block_size
    if block_tables.numel() == 0:
        return torch.full_like(pos, -1)
    block = block_tables.to(torch.int64)[bc, col.clamp(max=block_tables.shape[1] - 1)]
    slots = block * block_size + pos % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1))
