"""DeepSeek MoE layer: the checkpoint's routing rule, then routed experts (+ shared experts).

Two implementations of the same sum:
  - ``triton``: the fused MoE (models/fused_moe/kernels.py): only the selected (token, expert) pairs
    are computed, no host sync, CUDA-graph safe; the workspace is sized once (``MoEExec.reserve``,
    from scheduler.max_num_batched_tokens);
  - ``reference``: plain tensors. On CPU only the chosen experts run, each over its own tokens
    (``routed_moe_chosen``: the routing is read on the host, which costs nothing where host and
    device memory are one). Elsewhere (``PADDLE_MLA_MOE=reference`` on a GPU) the sync-free masked
    form (fused_moe/reference.py: every expert over every token, E / top_k times the FLOPs), which
    is also the kernels' oracle.
Expert parallel (``parallel.expert_parallel``): the loader gives a rank its contiguous range of
experts, stacked from row 0, and ``<prefix>experts.first``; routed ids are shifted by it, so ids of
other ranks' experts match no row and add nothing (the block's all-reduce sums the ranks).
FP8 experts (``Fp8Weight``, kept by the loader when quantization keeps FP8): the triton path runs
them w8a8 (128x128 weight blocks, activations quantized per token in groups of 128); anything else
(the reference, other block sizes) gets them dequantized once, at construction (``MoE.__init__``).
``auto`` (default) picks triton when the layer's tensors are on a GPU that Triton can drive; env
``PADDLE_MLA_MOE=reference|triton|auto`` overrides it (tests, benchmarks).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import torch.nn.functional as F

from paddle_mla.platform import runtime
from paddle_mla.platform.staging import host_values
from paddle_mla.ops import batch_invariant
from paddle_mla.models.arch import ModelArch, MoESpec
from paddle_mla.models.fp8 import Fp8Weight, per_token_group_quant
from paddle_mla.models.fused_ops import route_topk
from paddle_mla.models.fused_moe.reference import routed_moe_reference

MOE_IMPLS = ("auto", "reference", "triton")
# the most tokens a call runs the shared experts folded in (``MoE.folds_shared``): at 64 rows the
# folded layer took 0.93-1.00x the separate one on an H200 (V2-Lite and V3 dims, TP 1 and 2), at
# 128 rows 0.99-1.05x, at 256 rows up to 1.08x (BENCHMARKS.md, "Shared experts folded into the fused MoE")
FOLD_MAX_TOKENS = 64


def select_moe_impl(device_kind: str) -> str:
    """'reference' or 'triton' for tensors on ``device_kind`` ('cpu' | 'gpu'), honouring PADDLE_MLA_MOE."""
    want = os.environ.get("PADDLE_MLA_MOE", "auto").lower()
    if want not in MOE_IMPLS:
        raise ValueError(f"PADDLE_MLA_MOE must be one of {', '.join(MOE_IMPLS)}, got {want!r}")
    ok, why = runtime.supports_triton_on(device_kind)
    if want == "triton":
        if not ok:
            raise RuntimeError(f"PADDLE_MLA_MOE=triton cannot run on {device_kind}: {why}")
        return "triton"
    if want == "reference":
        return "reference"   # tests and benchmarks only: on a GPU it computes every expert for every token
    if device_kind == "gpu" and not ok:
        raise RuntimeError(f"the routed MoE on a GPU needs the Triton kernels ({why}); the plain-tensor "
                           "reference would compute every expert for every token")
    return "triton" if device_kind == "gpu" else "reference"


class MoEExec:
    """How a model's MoE layers run: the implementation and the one workspace they share."""

    def __init__(self, device: str, dtype: Any):
        self.device, self.dtype = device, dtype
        self.impl = select_moe_impl("cpu" if device == "cpu" else "gpu")
        self.workspace = None

    def reserve(self, max_tokens: int, top_k: int, num_experts: int, inter: int, hidden: int,
                fp8: bool = False, chunk_tokens: int = 8192) -> None:
        """Size the fused MoE workspace once, at start-up (no-op for the reference)."""
        if self.impl != "triton":
            return
        from paddle_mla.models.fused_moe.kernels import MoEWorkspace   # imports Triton

        self.workspace = MoEWorkspace(max_tokens, top_k, num_experts, inter, hidden, self.dtype, self.device,
                                      fp8=fp8, chunk_tokens=chunk_tokens)

    def run(self, x, w_gate, w_up, w_down, topk_ids, topk_weights, n_routed: int | None = None,
            max_top_k: int | None = None):
        """Routed experts; ``w_*`` are dense tensors, or Fp8Weight (triton only, see ``runs_fp8``).
        ``topk_ids`` are rows of the stacked ``w_*``; ids outside them (other ranks' experts) add nothing.
        ``n_routed``: the model's expert count when the ``w_*`` hold fewer (expert parallel);
        ``max_top_k``: the most columns a call of this layer has (sizes a workspace made here)."""
        if self.impl == "reference":
            moe = routed_moe_chosen if self.device == "cpu" else routed_moe_reference
            return moe(x, w_gate, w_up, w_down, topk_ids, topk_weights)
        from paddle_mla.models.fused_moe.kernels import fused_moe

        fp8 = isinstance(w_gate, Fp8Weight)
        if self.workspace is None:   # tools that skip the engine's start-up: one chunk-sized workspace
            self.reserve(8192, max_top_k or topk_ids.shape[1], w_gate.shape[0], w_gate.shape[1], x.shape[1], fp8=fp8)
        if fp8:
            return fused_moe(x, w_gate.weight, w_up.weight, w_down.weight, topk_ids, topk_weights, self.workspace,
                             w_gate.scale_inv, w_up.scale_inv, w_down.scale_inv, act_quant=_act_quant,
                             n_routed=n_routed)
        return fused_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, self.workspace, n_routed=n_routed)

    def runs_fp8(self, w: Fp8Weight) -> bool:
        """Whether the fused kernels take this FP8 expert weight as it is (else: dequantize it)."""
        if self.impl != "triton" or not w.kernel:
            return False
        from paddle_mla.models.fused_moe.kernels import FP8_GROUP   # imports Triton: the triton path only

        return tuple(w.block) == (FP8_GROUP, FP8_GROUP)


def routed_moe_chosen(x, w_gate, w_up, w_down, topk_ids, topk_weights):
    """The masked reference's sum over only the (token, expert) pairs the routing chose: each chosen
    expert runs once over its tokens. CPU tensors only: it reads ``topk_ids`` on the host
    (``staging.host_values``, which refuses a device tensor, so no transfer can hide here).
    Summed in fp32 in expert order, as the masked form, so both give the same values up to the
    GEMMs' own rounding. Ids outside ``[0, E)`` are skipped (expert parallel: other ranks')."""
    T = topk_ids.shape[0]
    if T == 0:
        return x
    ids = host_values(topk_ids)
    weights = topk_weights.to(torch.float32)
    y = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device)
    for e in np.unique(ids):
        if e < 0 or e >= w_gate.shape[0]:
            continue
        rows_np, ks_np = np.nonzero(ids == e)      # a token chooses an expert at most once
        rows = torch.from_numpy(rows_np.astype(np.int64)).to(x.device)
        pick = torch.from_numpy((rows_np * ids.shape[1] + ks_np).astype(np.int64)).to(x.device)
        xe = x.index_select(0, rows)
        wg, wu, wd = (w[int(e)].to(x.dtype) for w in (w_gate, w_up, w_down))
        lin = batch_invariant.linear_for_mode    # an expert's row count follows the batch
        h = F.silu(lin(xe, wg)) * lin(xe, wu)
        out = lin(h, wd).to(torch.float32)
        y[rows] = y.index_select(0, rows) + out * weights.reshape(-1).index_select(0, pick).unsqueeze(1)
    return y.to(x.dtype)


def _act_quant(x):
    return per_token_group_quant(x, 128)


def route(spec: MoESpec, x, gate_w, bias=None, shared_pieces: int = 0):
    """DeepSeek routing -> (topk_ids [T, top_k] int64, topk_weights [T, top_k] float32), as transformers
    computes it; ``shared_pieces`` > 0 appends that many columns, ids E, E + 1, ... with weight 1
    (the shared experts folded into the routed ones: ``fold_shared_experts``)."""
    logits = batch_invariant.linear_for_mode(x.to(torch.float32), gate_w.to(torch.float32))
    fused = route_topk(spec, logits, bias, shared_pieces)   # one kernel on a GPU
    if fused is not None:
        return fused
    ids, weights = route_plain(spec, logits, bias)
    if not shared_pieces:
        return ids, weights
    T, E = ids.shape[0], spec.n_routed_experts
    extra = torch.arange(E, E + shared_pieces, dtype=ids.dtype, device=ids.device).unsqueeze(0).expand(T, -1)
    return torch.cat([ids, extra], 1), torch.cat([weights, torch.ones_like(weights[:, :1]).expand(T, shared_pieces)], 1)


def fold_shared_experts(experts: list, shared) -> tuple[list, int] | None:
    """The shared experts as extra routed experts of weight 1: (gate, up, down stacked with them,
    their count), or None where they cannot join.

    A SwiGLU MLP of width n * I is the sum of n MLPs of width I (its gate/up rows and down columns
    cut in n), so shared experts of n_shared * I (this rank's share under TP: n_shared * I / tp, as
    the routed experts' I / tp) become n experts that every token takes. The fused MoE then runs them
    in its grouped GEMMs and sums them in fp32 with the routed ones, where a separate MLP costs three
    GEMMs, the activation, the product and the add (on an H200, V2-Lite and V3 dims at TP 1 and 2,
    the layer takes 2-17 µs less at 64 tokens and 3-19 µs less at one; BENCHMARKS.md). transformers
    adds the two outputs in the model dtype; here the one sum rounds once. Both must be plain tensors
    of one dtype, or FP8 of one block size that the cut keeps whole; a shared MLP with biases
    (ERNIE's use_bias) stays separate."""
    if any(b is not None for b in (shared.gate_b, shared.up_b, shared.down_b)):
        return None
    gate, up, down = experts
    parts = (gate, up, down, shared.gate, shared.up, shared.down)
    if all(isinstance(t, Fp8Weight) for t in parts):
        block = gate.block
        if any(tuple(t.block) != tuple(block) or t.kernel != gate.kernel for t in parts):
            return None
    elif any(isinstance(t, Fp8Weight) for t in parts) or len({t.dtype for t in parts}) != 1:
        return None
    else:
        block = None
    inter, hidden = gate.shape[1], gate.shape[2]
    width = shared.gate.shape[0]
    if width % inter or tuple(shared.gate.shape) != (width, hidden) or tuple(shared.down.shape) != (hidden, width):
        return None
    n = width // inter
    if block is not None and (inter % block[0] or inter % block[1]):
        return None

    def rows(t, first):    # gate/up [n * R, C] -> [n, R, C]; down [R, n * C] -> [n, R, C]
        if first:
            return t.reshape(n, t.shape[0] // n, t.shape[1])
        return t.reshape(t.shape[0], n, t.shape[1] // n).permute(1, 0, 2)

    def stack(routed, piece, first):
        if block is None:
            return torch.cat([routed, rows(piece, first).contiguous()], 0)
        return Fp8Weight(torch.cat([routed.weight, rows(piece.weight, first).contiguous()], 0),
                         torch.cat([routed.scale_inv, rows(piece.scale_inv, first).contiguous()], 0),
                         routed.block, routed.kernel)
    return [stack(gate, shared.gate, True), stack(up, shared.up, True), stack(down, shared.down, False)], n


def unfolded_shared(gate, up, down, n: int, prefix: str) -> dict:
    """The shared MLP's weights (``prefix`` + gate/up/down_proj.weight) back from the last ``n``
    experts of the stacks: gate and up are views; down is a view for one piece and a copy for more
    (its columns were cut into the pieces)."""
    def rows(t, first):
        E = t.shape[0] - n
        if first:
            return t[E:].reshape(n * t.shape[1], t.shape[2])
        return t[E:].permute(1, 0, 2).reshape(t.shape[1], n * t.shape[2])

    def back(t, first):
        if isinstance(t, Fp8Weight):
            return Fp8Weight(rows(t.weight, first), rows(t.scale_inv, first), t.block, t.kernel)
        return rows(t, first)
    return {prefix + "gate_proj.weight": back(gate, True), prefix + "up_proj.weight": back(up, True),
            prefix + "down_proj.weight": back(down, False)}


def route_plain(spec: MoESpec, logits, bias=None):
    """``route`` from the router's fp32 logits [T, E] in plain tensors: the CPU path and the kernel's oracle."""
    E = spec.n_routed_experts
    if spec.scoring_func == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif spec.scoring_func == "sigmoid":
        scores = batch_invariant.elementwise(torch.sigmoid, logits)
    else:
        raise ValueError(f"unsupported scoring_func {spec.scoring_func!r}")
    T = scores.shape[0]
    if spec.topk_method == "greedy":
        choice = scores
    elif spec.topk_method in ("group_limited_greedy", "noaux_tc"):
        if spec.topk_method == "noaux_tc":
            choice = scores + bias.unsqueeze(0) if bias is not None else scores
            grouped = choice.view(T, spec.n_group, E // spec.n_group)
            group_scores = torch.topk(grouped, 2, dim=-1)[0].sum(-1)
            fill = float("-inf")
        else:
            choice = scores
            group_scores = torch.amax(choice.view(T, spec.n_group, E // spec.n_group), -1)
            fill = 0.0
        group_idx = torch.topk(group_scores, spec.topk_group, dim=-1)[1]
        group_mask = F.one_hot(group_idx, spec.n_group).sum(1) > 0                          # [T, G]
        score_mask = group_mask.unsqueeze(-1).expand(T, spec.n_group, E // spec.n_group).reshape(T, E)
        choice = torch.where(score_mask, choice, torch.full_like(choice, fill))
    else:
        raise ValueError(f"unsupported topk_method {spec.topk_method!r}")
    idx = torch.topk(choice, spec.num_experts_per_tok, dim=-1)[1]
    # noaux_tc weighs its picks by their scores (bias and group fill only choose them); greedy and
    # group_limited_greedy by the scores they chose from, as transformers' DeepseekV2 does: where
    # top-k exceeds the kept groups' experts, the others it takes weigh 0
    weights = (scores if spec.topk_method == "noaux_tc" else choice).gather(1, idx)
    norm, scale = spec.weight_rule()
    if norm:
        weights = weights / torch.clamp(weights.sum(-1, keepdim=True) + 1e-20, min=spec.norm_min)
    if scale:
        weights = weights * spec.routed_scaling_factor
    return idx, weights


class MoE:
    """Routed experts (+ shared experts); ``shared_mlp`` is the DenseMLP class (kept in deepseek.py)."""

    def __init__(self, arch: ModelArch, w: dict[str, Any], p: str, exec_: MoEExec, shared_mlp):
        self.spec = arch.moe
        self.exec = exec_
        self.gate_w = w[p + "gate.weight"]                         # fp32 [E, hidden]
        self.bias = w.get(p + "gate.e_score_correction_bias")      # fp32 [E] or None
        experts = [w[p + "experts.gate"], w[p + "experts.up"], w[p + "experts.down"]]
        self.fp8 = all(isinstance(t, Fp8Weight) for t in experts) and exec_.runs_fp8(experts[0])
        if not self.fp8:   # the reference, or FP8 the kernels cannot take: dequantized once, here
            experts = [t.dequantize(exec_.dtype) if isinstance(t, Fp8Weight) else t for t in experts]
        self.w_gate, self.w_up, self.w_down = experts
        # expert parallel: this rank holds experts [first, first + rows) of n_routed_experts
        self.expert_first = int(w.get(p + "experts.first", 0))
        self.expert_parallel = self.w_gate.shape[0] < self.spec.n_routed_experts
        # a checkpoint of n_shared_experts 0 may still hold the shared MLP's tensors, zero rows wide
        gate_key = p + "shared_experts.gate_proj.weight"
        self.shared = shared_mlp(w, p + "shared_experts.") if gate_key in w and w[gate_key].shape[0] else None
        # shared experts as routed rows E.. (expert parallel keeps them apart: another rank's id
        # shifted by ``expert_first`` could land on those rows)
        self.shared_pieces = 0
        folded = None if self.shared is None or self.expert_parallel else fold_shared_experts(experts, self.shared)
        if folded is not None:
            (self.w_gate, self.w_up, self.w_down), self.shared_pieces = folded
            # calls of more tokens run the shared MLP apart, over the same rows of the stacks
            self.shared = shared_mlp(unfolded_shared(self.w_gate, self.w_up, self.w_down, self.shared_pieces,
                                                     p + "shared_experts."), p + "shared_experts.")
            # the stacks are copies: the weights dict lets go of what they replace, so building a
            # model holds one layer's experts twice at most, not all of them
            for key in ("experts.gate", "experts.up", "experts.down", "shared_experts.gate_proj.weight",
                        "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"):
                w.pop(p + key, None)

    @property
    def inter_size(self) -> int:
        return self.w_gate.shape[1]

    @property
    def pairs_per_token(self) -> int:
        """(token, expert) pairs a token makes at most: its top-k and the shared experts' pieces."""
        return self.spec.num_experts_per_tok + self.shared_pieces

    def folds_shared(self, tokens: int) -> bool:
        """Whether a call of ``tokens`` runs the shared experts as routed pieces. Up to FOLD_MAX_TOKENS
        that saves the separate MLP's launches; past it the grouped GEMM's 16-64-row tiles read each
        piece's weights once per tile where one dense GEMM reads them once. Under ``deterministic:
        true`` always, so that no row's sum follows the batch."""
        return self.shared_pieces > 0 and (tokens <= FOLD_MAX_TOKENS or batch_invariant.enabled())

    def forward(self, x):
        pieces = self.shared_pieces if self.folds_shared(x.shape[0]) else 0
        topk_ids, topk_weights = route(self.spec, x, self.gate_w, self.bias, pieces)
        if self.expert_parallel:
            topk_ids = topk_ids - self.expert_first
        out = self.exec.run(x, self.w_gate, self.w_up, self.w_down, topk_ids, topk_weights,
                            self.spec.n_routed_experts if self.expert_parallel else None, self.pairs_per_token)
        if self.shared is not None and not pieces:
            out = out + self.shared.forward(x)
        return out
