"""The Triton GEMMs of ``batch_invariant``: no split-K, fp32 accumulation.

Each program owns a BLOCK_M x BLOCK_N output tile and walks K in BLOCK_K steps from 0 upwards, so an
output element is the same chain of tensor-core k-steps (wgmma k16 on Hopper, each adding into the
fp32 accumulator in K order) whatever M is and whichever tile row it lands in. The tile's shape
places the chain on the GPU and does not change it: every config of
``benchmarks.kernels.batch_invariant_gemm`` (BLOCK_M 64 / 128, BLOCK_N 32-256, BLOCK_K 64 / 128, 4 or
8 warps, pointer or TMA loads) gave the same bits on an H200 at every model shape, and
``tests/kernels/test_determinism_gpu.py`` checks the two tiles used here on every GPU run. So the
tile may follow the launch (``tile_for``): a small launch takes narrow tiles (more programs to
stream the weight), a large one wide tiles (more reuse). BLOCK_M stays >= 64 (one warpgroup's
wgmma M); below that Triton would lower to another MMA instruction. A launch of few rows (decode)
takes the swapped kernel instead: the weight rows on the wgmma's M side, the activation rows on its
N side (16 and up), the same chain per element (the GPU test compares its bits with the others').
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import num_sms

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP, warps, stages), chosen with benchmarks.kernels.batch_invariant_gemm
# (H200, bf16, CUDA-graph replays; BENCHMARKS.md, "Determinism check"): WIDE for launches of at
# least two waves of 128 x 128 tiles (prefill, the LM head), NARROW below (decode's projections).
WIDE = (128, 128, 64, 8, 4, 4)
NARROW = (64, 128, 64, 8, 4, 6)
# fp32 products (the MoE router's logits, which transformers computes in fp32) take the CUDA-core
# dot (input_precision "ieee"): one FMA a k-step into each output, in K order, whatever the tile
# (the GPU test checks), so the tile can be narrow enough that a router's few columns (V2-Lite: 64
# experts) still give the GPU tens of programs, where WIDE / NARROW would give it 4 at decode.
FP32 = (32, 32, 32, 8, 4, 3)
# Launches of at most SWAP_MAX_ROWS rows (decode) take the swapped kernel (_gemm_swap_tma_kernel):
# (BLOCK_M activation rows, BLOCK_N weight rows, BLOCK_K, GROUP unused, warps, stages), BLOCK_M the
# smallest of 16 / 32 / 64 holding the rows; BLOCK_N 64 where 128 would leave SMs without a program.
SWAP_MAX_ROWS = 64
SWAP_STAGES = {16: 6, 32: 5, 64: 4}


def tile_for(M: int, N: int, device, groups: int = 1, dtype=None) -> tuple:
    """FP32 for fp32 operands; else WIDE when its tiles (over ``groups`` products of a batched
    launch) fill two waves of the GPU's SMs, else NARROW (and off a GPU: the interpreter's tests)."""
    if dtype == torch.float32:
        return FP32
    if device.type != "cuda":
        return NARROW
    sms = num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return WIDE if groups * triton.cdiv(M, WIDE[0]) * triton.cdiv(N, WIDE[1]) >= 2 * sms else NARROW


@triton.jit
def _grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """(row tile, column tile) of this program in grouped order: GROUP row tiles share their B
    columns in L2 (placement only, not arithmetic)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP * num_n
    first_m = (pid // width) * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 stride_ag, stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cg, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                 PREC: tl.constexpr):
    g = tl.program_id(1).to(tl.int64)
    pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + g * stride_ag + rows.to(tl.int64)[:, None] * stride_am
    b_base = b_ptr + g * stride_bg + cols.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(a_base + kk[None, :] * stride_ak, mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_base + kk[:, None] * stride_bk, mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
    c = c_ptr + g * stride_cg + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["M"])
def _gemm_tma_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP: tl.constexpr, OUT: tl.constexpr):
    """x [M, K] @ w [N, K]^T through TMA descriptors (bounds by the copy engine, so no masks); the
    same K-ordered walk as _gemm_kernel."""
    pid_m, pid_n = _grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        b = b_desc.load([off_n, k0])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([off_m, off_n], acc.to(OUT))


@triton.jit(do_not_specialize=["M"])
def _gemm_swap_tma_kernel(w_desc, x_desc, c_ptr, M, N, K, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """x [M, K] @ w [N, K]^T computed as (w @ x^T)^T: the weight rows are the tensor-core product's M
    side and the few activation rows its N side (16 or more), so a decode step's rows do not pad a
    64-row A tile that would take shared memory from the weight's pipeline. Each output element is
    the same K-ordered chain of k16 products as in the kernels above (the GPU test checks the bits)."""
    off_n = tl.program_id(0) * BLOCK_N
    off_m = tl.program_id(1) * BLOCK_M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = w_desc.load([off_n, k0])
        x = x_desc.load([off_m, k0])
        acc = tl.dot(w, x.T, acc)
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    c = c_ptr + rows.to(tl.int64)[None, :] * stride_cm + cols[:, None]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rows[None, :] < M) & (cols[:, None] < N))


def swap_tile_for(M: int, N: int, device):
    """The swapped kernel's tile for a launch of M rows, or None above SWAP_MAX_ROWS."""
    if M > SWAP_MAX_ROWS:
        return None
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    sms = num_sms(device.index if device.index is not None else torch.cuda.current_device())
    bn = 128 if triton.cdiv(N, 128) >= sms else 64
    return (bm, bn, 128, 1, 4, SWAP_STAGES[bm])


def _tma_gemm(x, w, tile, swapped: bool):
    """gemm_nt through TMA descriptors (``_tma_ok`` inputs): the swapped kernel, or the tile kernel."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, group, warps, stages = tile
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    xd = TensorDescriptor.from_tensor(x, [bm, bk])
    wd = TensorDescriptor.from_tensor(w, [bn, bk])
    if swapped:
        grid = (triton.cdiv(N, bn), triton.cdiv(M, bm))
        _gemm_swap_tma_kernel[grid](wd, xd, out, M, N, K, out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                    num_warps=warps, num_stages=stages)
    else:
        c = TensorDescriptor.from_tensor(out, [bm, bn])
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        _gemm_tma_kernel[grid](xd, wd, c, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=group,
                               OUT=tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16, num_warps=warps,
                               num_stages=stages)
    return out


def gemm_swap_tma(x, w, tile):
    """gemm_nt through the swapped kernel (``swap_tile_for``'s tiles; GROUP unused)."""
    return _tma_gemm(x, w, tile, True)


def gemm_nt_tma(x, w, tile):
    """gemm_nt through TMA descriptors and the tile kernel."""
    return _tma_gemm(x, w, tile, False)


def _launch(a, b, out, G: int, M: int, N: int, K: int, sa, sb, sc, tile) -> None:
    if M == 0 or N == 0:
        return
    bm, bn, bk, group, warps, stages = tile
    # pointer loads also stage layout conversions in shared memory: 3 stages fit every shape of
    # the benchmark and the models (NARROW's 6 overflow 227 KiB for some); stages place copies
    # in time and do not enter the arithmetic
    stages = min(stages, 3)
    prec = "ieee" if a.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), G)
    _gemm_kernel[grid](a, b, out, M, N, K, *sa, *sb, *sc, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                       GROUP=group, PREC=prec, num_warps=warps, num_stages=stages)


def _tma_ok(x, w) -> bool:
    """TMA descriptors: 16-bit elements, contiguous rows, 16-byte aligned bases and row pitches."""
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype and x.is_contiguous()
            and w.is_contiguous() and x.shape[1] % 8 == 0 and w.shape[0] % 8 == 0
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


def gemm_nt(x, w, tile=None):
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype: TMA loads where ``_tma_ok``, else pointer loads
    (the same chain either way). ``tile``: ``tile_for``'s unless given (the benchmark's candidates)."""
    M, K = x.shape
    N = w.shape[0]
    if _tma_ok(x, w):
        swap = swap_tile_for(M, N, x.device) if tile is None else None
        return gemm_swap_tma(x, w, swap) if swap else gemm_nt_tma(x, w, tile or tile_for(M, N, x.device))
    return gemm_nt_pointers(x, w, tile or tile_for(M, N, x.device, dtype=x.dtype))


def gemm_nt_pointers(x, w, tile):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _launch(x, w, out, 1, M, N, K, (0, x.stride(0), x.stride(1)), (0, w.stride(1), w.stride(0)),
            (0, out.stride(0), out.stride(1)), tile)
    return out


def bmm_nn(a, b, out=None):
    """a [G, M, K] @ b [G, K, N] -> [G, M, N] in a's dtype, into ``out`` if given (any strides: a
    transposed view of the caller's buffer saves the copy into it)."""
    G, M, K = a.shape
    N = b.shape[2]
    if out is None:
        out = torch.empty((G, M, N), dtype=a.dtype, device=a.device)
    _launch(a, b, out, G, M, N, K, a.stride(), b.stride(), out.stride(), tile_for(M, N, a.device, G, a.dtype))
    return out


# The row log-sum-exp in two passes over fixed column chunks: (max, sum of exp) of each LSE_CHUNK
# columns of a row, then one program a row folds its chunks. Chunks follow N alone, so a row's
# order of additions does not depend on the batch, and a few decode rows still give the GPU
# rows x N / LSE_CHUNK programs (one program a row streamed a 152k vocabulary on one SM).
LSE_CHUNK = 4096


@triton.jit(do_not_specialize=["N"])
def _chunk_logsumexp_kernel(x_ptr, part_ptr, N, stride, chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, c): the max of chunk c, then the sum of exp over its BLOCK-wide slices in
    column order, into part[row, c] = (max, sum)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    base = x_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for n0 in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
        v = tl.load(base + n0 + cols, mask=n0 + cols < N, other=float("-inf")).to(tl.float32)
        run_max = tl.maximum(run_max, v)
    m = tl.max(run_max, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)   # an all -inf chunk sums to 0, not NaN
    acc = tl.zeros([BLOCK], tl.float32)
    for n0 in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
        v = tl.load(base + n0 + cols, mask=n0 + cols < N, other=float("-inf")).to(tl.float32)
        acc += tl.exp(v - m_safe)
    out = part_ptr + (row * chunks + c) * 2
    tl.store(out, m)
    tl.store(out + 1, tl.sum(acc, 0))


@triton.jit
def _fold_logsumexp_kernel(part_ptr, out_ptr, chunks, CB: tl.constexpr):
    """One program a row: top + log(sum over its chunks of sum_c * exp(max_c - top)), top the largest
    max_c; the chunks' count follows N alone, so the reduction tree does too."""
    row = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, CB)
    base = part_ptr + row * chunks * 2
    m = tl.load(base + idx * 2, mask=idx < chunks, other=float("-inf"))
    s = tl.load(base + idx * 2 + 1, mask=idx < chunks, other=0.0)
    top = tl.max(m, 0)
    top_safe = tl.where(top == float("-inf"), 0.0, top)   # an all -inf row: log(0) = -inf, not NaN
    # an empty chunk (max -inf, sum 0) adds 0 * 0; a NaN in a chunk reaches the total, as in the framework's
    total = tl.sum(s * tl.exp(m - top_safe), 0)
    tl.store(out_ptr + row, top_safe + tl.log(total))


def row_logsumexp(x):
    """x [B, N] (last dim contiguous) -> float32 [B, 1]."""
    B, N = x.shape
    out = torch.empty((B, 1), dtype=torch.float32, device=x.device)
    if B:
        chunks = triton.cdiv(N, LSE_CHUNK)
        part = torch.empty((B, chunks, 2), dtype=torch.float32, device=x.device)
        _chunk_logsumexp_kernel[(B, chunks)](x, part, N, x.stride(0), chunks, CHUNK=LSE_CHUNK, BLOCK=1024,
                                             num_warps=4)
        _fold_logsumexp_kernel[(B,)](part, out, chunks, CB=max(16, triton.next_power_of_2(chunks)), num_warps=1)
    return out
