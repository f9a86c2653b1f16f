"""The ``dsa`` backend: DeepSeek-V3.2 sparse attention with Triton kernels.

Per layer:
1. ``index_topk``: write the new indexer keys into the paged key cache (same slots as the latent
   cache), score every new token against its request's keys straight from that cache
   (``index_kernels.index_scores``; windows ``[ks, ke)`` from ``ForwardMeta`` in prefill steps,
   positions in pure decode), then the top-k request positions per token (-1 padded).
2. ``forward``: write the latents, turn the top-k positions into cache slots through the block
   table, absorb W_UK into the queries, run sparse MLA over the selected slots (split over the
   top-k axis + merge) and apply W_UV. Prefill and decode tokens take the same path: a token with
   no more than ``index_topk`` keys selects all of them, which is dense causal attention.
Decode workspaces are sized on the first call for ``max_num_seqs`` rows and ``max_model_len``
columns, so decode steps are captured as CUDA graphs; a step with prefill tokens allocates its
own once, in its first layer (its score matrix is [T, max_seqlen_k] fp32).
"""

from __future__ import annotations

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla import runtime
from paddle_mla.attention.backend import MLABackend, MLADims, register_backend
from paddle_mla.attention.dsa.index_kernels import index_scores, positions_to_slots
from paddle_mla.attention.dsa.topk_select import topk_scratch_shape, topk_select
from paddle_mla.attention.dsa.sparse_mla import partial_rows, sparse_config, sparse_mla
from paddle_mla.attention.triton_mla.cache_write import write_latent_cache


@register_backend("dsa")
class DSABackend(MLABackend):
    def __init__(self, dims: MLADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str, dtype,
                 max_num_batched_tokens: int = 0):
        super().__init__(dims, max_num_seqs, max_model_len, block_size, device, dtype, max_num_batched_tokens)
        ok, why = runtime.supports_triton_on("cpu" if device == "cpu" else "gpu")
        if not ok:
            raise RuntimeError(f"attention.backend 'dsa' cannot run here: {why}; use backend 'native'")
        self._decode_ws = None
        self.sparse_cfg = sparse_config(dims.num_heads)

    def _workspace(self, meta, rows: int, topk: int, width: int):
        """Decode: the start-up workspace. Steps with prefill tokens: one per step, made by the first
        layer and kept in ``meta.attn`` for the others (never one per layer)."""
        if meta.is_decode_only:
            if self._decode_ws is None or self._decode_ws["topk"] != topk:
                self._decode_ws = self._alloc(self.max_num_seqs, topk, self.max_model_len)
                self._decode_ws["topk"] = topk
            return self._decode_ws
        ws = meta.attn.get("dsa_ws")
        if ws is None or ws["topk"] != topk:
            ws = self._alloc(rows, topk, width)
            ws["topk"] = topk
        return ws

    def _alloc(self, rows: int, topk: int, width: int):
        d, dev = self.dims, self.device
        split_rows = partial_rows(rows, d.num_heads, topk, self.sparse_cfg)   # merge workspace: rows x splits
        return {
            "scores": torch.empty(rows, width, dtype=torch.float32, device=dev),
            "pos": torch.empty(rows, topk, dtype=torch.int64, device=dev),
            "topk_scratch": torch.zeros(topk_scratch_shape(rows, topk), dtype=torch.int32, device=dev),
            "topk_fallbacks": torch.zeros(1, dtype=torch.int32, device=dev),   # rows whose sample missed
            "slots": torch.empty(rows, topk, dtype=torch.int64, device=dev),
            "part_o": torch.empty(max(split_rows, 1) * d.num_heads * d.kv_lora_rank, dtype=torch.float32, device=dev),
            "part_lse": torch.empty(max(split_rows, 1) * d.num_heads, dtype=torch.float32, device=dev),
            "o_lat": torch.empty(rows, d.num_heads, d.kv_lora_rank, dtype=self.dtype, device=dev),
        }

    def index_topk(self, q, k, w, index_cache, meta, topk: int):
        T = q.shape[0]
        decode = meta.is_decode_only
        if not decode and (meta.index_ks is None or meta.index_ke is None):
            raise ValueError("dsa: a step with prefill tokens needs meta.index_ks/index_ke "
                             "(ForwardMeta.build(..., key_windows=KeyWindows(...)))")
        # decode: one width for every step (a captured graph replays one launch); the kernels follow
        # each row's own length, so the unused columns cost nothing
        width = self.max_model_len if decode else meta.max_seqlen_k
        ws = meta.attn["dsa_ws"] = self._workspace(meta, T, topk, width)
        write_latent_cache(k, index_cache, meta.slot_mapping)
        windows = {} if decode else dict(ks=meta.index_ks, ke=meta.index_ke, cu_seqlens_k=meta.cu_seqlens_k)
        scores = index_scores(q, w, index_cache, meta.block_tables, meta.batch_id_per_token, meta.positions,
                              width, ws["scores"], **windows)
        return topk_select(scores, topk, ws["pos"], meta.batch_id_per_token, meta.positions, **windows,
                           scratch=ws["topk_scratch"], fallbacks=ws["topk_fallbacks"])

    def forward(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta, topk_pos=None):
        if topk_pos is None:
            raise ValueError("attention.backend 'dsa' runs deepseek_v32 checkpoints only (no top-k given); "
                             "use triton_mla for other MLA models")
        d = self.dims
        write_latent_cache(latent, kv_cache, meta.slot_mapping)
        ws = meta.attn["dsa_ws"]
        slots = positions_to_slots(topk_pos, meta.batch_id_per_token, meta.block_tables, self.block_size, ws["slots"])
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1)            # [T, H, C]
        o_lat = sparse_mla(q_lat.contiguous(), q_pe, kv_cache, slots, d.softmax_scale, ws["part_o"],
                           ws["part_lse"], ws["o_lat"], self.sparse_cfg)
        return torch.bmm(o_lat.transpose(0, 1), w_vc).transpose(0, 1)
