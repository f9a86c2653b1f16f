"""Timers and measured rates. Medians throughout: ``triton.testing.do_bench`` (it flushes L2 between
runs) for kernels, CUDA events over graph replays for back-to-back calls, wall clock around
synchronizes where the timed thing includes host work or must run on either runtime."""

from __future__ import annotations

import time

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

import triton  # noqa: E402

from paddle_mla.platform.tensor_api import torch  # noqa: E402


def median_us(fn, warmup: int = 10, rep: int = 50, cpu: bool = False) -> float:
    """Median µs of ``fn`` by do_bench; ``cpu`` (the CPU smoke runs, no CUDA events): one timed call."""
    if cpu:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def graph_median_us(fn, use_graph: bool = True, cpu: bool = False) -> float:
    """Median µs of ``fn`` captured in a CUDA graph (launch overhead out, as in the engine's decode
    graphs), eager when capture fails; called once first (compiles). ``cpu``: one timed call."""
    fn()
    if cpu:
        return median_us(fn, cpu=True)
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
            return median_us(g.replay)
        except Exception as e:  # noqa: BLE001  (reported, then timed eagerly)
            print(f"  (CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}; timing eagerly)")
    return median_us(fn)


def graph_replay_median_us(fns, replays: int = 20) -> float:
    """Median µs of one call when ``fns`` (e.g. one per weight copy, so the weights come from HBM and
    not L2) run back to back in one CUDA graph, timed by CUDA events around each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()                                            # compile / warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    del g
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Measured device copy bandwidth, bytes/s (read + write of ``nbytes``): the roofline every
    memory-bound figure is compared with. Wall clock over 20 copies after 3 warm-ups (either runtime)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    runtime.synchronize()
    return 2 * x.numel() * 20 / (time.perf_counter() - t)


def gemm_rate(device: str, n: int, dtype) -> float:
    """Measured FLOP/s of an n^3 matmul in ``dtype``: the compute roofline."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    runtime.synchronize()
    iters = 10
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    runtime.synchronize()
    return 2 * n ** 3 * iters / (time.perf_counter() - t)
