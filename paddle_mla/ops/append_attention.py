"""The ``append_attention`` custom op: RoPE, paged K/V cache write and causal GQA attention in one
call per layer (contract: docs/append_attention.md; semantics: ``attention.gqa_reference``).

C++ on CPU tensors, CUDA on GPU tensors, both compiled by ``paddle_mla.ops.build`` (setup.py or first
use). Without a build that serves the tensors' device the call raises: the ``native`` backend is the
plain-tensor path (it hands the reference the scheduler's host lengths, so nothing is read back).

Beyond the contract's signature, keyword-only extras serve the GPU path. Two change nothing in the
result: ``workspace`` (fp32, ``workspace_numel(max_num_seqs, ...)`` elements, allocated once by
the backend so decode steps replay in CUDA graphs; without it a GPU call allocates one) and
``decode_only`` (every request has exactly one new token: the prefill kernel is not launched).
``batch_invariant`` (``deterministic: true``) sends every token, decode rows included, through the
prefill kernel, whose per-row sums walk key tiles from key 0 whatever shares the block (SWA heads
walk their whole row and mask): a row's bits then depend on its own query and keys alone, not on
the batch, the chunking or whether the step decodes. ``invariant_split`` (with it; a multiple of 64, 0:
none) cuts every row's keys at fixed offsets into segments folded in one order, so a decode step splits
each row over blocks as the default decode does (custom_ops/append_attention_segments.cuh). On CPU
every token already takes one loop.
"""

from __future__ import annotations

import torch

from paddle_mla.ops import build

# Splits of every row the workspace holds at max_num_seqs rows: kEqualMaxSplits in
# custom_ops/append_attention_decode_plan.cuh, the equal plan's most. The plan by length (the
# default) takes more when fewer rows decode; neither takes more than the workspace holds.
MAX_DECODE_SPLITS = 16


def workspace_numel(max_num_seqs: int, num_q_heads: int, head_dim: int) -> int:
    """fp32 elements of the decode workspace for up to ``max_num_seqs`` requests a step."""
    return max(1, max_num_seqs * num_q_heads * MAX_DECODE_SPLITS * (head_dim + 2))   # + (m, l) of a segment


def implementation(on_gpu: bool = False) -> str:
    """'custom_op' when the compiled op serves calls on that device, else 'reference'."""
    ops = build.load_ops()
    return "custom_op" if ops is not None and (ops.with_cuda or not on_gpu) else "reference"


def append_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_k, batch_id_per_token,
                     positions, cos_sin, out, *, softmax_scale: float, neox: bool, rot_dim: int,
                     num_swa_heads: int = 0, window: int = 0, sink: int = 0, swa_mask: bool = False,
                     workspace=None, decode_only: bool = False, batch_invariant: bool = False,
                     invariant_split: int = 0):
    """Writes the step's roped K/V into ``k_cache``/``v_cache`` and the attention output into ``out``
    ([T, Hq, D], dtype of q); returns ``out``. ``swa_mask``: SWA heads walk every key j <= p and mask
    those outside their window instead of skipping them (same outputs; the benchmarks' baseline)."""
    on_gpu = bool(q.is_cuda)
    if implementation(on_gpu) == "reference":
        why = build.unavailable_reason() or "the custom ops were built without CUDA (nvcc not found)"
        raise RuntimeError(f"the append_attention op is not built for {'GPU' if on_gpu else 'CPU'} tensors: {why}; "
                           "use attention.backend: native")
    if workspace is None:
        n = workspace_numel(int(seq_lens_k.shape[0]), int(q.shape[1]), int(q.shape[2])) if on_gpu else 0
        workspace = torch.empty(n, dtype=torch.float32, device=q.device)
    build.load_ops().append_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_k,
                                      batch_id_per_token, positions, cos_sin, out, workspace, float(softmax_scale),
                                      bool(neox), int(rot_dim), int(num_swa_heads), int(window), int(sink),
                                      bool(swa_mask), bool(decode_only), bool(batch_invariant),
                                      int(invariant_split))
    return out
