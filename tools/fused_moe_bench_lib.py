"""Shared by tools/bench_fused_moe.py and tools/tune_fused_moe.py (GPU, PyTorch runtime):
the benchmark shapes, random expert weights (bf16 or FP8 with 128x128 block scales), routing,
the activation quantizer, CUDA-graph timing, and SGLang's fused MoE from ./third_party."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from paddle_mla.models.fused_moe.reference import act_quant_reference  # noqa: E402

SGLANG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "third_party", "sglang_fused_moe")


@dataclass(frozen=True)
class Shape:
    name: str
    E: int
    top_k: int
    N: int          # intermediate size per expert
    K: int          # hidden size


SHAPES = {"v2lite": Shape("V2-Lite", 64, 6, 1408, 2048), "v3": Shape("V3", 256, 8, 2048, 7168),
          "tiny": Shape("tiny", 8, 2, 128, 256)}


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


def make_weights(shape: Shape, fp8: bool, seed: int = 0) -> Weights:
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


def make_inputs(shape: Shape, M: int, seed: int = 0):
    """x bf16 [M, K]; distinct uniformly random experts per token; weights that sum to 1."""
    torch.manual_seed(seed)
    x = torch.randn(M, shape.K, device=Env.device).to(Env.dtype)
    ids = torch.argsort(torch.rand(M, shape.E, device=Env.device), dim=1)[:, :shape.top_k]
    w = torch.rand(M, shape.top_k, device=Env.device) + 0.1
    return x, ids.to(torch.int32).contiguous(), (w / w.sum(1, keepdim=True)).contiguous()


def touched_weight_bytes(shape: Shape, ids, fp8: bool) -> int:
    """Bytes of the expert weights (and scales) a call must read: distinct experts x 3 matrices."""
    used = int(torch.unique(ids).numel())
    per = 3 * shape.N * shape.K * (1 if fp8 else 2)
    if fp8:
        per += 3 * triton.cdiv(shape.N, 128) * triton.cdiv(shape.K, 128) * 4
    return used * per


def bench_us(fn, use_graph: bool = True) -> float:
    """Median µs of ``fn`` (L2 flushed between runs by do_bench); captured in a CUDA graph first
    (launch overhead out, as in the engine's decode graphs), eager when capture fails."""
    fn()
    if Env.smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    torch.cuda.synchronize()
    if use_graph:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            return triton.testing.do_bench(g.replay, warmup=10, rep=50, return_mode="median") * 1e3
        except Exception as e:  # noqa: BLE001  (reported, then timed eagerly)
            print(f"  (CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}; timing eagerly)")
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def copy_bandwidth_gbs() -> float:
    if Env.smoke:
        return 1.0
    x = torch.empty(1 << 30, dtype=torch.uint8, device=Env.device)
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=50, return_mode="median")
    return 2 * x.numel() / (t * 1e-3) / 1e9


def load_sglang():
    """(module namespace, source line) or (None, why)."""
    if not os.path.exists(os.path.join(SGLANG_DIR, "fused_moe_triton_kernels.py")):
        return None, "missing (run tools/fetch_sglang_fused_moe.sh here and carry third_party)"
    sys.path.insert(0, SGLANG_DIR)
    try:
        import fused_moe_triton_config as cfg
        import fused_moe_triton_kernels as kern
        import sglang_shim as shim
    except Exception as e:  # noqa: BLE001  (reported in the table, not fatal)
        return None, f"import failed: {e!r}"
    quant, _ = act_quant_fn()
    shim.set_act_quant(quant)
    return (kern, cfg), open(os.path.join(SGLANG_DIR, "SOURCE.txt")).read().strip().splitlines()[0]


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

    def __init__(self, sg, shape: Shape, wts: Weights, M: int):
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
