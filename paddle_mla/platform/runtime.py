"""Picks the tensor runtime once per process and owns what Paddle's torch proxy does not map.

Every tensor module of this package does ``import torch`` at module top level. On the paddle
runtime, ``paddle.compat.enable_torch_proxy(scope={"paddle_mla", "triton"})`` makes that name
resolve to Paddle, but only for modules imported *after* the proxy is enabled, and only at import
time (a function-level ``import torch`` would see the real torch once it is in ``sys.modules``).
Hence: the engine (``LLM``, ``ModelRunner``) calls ``select()`` before it imports tensor code, every
tensor module calls ``require_selected`` before its ``import torch``, no import selects a runtime,
and torch is never imported inside a function of a tensor module.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

RUNTIMES = ("auto", "paddle", "torch")
PROXY_SCOPE = {"paddle_mla", "triton"}

_selected: str | None = None


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _paddle_is_cpu_build() -> bool:
    """True when the installed Paddle is a CPU-only build, read from its version file without
    importing it (importing Paddle takes seconds and prints warnings)."""
    spec = importlib.util.find_spec("paddle")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        version_file = os.path.join(folder, "version", "__init__.py")
        if os.path.exists(version_file):
            with open(version_file, encoding="utf-8") as f:
                return any(line.replace(" ", "").startswith("cuda_version='False'") for line in f)
    return False


def _paddle_sees_gpu() -> bool:
    import paddle

    return paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def _torch_sees_gpu() -> bool:
    import torch  # real torch: this module is outside the proxy scope

    return torch.cuda.is_available()


def _resolve_auto() -> str:
    has_paddle, has_torch = _installed("paddle"), _installed("torch")
    if not (has_paddle or has_torch):
        raise RuntimeError(
            "paddle_mla needs a tensor runtime: pip install 'paddle-mla[torch]' or 'paddle-mla[paddle]'"
        )
    # A runtime that sees a GPU first (torch before paddle: only torch's GPU path has been run);
    # on CPU torch, which runs the tiny model about 3.8x faster than Paddle's proxy does.
    if has_torch and _torch_sees_gpu():
        return "torch"
    if has_paddle and not _paddle_is_cpu_build() and _paddle_sees_gpu():
        return "paddle"
    return "torch" if has_torch else "paddle"


def _import_real_torch_first() -> None:
    """Import the real torch, when installed, completely before the proxy is enabled.

    Once enabled, every lookup of a module in the proxy's scope (``triton``, ``paddle_mla.*``),
    even a bare ``importlib.util.find_spec("triton")``, runs inside
    ``use_torch_proxy_guard(enable=False)``, whose exit moves every ``torch*`` entry out of
    ``sys.modules`` into the proxy's cache. torch >= 2.14 probes ``find_spec("triton")`` while
    ``torch._native.ops`` is being imported, so a real ``import torch`` started after the proxy
    (by the user, or by transformers) loses its half-imported modules and dies with
    ``KeyError: 'torch._native.ops.bmm_outer_product'``. A torch that is already fully imported is
    kept in that cache and handed back to every ``import torch`` outside the scope, so the user's
    torch stays the real one. Costs the torch import time, only when torch is installed.
    """
    if "torch" in sys.modules or not _installed("torch"):
        return
    try:
        import torch  # noqa: F401 - the real torch: this module is outside the proxy scope

        # torch >= 2.15 imports these lazily, on first attribute access (transformers reaches
        # ``torch._dynamo.disable`` and ``torch._inductor.config``): after the proxy that lazy import
        # would lose its half-imported modules the same way, so it is done here too.
        import torch._dynamo  # noqa: F401
        import torch._inductor.config  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken torch install must not break the paddle runtime
        for mod in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
            del sys.modules[mod]


def select(name: str | None = None) -> str:
    """Select the runtime (idempotent). ``name`` None or 'auto' defers to ``PADDLE_MLA_RUNTIME``,
    then to detection; once a runtime is active it means "the active one" (the env var is only a
    default, so an engine that named the other runtime is not overruled by it later)."""
    global _selected
    if name is None or name.lower() == "auto":
        if _selected is not None:
            return _selected
        name = os.environ.get("PADDLE_MLA_RUNTIME")
    requested = (name or "auto").lower()
    if requested not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {requested!r}")
    if _selected is not None:
        if requested not in ("auto", _selected):
            raise RuntimeError(
                f"runtime {_selected!r} is already active in this process; cannot switch to {requested!r}"
            )
        return _selected
    chosen = _resolve_auto() if requested == "auto" else requested
    if not _installed(chosen):
        extra = "paddle" if chosen == "paddle" else "torch"
        raise RuntimeError(f"runtime {chosen!r} is not installed: pip install 'paddle-mla[{extra}]'")
    if chosen == "paddle":
        with warnings.catch_warnings():
            # importing Paddle warns "No ccache found" (about its own extension builds, irrelevant
            # here), which would otherwise precede the CLI's first line saying what runs
            warnings.filterwarnings("ignore", message="No ccache found")
            import paddle

        _import_real_torch_first()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            paddle.compat.enable_torch_proxy(scope=PROXY_SCOPE, silent=True)
    _selected = chosen
    from paddle_mla.platform import triton_interpreter_fix

    triton_interpreter_fix.apply()
    return chosen


def name() -> str:
    return select()


def version() -> str:
    """Version of the active runtime's framework (e.g. '2.14.1' for torch, '3.3.1' for paddle)."""
    if is_paddle():
        import paddle

        return paddle.__version__
    import torch

    return torch.__version__.split("+")[0]


def is_paddle() -> bool:
    return select() == "paddle"


def gpu_available() -> bool:
    return _paddle_sees_gpu() if is_paddle() else _torch_sees_gpu()


def gpu_count() -> int:
    """GPUs this process sees (0 without one); data-parallel replicas are placed over them."""
    if not gpu_available():
        return 0
    if is_paddle():
        import paddle

        return paddle.device.cuda.device_count()
    import torch

    return torch.cuda.device_count()


def device_name() -> str:
    """Name of the current GPU (e.g. 'NVIDIA H100 80GB HBM3')."""
    if is_paddle():
        import paddle

        return paddle.device.cuda.get_device_name()
    import torch

    return torch.cuda.get_device_name()


def device_string(kind: str) -> str:
    """'cpu' or 'gpu' -> the device string the active runtime's tensor factories accept."""
    if kind == "cpu":
        return "cpu"
    return "gpu" if is_paddle() else "cuda"


def resolve_device(kind: str) -> str:
    """Config ``device`` (auto|cpu|gpu) -> 'cpu' or 'gpu', failing clearly when no GPU is there."""
    if kind == "auto":
        return "gpu" if gpu_available() else "cpu"
    if kind == "gpu" and not gpu_available():
        raise RuntimeError(f"device: gpu was requested but the {name()} runtime sees no GPU")
    return kind


def synchronize() -> None:
    if is_paddle():
        import paddle

        if _paddle_sees_gpu():
            paddle.device.synchronize()
    else:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def supports_triton_on(device_kind: str) -> tuple[bool, str]:
    """Whether Triton kernels can launch here, and why not when they cannot."""
    if not _installed("triton"):
        return False, "triton is not installed"
    if device_kind == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "Triton kernels run on CPU only under TRITON_INTERPRET=1"
        if is_paddle():
            return False, "the Triton interpreter needs PyTorch tensors; use runtime: torch on CPU"
    return True, ""


def gpu_memory_info() -> tuple[int, int]:
    """(free, total) bytes of the current GPU."""
    if is_paddle():
        import paddle

        total = paddle.device.cuda.get_device_properties().total_memory
        used = paddle.device.cuda.memory_reserved()
        return total - used, total
    import torch

    return torch.cuda.mem_get_info()


def memory_allocated() -> int:
    """Bytes held by live tensors on the current GPU."""
    if is_paddle():
        import paddle

        return int(paddle.device.cuda.memory_allocated())
    import torch

    return int(torch.cuda.memory_allocated())


def memory_reserved() -> int:
    """Bytes the runtime's caching allocator holds on the current GPU (live tensors + its cache)."""
    if is_paddle():
        import paddle

        return int(paddle.device.cuda.memory_reserved())
    import torch

    return int(torch.cuda.memory_reserved())


def max_memory_allocated() -> int:
    """Peak of ``memory_allocated`` since the last ``reset_peak_memory``."""
    if is_paddle():
        import paddle

        return int(paddle.device.cuda.max_memory_allocated())
    import torch

    return int(torch.cuda.max_memory_allocated())


def reset_peak_memory() -> None:
    if is_paddle():
        import paddle

        paddle.device.cuda.reset_max_memory_allocated()
    else:
        import torch

        torch.cuda.reset_peak_memory_stats()


def require_selected(module: str) -> None:
    """Every tensor module calls this just before ``import torch`` / ``import triton``."""
    if _selected is None:
        raise ImportError(f"{module} imports tensor code: call paddle_mla.runtime.select() first")


class CudaGraph:
    """One captured CUDA graph, over the active runtime's graph API (the proxy does not map it).

    The paddle branch follows ``paddle.device.cuda.graphs.CUDAGraph``; it has not been run on a
    GPU (no Paddle GPU build was available to the project): see README, Runtimes.
    """

    def __init__(self, pool=None):
        self.pool = pool
        if is_paddle():
            from paddle.device.cuda.graphs import CUDAGraph as _PaddleGraph

            self._graph = _PaddleGraph()
        else:
            import torch

            self._graph = torch.cuda.CUDAGraph()

    def capture(self, fn):
        """Run ``fn`` once to warm up (compiles kernels), then capture it; returns its outputs."""
        if is_paddle():
            fn()
            self._graph.capture_begin()
            try:
                out = fn()
            finally:
                self._graph.capture_end()
            return out
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self._graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self._graph.replay()

    def pool_handle(self):
        return None if is_paddle() else self._graph.pool()


def empty_cache() -> None:
    """Return cached GPU memory to the driver (after an engine is closed)."""
    import gc

    gc.collect()
    if not gpu_available():
        return
    if is_paddle():
        import paddle

        paddle.device.cuda.empty_cache()
    else:
        import torch

        torch.cuda.empty_cache()
