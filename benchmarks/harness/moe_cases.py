"""The fused MoE cases (GPU, PyTorch runtime; the CPU smoke under TRITON_INTERPRET=1): random expert
weights (bf16 or FP8 with 128x128 block scales) at a ``dims.MoEShape``, routing, the activation
quantizer, graph timing, and SGLang's fused MoE sequence from ./third_party (``anchors.SGLANG_FUSED_MOE``).
Used by the fused MoE benchmark, its tuner and the kernel profiler."""

from __future__ import annotations

import os
from dataclasses import dataclass

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.harness import anchors, timing  # noqa: E402
from benchmarks.harness.dims import MoEShape  # noqa: E402
from paddle_mla.models.fused_moe.reference import act_quant_reference  # noqa: E402


class Env:
    """Where the benchmark runs: the GPU in bf16, or (``smoke``: a CPU check of these tools' code
    paths under TRITON_INTERPRET=1, which has no bf16 and no CUDA events) the CPU in fp16."""
    device, dtype, smoke = "cuda", torch.bfloat16, False

    @classmethod
    def set_smoke(cls) -> None:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke runs on CPU under TRITON_INTERPRET=1")
        cls.device, cls.dtype, cls.smoke = "cpu", torch.float16, True


def device_name() -> str:
    return "cpu" if Env.smoke else torch.cuda.get_device_name()


def act_quant_fn():
    """(fn(x, group) -> (q, scale), its name): the FP8 helper's quantizer when merged, else the plain reference."""
    try:
        from paddle_mla.models.fp8 import per_token_group_quant
        return (lambda x, group=128: per_token_group_quant(x, group)), "paddle_mla.models.fp8.per_token_group_quant"
    except ImportError:
        return act_quant_reference, "reference (plain torch: several kernels)"


@dataclass
class Weights:
    """Gate and up are views of one [E, 2N, K] tensor (SGLang's w13 layout; ours takes the views),
    so the V3 bf16 weights exist once (22.5 GB)."""
    w13: object
    w_down: object
    s13: object = None
    s_down: object = None

    @property
    def fp8(self) -> bool:
        return self.s13 is not None

    @property
    def N(self) -> int:
        return self.w13.shape[1] // 2

    w_gate = property(lambda self: self.w13[:, :self.N])
    w_up = property(lambda self: self.w13[:, self.N:])
    s_gate = property(lambda self: None if self.s13 is None else self.s13[:, :self.s13.shape[1] // 2])
    s_up = property(lambda self: None if self.s13 is None else self.s13[:, self.s13.shape[1] // 2:])


def make_weights(shape: MoEShape, fp8: bool, seed: int = 0) -> Weights:
    torch.manual_seed(seed)
    E, N, K = shape.E, shape.N, shape.K

    def w(rows, cols):
        out = torch.empty(E, rows, cols, device=Env.device, dtype=torch.float8_e4m3fn if fp8 else Env.dtype)
        for e in range(0, E, 16):     # bounded temporaries at V3 sizes
            r = torch.randn(min(16, E - e), rows, cols, device=Env.device)
            out[e:e + 16] = (r * 64).clamp(-448, 448) if fp8 else r * 0.02
        return out

    def s(rows, cols):
        return torch.rand(E, triton.cdiv(rows, 128), triton.cdiv(cols, 128), device=Env.device) * 4e-4 + 1e-4

    if not fp8:
        return Weights(w(2 * N, K), w(K, N))
    return Weights(w(2 * N, K), w(K, N), s(2 * N, K), s(K, N))


def make_inputs(shape: MoEShape, M: int, seed: int = 0):
    """x bf16 [M, K]; distinct uniformly random experts per token; weights that sum to 1."""
    torch.manual_seed(seed)
    x = torch.randn(M, shape.K, device=Env.device).to(Env.dtype)
    ids = torch.argsort(torch.rand(M, shape.E, device=Env.device), dim=1)[:, :shape.top_k]
    w = torch.rand(M, shape.top_k, device=Env.device) + 0.1
    return x, ids.to(torch.int32).contiguous(), (w / w.sum(1, keepdim=True)).contiguous()


def touched_weight_bytes(shape: MoEShape, ids, fp8: bool) -> int:
    """Bytes of the expert weights (and scales) a call must read: distinct experts x 3 matrices."""
    used = int(torch.unique(ids).numel())
    per = 3 * shape.N * shape.K * (1 if fp8 else 2)
    if fp8:
        per += 3 * triton.cdiv(shape.N, 128) * triton.cdiv(shape.K, 128) * 4
    return used * per


def bench_us(fn, use_graph: bool = True) -> float:
    """Median µs of ``fn`` replayed in a CUDA graph (eager when capture fails); the smoke: one call."""
    return timing.graph_median_us(fn, use_graph, cpu=Env.smoke)


def copy_bandwidth_gbs() -> float:
    return timing.copy_bandwidth(Env.device, (1 << 20) if Env.smoke else (1 << 30)) / 1e9


def load_sglang():
    """((kernels module, config module), its source line), or (None, why)."""
    kern, source = anchors.load(anchors.SGLANG_FUSED_MOE)
    if kern is None:
        return None, source + " here and carry third_party"
    cfg = anchors.import_from(anchors.SGLANG_FUSED_MOE, "fused_moe_triton_config")
    shim = anchors.import_from(anchors.SGLANG_FUSED_MOE, "sglang_shim")
    quant, _ = act_quant_fn()
    shim.set_act_quant(quant)
    return (kern, cfg), source.splitlines()[0]


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """y[r] = silu(x[r, :N]) * x[r, N:] (SGLang's silu_and_mul is a sgl_kernel CUDA op, not fetched)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(x_ptr + row * 2 * N + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * N + N + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + offs, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=m)


class SGLangMoE:
    """SGLang 0.5.3's Triton fused MoE sequence: its tuned/default config, align (ours: SGLang's is a
    sgl_kernel CUDA op), fused_moe_kernel for gate+up, silu*mul (a Triton kernel above), fused_moe_kernel
    for down with the routing weights, moe_sum_reduce_triton. Buffers allocated once per M."""

    def __init__(self, sg, shape: MoEShape, wts: Weights, M: int):
        from paddle_mla.models.fused_moe.align import AlignBuffers

        self.kern, cfgmod = sg
        self.shape, self.M, self.fp8 = shape, M, wts.fp8
        self.w13, self.w2, self.s13, self.s2 = wts.w13, wts.w_down, wts.s13, wts.s_down   # [E, 2N, K], gate first
        self.block_shape = [128, 128] if wts.fp8 else None
        self.config = cfgmod.try_get_optimal_moe_config(self.w13.shape, self.w2.shape, shape.top_k,
                                                        "fp8_w8a8" if wts.fp8 else None, M,
                                                        block_shape=self.block_shape)
        tk, N, K = shape.top_k, shape.N, shape.K
        self.align = AlignBuffers(M * tk, shape.E, Env.device)
        self.c1 = torch.empty(M, tk, 2 * N, device=Env.device, dtype=Env.dtype)
        self.c2 = torch.empty(M * tk, N, device=Env.device, dtype=Env.dtype)
        self.c3 = torch.empty(M, tk, K, device=Env.device, dtype=Env.dtype)
        self.out = torch.empty(M, K, device=Env.device, dtype=Env.dtype)

    def __call__(self, x, ids, weights):
        from paddle_mla.models.fused_moe.align import moe_align

        k, cfg, tk, N = self.kern, self.config, self.shape.top_k, self.shape.N
        sorted_ids, expert_ids, total = moe_align(ids, self.align, cfg["BLOCK_SIZE_M"])
        common = dict(compute_type=tl.float16 if Env.smoke else tl.bfloat16, use_fp8_w8a8=self.fp8,
                      use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                      block_shape=self.block_shape)
        k.invoke_fused_moe_kernel(x, self.w13, None, self.c1, None, self.s13, None, weights, ids, sorted_ids,
                                  expert_ids, total, False, tk, cfg, **common)
        rows = self.M * tk
        _silu_mul_kernel[(rows, triton.cdiv(N, 1024))](self.c1, self.c2, N, BLOCK=1024)
        k.invoke_fused_moe_kernel(self.c2, self.w2, None, self.c3, None, self.s2, None, weights, ids, sorted_ids,
                                  expert_ids, total, True, 1, cfg, **common)
        k.moe_sum_reduce_triton(self.c3, self.out, 1.0)
        return self.out
