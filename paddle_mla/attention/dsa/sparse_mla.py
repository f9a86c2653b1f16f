"""Sparse MLA in absorbed latent form over each query's selected cache slots (Triton).

For query row t (a decode token or a prefill token alike) and head h:
  score_j = (q_lat[t, h] . c_j + q_pe[t, h] . k_pe_j) * scale   over the slots j in ``slots[t]``
  o_lat[t, h] = softmax(score) @ c                              (the caller applies W_vc)
Stage 1 splits the top-k axis into ``num_splits`` chunks (one program per row, head block and
chunk) and writes a partial output and its log-sum-exp; stage 2 merges the chunks. Slots < 0 are
skipped; a row with no valid slot gives zeros, never NaN (fully masked tiles keep m = -inf and
contribute nothing). Workspaces come from the caller (sized at start-up for decode): no
allocation, no host sync, so a decode step can be captured in a CUDA graph.

With ``SparseConfig.cuda`` stage 1 is the SM90 CUDA op instead (``ops.mla_decode.mla_sparse``: the
warpgroup kernel of the paged decode, its key tiles gathered by slot), on the same plan and merge.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla.decode_plan import split_cost_of
from paddle_mla.platform.triton_host import env_overrides, interpreting, next_pow2, num_sms

LOG2E = 1.4426950408889634
MAX_SPLITS = 8
# the CUDA kernel's programs hold an SM each (225 KB of shared memory): at b=1 and 128 heads a 2048-slot
# top-k needs 16 chunks of 128 slots to put 32 programs to work
CUDA_MAX_SPLITS = 16


@triton.jit
def _sparse_partial_kernel(
    q_lat, q_pe, cache, slots, part_o, part_lse,
    stride_qlt, stride_qlh, stride_qpt, stride_qph, stride_row, stride_st,
    stride_pot, stride_poh, stride_pos, stride_plt, stride_plh,
    H, K, C, R, sm_scale_log2, SPLIT_LEN, out, stride_ot, stride_oh, DIRECT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    sp = tl.program_id(2)
    hm = h < H
    c = tl.arange(0, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    ql = tl.load(q_lat + t * stride_qlt + h[:, None] * stride_qlh + c[None, :],
                 mask=hm[:, None] & (c[None, :] < C), other=0.0)
    qp = tl.load(q_pe + t * stride_qpt + h[:, None] * stride_qph + r[None, :],
                 mask=hm[:, None] & (r[None, :] < R), other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    start = sp * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, K)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        s = tl.load(slots + t * stride_st + n, mask=n < end, other=-1)
        ok = s >= 0
        row = cache + tl.where(ok, s, 0) * stride_row
        kc = tl.load(row[:, None] + c[None, :], mask=ok[:, None] & (c[None, :] < C), other=0.0)
        kp = tl.load(row[:, None] + C + r[None, :], mask=ok[:, None] & (r[None, :] < R), other=0.0)
        qk = tl.dot(ql, tl.trans(kc), out_dtype=tl.float32) + tl.dot(qp, tl.trans(kp), out_dtype=tl.float32)
        qk = tl.where(ok[None, :], qk * sm_scale_log2, float("-inf"))     # log2 units: exp2 below
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc, out_dtype=tl.float32)
        m_i = m_new
    has = l_i > 0
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))   # log2 units
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT:   # one chunk: this is the final output, no merge pass
        tl.store(out + t * stride_ot + h[:, None] * stride_oh + c[None, :], o.to(out.dtype.element_ty),
                 mask=hm[:, None] & (c[None, :] < C))
        return
    tl.store(part_o + t * stride_pot + h[:, None] * stride_poh + sp * stride_pos + c[None, :], o,
             mask=hm[:, None] & (c[None, :] < C))
    tl.store(part_lse + t * stride_plt + h * stride_plh + sp, lse, mask=hm)


@triton.jit
def _merge_kernel(part_o, part_lse, out, stride_pot, stride_poh, stride_pos, stride_plt, stride_plh,
                  stride_ot, stride_oh, S, C, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    c = tl.arange(0, BLOCK_C)
    lse = tl.load(part_lse + t * stride_plt + h * stride_plh + s, mask=s < S, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wgt = tl.exp2(lse - m_safe)                                  # 0 for empty chunks
    o = tl.load(part_o + t * stride_pot + h * stride_poh + s[:, None] * stride_pos + c[None, :],
                mask=(s[:, None] < S) & (c[None, :] < C), other=0.0)
    den = tl.sum(wgt, 0)
    res = tl.sum(o * wgt[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(out + t * stride_ot + h * stride_oh + c, res.to(out.dtype.element_ty), mask=c < C)


@dataclass(frozen=True)
class SparseConfig:
    block_h: int         # heads per program: the gathered latent rows are read once per head block
    block_n: int         # selected slots per tile
    num_warps: int
    num_stages: int
    max_splits: int      # chunks of the top-k axis (fewer when the rows alone fill the GPU)
    cuda: bool = False   # stage 1 on the SM90 CUDA op (64 heads x 64 slots; warps and stages unused)


def sparse_config(num_heads: int, cuda: bool = False, **override) -> SparseConfig:
    """Launch config from the head count; env PADDLE_MLA_DSA_CFG="block_h=32,num_stages=2" or
    ``override`` sets fields (benchmarks.kernels.dsa --sweep compares them). ``cuda``: the CUDA op's
    config, whose program shape is fixed (only ``max_splits`` may be set; the env's other keys are
    the Triton kernel's and are left out)."""
    if cuda:   # of the env's keys (a Triton sweep's) only max_splits applies here
        cfg = dict(block_h=64, block_n=64, num_warps=8, num_stages=2, max_splits=CUDA_MAX_SPLITS, cuda=True)
        cfg.update({k: v for k, v in env_overrides("PADDLE_MLA_DSA_CFG").items() if k == "max_splits"})
        cfg.update(override)
        if (cfg["block_h"], cfg["block_n"]) != (64, 64):
            raise ValueError("the CUDA sparse MLA runs 64 heads x 64 slots a program; only max_splits can be set")
        return SparseConfig(**cfg)
    if interpreting():
        cfg = dict(block_h=16, block_n=16, num_warps=4, num_stages=1, max_splits=MAX_SPLITS)
    elif num_heads <= 32:
        cfg = dict(block_h=max(16, next_pow2(num_heads)), block_n=32, num_warps=4, num_stages=2, max_splits=MAX_SPLITS)
    else:   # as the dense decode kernel: 64 heads x 64 slots per MMA step
        cfg = dict(block_h=64, block_n=64, num_warps=8, num_stages=2, max_splits=MAX_SPLITS)
    cfg.update(env_overrides("PADDLE_MLA_DSA_CFG"))
    cfg.update(override)
    return SparseConfig(**cfg)


def split_len_for(topk: int, max_splits: int, block_n: int) -> int:
    """Chunk length of the top-k axis: a multiple of ``block_n`` giving at most ``max_splits`` chunks."""
    per = -(-topk // max_splits)
    return max(block_n, -(-per // block_n) * block_n)


def plan_splits(rows: int, num_heads: int, topk: int, cfg: SparseConfig, forced: int = 0) -> tuple[int, int, int]:
    """(splits, chunk length, slots per tile) for ``rows`` queries: enough programs for about two per
    SM, at most ``cfg.max_splits`` splits (``forced`` overrides); prefill-sized steps get one (no
    merge). The CUDA op's plan is ``cuda_chunks``'."""
    if cfg.cuda:
        return cuda_chunks(rows, num_heads, topk, cfg, forced)
    block_n = cfg.block_n if topk >= cfg.block_n else 16
    want = -(-2 * num_sms() // max(rows * triton.cdiv(num_heads, cfg.block_h), 1))
    per = forced or max(1, min(cfg.max_splits, want))
    split = split_len_for(topk, per, block_n)
    return -(-topk // split), split, block_n


def cuda_chunks(rows: int, num_heads: int, topk: int, cfg: SparseConfig, forced: int = 0) -> tuple[int, int, int]:
    """The CUDA op's (chunks, chunk length, 64): whole 64-slot tiles a chunk, and of at most
    ``cfg.max_splits`` chunks the count whose grid ends first. Every program holds an SM (its shared
    memory), so the grid runs in waves of ``num_sms`` programs and costs waves x (tiles a program, plus
    a cut row's partial rows, written and merged: the paged decode plan's ``split_cost_of``); ties take
    fewer chunks. Rounding programs up to whole waves is what the plain "two programs an SM" misses:
    64 rows of 128 heads in two chunks are 256 programs, two waves of half the tiles: no gain, and a
    merge. Rows that fill the GPU whole take one chunk."""
    def chunks(c: int) -> tuple[int, int]:
        split = split_len_for(topk, c, 64)
        return max(-(-topk // split), 1), split     # an empty top-k: one chunk of no key (zeros)

    if forced:
        return (*chunks(forced), 64)
    programs_a_chunk, sms = rows * -(-num_heads // 64), num_sms()
    if programs_a_chunk >= sms:     # whole rows fill the GPU: no merge, no workspace (prefill steps)
        return (*chunks(1), 64)
    partial = split_cost_of(min(num_heads, 64), 512, 64, 576)      # in 1/64 key tiles
    best = None
    for c in range(1, min(cfg.max_splits, max(-(-topk // 64), 1)) + 1):
        n, split = chunks(c)
        cost = -(-programs_a_chunk * n // sms) * (split + (partial if n > 1 else 0))
        if best is None or cost < best[0]:
            best = (cost, n, split)
    return best[1], best[2], 64


@functools.lru_cache(maxsize=64)    # prefill steps size their workspace each step, from the same few shapes
def partial_rows(max_rows: int, num_heads: int, topk: int, cfg: SparseConfig) -> int:
    """Largest rows x splits over every step of up to ``max_rows`` queries that splits (the merge
    workspace, whatever ``max_rows``: about 2 x SMs / head blocks for the Triton plan, up to about 3 x
    SMs for the CUDA one)."""
    best = 0
    # the CUDA plan cuts only rows that leave SMs idle, not always fewer as rows grow: each count
    # below that; the Triton plan's splits only fall as rows grow
    last = min(max_rows, (num_sms() - 1) // triton.cdiv(num_heads, cfg.block_h)) if cfg.cuda else max_rows
    for rows in range(1, last + 1):
        n = plan_splits(rows, num_heads, topk, cfg)[0]
        if n == 1 and not cfg.cuda:
            break            # more rows never split again
        best = max(best, rows * n)
    return best


def sparse_mla(q_lat, q_pe, kv_cache, slots, scale: float, part_o, part_lse, out, cfg: SparseConfig | None = None,
               num_splits: int = 0):
    """q_lat [T, H, C], q_pe [T, H, R], kv_cache [NB, bs, 1, C + R], slots int64 [T, K] -> out[:T] [T, H, C].

    ``part_o`` (float32, >= rows x splits x H x C elements) and ``part_lse`` (float32, >= rows x splits
    x H) are flat merge workspaces, unused when the step does not split (``partial_rows`` sizes them);
    ``out`` [>= T, H, C] receives the latent outputs. The split count depends only on T, H and K
    (host-known), so a captured decode step replays the same launch; ``num_splits`` forces it (tests,
    sweeps).
    """
    T, H, C = q_lat.shape
    R = q_pe.shape[-1]
    K = slots.shape[1]
    res = out[:T]
    if T == 0:
        return res
    cfg = cfg or sparse_config(H)
    n_splits, split, block_n = plan_splits(T, H, K, cfg, num_splits)
    flat_o, flat_lse = part_o, part_lse
    if n_splits > 1:
        if part_o.numel() < T * n_splits * H * C or part_lse.numel() < T * n_splits * H:
            raise ValueError(f"sparse_mla: the merge workspace holds {part_lse.numel() // H} rows x splits, "
                             f"the step needs {T * n_splits}")
        part_o = part_o.view(-1)[:T * H * n_splits * C].view(T, H, n_splits, C)
        part_lse = part_lse.view(-1)[:T * H * n_splits].view(T, H, n_splits)
    else:    # the kernel writes the output directly; the workspaces are not touched
        part_o, part_lse = res.view(T, H, 1, C), res.view(T, H, 1, C)[..., 0]
    block_h = cfg.block_h
    block_c = max(16, next_pow2(C))
    if cfg.cuda:
        _cuda_partials(q_lat, q_pe, kv_cache, slots, scale, flat_o, flat_lse, res, n_splits, split)
    else:
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        grid = (T, triton.cdiv(H, block_h), n_splits)
        _sparse_partial_kernel[grid](
            q_lat, q_pe, flat, slots, part_o, part_lse,
            q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1), flat.stride(0), slots.stride(0),
            part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
            H, K, C, R, scale * LOG2E, split, res, res.stride(0), res.stride(1), n_splits == 1,
            BLOCK_H=block_h, BLOCK_C=block_c, BLOCK_R=max(16, next_pow2(R)), BLOCK_N=block_n,
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        )
    if n_splits == 1:
        return res
    _merge_kernel[(T, H)](
        part_o, part_lse, res, part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0),
        part_lse.stride(1), res.stride(0), res.stride(1), n_splits, C,
        BLOCK_S=max(2, next_pow2(n_splits)), BLOCK_C=block_c,
    )
    return res


def _cuda_partials(q_lat, q_pe, kv_cache, slots, scale, part_o, part_lse, res, n_splits: int, split: int):
    """Stage 1 on the CUDA op: ``res`` directly for one chunk, else the partials, packed [T, H, splits, C]
    from the flat workspaces' start (the merge's views of them)."""
    from paddle_mla.ops.mla_decode import mla_sparse

    if q_pe.data_ptr() % 16 or any(st * q_pe.element_size() % 16 for st in q_pe.stride()[:2]):
        q_pe = q_pe.contiguous()        # its rows are read by TMA: 16-byte aligned
    mla_sparse(q_lat, q_pe, kv_cache, slots, res, part_o, part_lse, q_lat.shape[0], n_splits, split, scale)


def sparse_mla_ref(q_lat, q_pe, kv_cache, slots, scale: float):
    """Plain reference: float32 attention over the gathered slots, -inf at invalid ones, zeros if none."""
    T, H, C = q_lat.shape
    flat = kv_cache.view(-1, kv_cache.shape[-1]).to(torch.float32)
    ok = slots >= 0
    kv = flat[torch.where(ok, slots, torch.zeros_like(slots)).reshape(-1)].reshape(T, slots.shape[1], -1)
    c, kpe = kv[..., :C], kv[..., C:]
    s = (torch.matmul(q_lat.to(torch.float32), c.transpose(1, 2))
         + torch.matmul(q_pe.to(torch.float32), kpe.transpose(1, 2))) * scale        # [T, H, K]
    s = torch.where(ok.unsqueeze(1), s, torch.full_like(s, float("-inf")))
    m = torch.amax(s, -1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    den = p.sum(-1, keepdim=True)
    p = p / torch.where(den > 0, den, torch.ones_like(den))
    return torch.matmul(p, c)
