"""Builds and loads the per-step metadata custom ops (custom_ops/) for the active runtime.

``load_ops()`` returns a namespace of Python callables with the signatures of
``paddle_mla.ops.reference`` backed by the compiled ops, or None (then the callers use the
reference; one warning per process says why). The ops are compiled on first use, once per process,
into a cache folder keyed by a hash of the sources, the runtime version and the build flags, so
later processes only load the shared library:

    $PADDLE_MLA_CACHE (default ~/.cache/paddle_mla/ops) / <runtime>-<cpu|cuda>-<hash>/

CUDA kernels are compiled in only when nvcc exists and the runtime sees a GPU. Paddle gets custom
operators (PD_BUILD_OP, paddle.utils.cpp_extension), PyTorch gets torch.library operators
(torch.utils.cpp_extension). This module is the custom-op loading that docs/architecture.md
gives to the platform layer, so it is the one other place allowed to branch on the runtime.

A failed build is remembered: ``failed.json`` in that folder makes later processes skip the build
(it costs seconds each time, counted in their throughput) until the folder's key changes (sources,
runtime version, flags) or the C++ compiler found changes. The warning is two short lines; the
compiler output and the error are in build.log.

Env: ``PADDLE_MLA_DISABLE_CUSTOM_OPS=1`` uses the reference without building or warning;
``PADDLE_MLA_OPS_REBUILD=1`` retries a remembered failed build (so does deleting the folder);
``PADDLE_MLA_OPS_VERBOSE=1`` shows the compiler output instead of writing it to build.log.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # the real torch on the torch runtime; used only there

from paddle_mla.platform import runtime
from paddle_mla.ops import reference
from paddle_mla.ops.build_output import logging_off, output_to
from paddle_mla.platform.triton_host import compute_capability

# the cache key covers every kernel source of custom_ops/ (kernel_sources): a header left out of a
# hand-kept list would leave a stale build after its edit
KERNEL_SUFFIXES = (".h", ".cuh", ".cu")
CUDA_SOURCES = ("metadata_kernels.cu", "append_attention_kernels.cu", "mla_decode_kernels.cu")
BINDINGS = {"paddle": ("paddle_binding.cc", "paddle_binding_attention.cc", "paddle_binding_mla.cc"),
            "torch": ("torch_binding.cc", "torch_binding_attention.cc", "torch_binding_mla.cc")}
LIB_NAME = "paddle_mla_ops"
CXX_FLAGS = ["-O3"]  # the C++ standard comes from the framework (torch 2.14 headers need C++20)
CUDA_FLAGS = ["-O3"]
OP_NAMES = ("get_position_ids", "get_cu_seqlens", "compute_slot_mapping")


@dataclass(frozen=True)
class CompiledOps:
    """The compiled ops as plain callables, reference signatures; outputs are new tensors."""

    get_position_ids: Callable[..., Any]
    get_cu_seqlens: Callable[..., Any]
    compute_slot_mapping: Callable[..., Any]
    # (q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_k, batch_id_per_token, positions,
    #  cos_sin, out, workspace, softmax_scale, neox, rot_dim, num_swa_heads, window, sink, swa_mask,
    #  decode_only, batch_invariant, invariant_split): updates k_cache, v_cache, out in place; see
    #  paddle_mla/ops/append_attention.py
    append_attention: Callable[..., Any]
    mla_decode: Callable[..., Any]  # writes out in place; GPU only; see paddle_mla/ops/mla_decode.py
    mla_sparse: Callable[..., Any]  # writes out (or the partials) in place; GPU only; the same module
    runtime: str
    with_cuda: bool
    build_dir: str
    build_seconds: float  # 0.0 when loaded from the cache


@dataclass
class _State:
    loaded: bool = False
    ops: CompiledOps | None = None
    reason: str = ""  # why ops is None
    warned: set[str] = field(default_factory=set)


_state = _State()


def load_ops() -> CompiledOps | None:
    """The compiled ops, building them on first use; None (with one warning) when unavailable."""
    if not _state.loaded:
        _state.ops = _load_or_none()
        _state.loaded = True
    return _state.ops


def unavailable_reason() -> str:
    """Why ``load_ops()`` returned None ('' when the compiled ops are loaded)."""
    load_ops()
    return _state.reason


def warn_once(key: str, message: str) -> None:
    """One warning per process, shown as just ``message`` (no source line under it)."""
    if key not in _state.warned:
        _state.warned.add(key)
        warnings.warn_explicit(message, RuntimeWarning, filename="paddle_mla", lineno=0, module=__name__)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


class BuildFailed(RuntimeError):
    """The op build failed, now or in an earlier process (``remembered``); details in ``log``."""

    def __init__(self, detail: str, log: Path, remembered: bool):
        super().__init__(detail)
        self.detail, self.log, self.remembered = detail, log, remembered


def _load_or_none() -> CompiledOps | None:
    if _env_flag("PADDLE_MLA_DISABLE_CUSTOM_OPS"):
        _state.reason = "disabled by PADDLE_MLA_DISABLE_CUSTOM_OPS"
        return None
    try:
        return _build_and_load()
    except Exception as exc:  # noqa: BLE001 - any build failure degrades to the reference
        log = exc.log if isinstance(exc, BuildFailed) else None
        detail = exc.detail if isinstance(exc, BuildFailed) else _first_line(exc)
        when = "in an earlier run" if getattr(exc, "remembered", False) else ""
        _state.reason = f"build failed{' ' + when if when else ''}: {detail}"
        warn_once("fallback", fallback_warning(runtime.name(), log, when))
        return None


def fallback_warning(rt: str, log: Path | None, when: str = "") -> str:
    """The two lines a failed build prints: what failed; where the log is, how to retry or silence."""
    where = f"log: {log}" if log else "no build log"
    return (f"paddle_mla custom ops ({rt}) failed to build{' ' + when if when else ''}; "
            "using the slower plain-tensor reference\n"
            f"  {where}; retry: PADDLE_MLA_OPS_REBUILD=1; silence: PADDLE_MLA_DISABLE_CUSTOM_OPS=1")


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    first = f"{type(exc).__name__}: {first}"
    return first if len(first) <= limit else first[: limit - 3] + "..."


def sources_dir() -> Path:
    """custom_ops/ of the source tree (editable install), else the copy a wheel carries."""
    for cand in (Path(__file__).resolve().parents[2] / "custom_ops", Path(__file__).resolve().parent / "_custom_ops"):
        if (cand / CUDA_SOURCES[0]).is_file():
            return cand
    raise FileNotFoundError("custom_ops sources not found (install with pip install -e .)")


def kernel_sources(src: Path) -> list[str]:
    """The kernel sources (headers and .cu files, every runtime's) of the custom_ops folder ``src``."""
    return sorted(p.name for p in src.iterdir() if p.suffix in KERNEL_SUFFIXES)


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found = shutil.which("nvcc") or str(Path(home) / "bin" / "nvcc")
    return found if os.path.isfile(found) else None


def wants_cuda() -> bool:
    return nvcc_path() is not None and runtime.gpu_available()


def cache_root() -> Path:
    return Path(os.environ.get("PADDLE_MLA_CACHE") or Path.home() / ".cache" / "paddle_mla" / "ops")


def build_dir(rt: str, with_cuda: bool, arch: list[str]) -> Path:
    src = sources_dir()
    h = hashlib.sha256()
    for name in (*kernel_sources(src), *BINDINGS[rt]):
        h.update(name.encode() + b"\0" + (src / name).read_bytes())
    h.update(json.dumps([rt, _runtime_version(rt), sys.version, platform.machine(), with_cuda,
                         CXX_FLAGS, CUDA_FLAGS, arch]).encode())
    return cache_root() / f"{rt}-{'cuda' if with_cuda else 'cpu'}-{h.hexdigest()[:16]}"


def _runtime_version(rt: str) -> str:
    if rt == "paddle":
        import paddle

        return f"{paddle.__version__}-{paddle.version.commit}"
    return torch.__version__


def compiler_id() -> str:
    """The C++ compiler a build would use (part of the failure memo: a new compiler retries)."""
    cxx = os.environ.get("CXX") or "c++"
    return shutil.which(cxx) or f"{cxx} (not found)"


def _build_and_load() -> CompiledOps:
    rt = runtime.name()
    with_cuda = wants_cuda()
    arch = arch_flags() if with_cuda else []
    out = build_dir(rt, with_cuda, arch)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent first uses build once; the others wait, then load
        marker, failed, log = out / "built.json", out / "failed.json", out / "build.log"
        start = time.perf_counter()
        cached = marker.is_file()
        lib = json.loads(marker.read_text())["library"] if cached else None
        module = None  # Paddle's op API module when the build just made (and registered) it
        if lib is None or not Path(lib).is_file():
            _raise_if_failed_before(failed, log)
            try:
                lib, module = _compile(rt, with_cuda, arch, out)
            except Exception as exc:
                detail = _first_line(exc)
                with open(log, "a") as f:
                    f.write(f"\npaddle_mla: build failed: {exc}\n")
                failed.write_text(json.dumps({"error": detail, "compiler": compiler_id(), "log": str(log)}))
                raise BuildFailed(detail, log, remembered=False) from exc
            failed.unlink(missing_ok=True)
            marker.write_text(json.dumps({"library": lib, "seconds": round(time.perf_counter() - start, 2)}))
            cached = False
        ops = _bind(rt, lib, module)
    seconds = 0.0 if cached else time.perf_counter() - start
    return CompiledOps(**ops, runtime=rt, with_cuda=with_cuda, build_dir=str(out), build_seconds=seconds)


def _raise_if_failed_before(failed: Path, log: Path) -> None:
    """A build that failed in an earlier process is not retried (PADDLE_MLA_OPS_REBUILD=1 forces it)."""
    if not failed.is_file() or _env_flag("PADDLE_MLA_OPS_REBUILD"):
        return
    try:
        memo = json.loads(failed.read_text())
    except (OSError, ValueError):
        return  # unreadable memo: retry
    if memo.get("compiler") != compiler_id():
        return  # another compiler now: worth a retry
    raise BuildFailed(memo.get("error", "see the log"), log, remembered=True)


def _compile(rt: str, with_cuda: bool, arch: list[str], out: Path) -> tuple[str, Any]:
    """Compile into ``out`` and load; returns the shared library's path and Paddle's op module
    (None on torch). Compiler output goes to build.log."""
    src = sources_dir()
    sources = [str(src / name) for name in BINDINGS[rt] + (CUDA_SOURCES if with_cuda else ())]
    defines = ["-DPADDLE_MLA_WITH_CUDA"] if with_cuda else []
    verbose = _env_flag("PADDLE_MLA_OPS_VERBOSE")
    with output_to(None if verbose else out / "build.log"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if rt == "paddle":
            from paddle.utils import cpp_extension

            module = cpp_extension.load(name=LIB_NAME, sources=sources, extra_cxx_cflags=CXX_FLAGS + defines,
                               extra_cuda_cflags=CUDA_FLAGS + defines + arch, extra_include_paths=[str(src)],
                               build_directory=str(out), verbose=verbose)
            lib = out / LIB_NAME / f"{LIB_NAME}.so"
        else:
            from torch.utils import cpp_extension

            module = None
            lib = Path(cpp_extension.load(name=LIB_NAME, sources=sources, extra_cflags=CXX_FLAGS + defines,
                                          extra_cuda_cflags=CUDA_FLAGS + defines + arch,
                                          extra_include_paths=[str(src)],
                                          build_directory=str(out), verbose=verbose, with_cuda=with_cuda,
                                          is_python_module=False))
    if not lib.is_file():
        raise FileNotFoundError(f"build finished but {lib} is missing")
    return str(lib), module


def arch_flags() -> list[str]:
    """nvcc's target for the current GPU. A 9.0 device gets sm_90a, the Hopper-specific target whose
    warpgroup MMA the MLA decode kernel needs (custom_ops/wgmma.cuh); plain sm_90 has no wgmma. (An
    arch flag in the extra CUDA flags also replaces torch's own choice of targets.)"""
    found = compute_capability()
    if found is None:
        raise RuntimeError("building the CUDA ops needs a CUDA device, and Triton sees none")
    cc = f"{found[0]}{found[1]}{'a' if found == (9, 0) else ''}"
    return [f"-gencode=arch=compute_{cc},code=sm_{cc}"]


def _bind(rt: str, lib: str, module: Any) -> dict[str, Callable[..., Any]]:
    if rt == "paddle":
        module = module or _paddle_module(lib)
        ops = {
            "get_position_ids": lambda enc, dec, this, n: module.pmla_get_position_ids(enc, dec, this, int(n)),
            "get_cu_seqlens": lambda this, dec, n: tuple(module.pmla_get_cu_seqlens(this, dec, int(n))),
            "compute_slot_mapping": lambda tables, ids, pos, bs: module.pmla_compute_slot_mapping(
                tables, ids, pos, int(bs)),
            "append_attention": lambda *args: module.pmla_append_attention(*args[:13], float(args[13]), *args[14:]),
            "mla_decode": lambda *args: module.pmla_mla_decode(*args[:11], int(args[11]), float(args[12]),
                                                               *(int(x) for x in args[13:])),
            "mla_sparse": lambda *args: module.pmla_mla_sparse(*args[:7], *(int(x) for x in args[7:10]),
                                                               float(args[10])),
        }
        on_gpu = lambda x: x.place.is_gpu_place()
    else:
        torch.ops.load_library(lib)
        _register_torch_fakes()
        ns = torch.ops.paddle_mla
        ops = {
            "get_position_ids": lambda enc, dec, this, n: ns.get_position_ids(enc, dec, this, int(n)),
            "get_cu_seqlens": lambda this, dec, n: ns.get_cu_seqlens(this, dec, int(n)),
            "compute_slot_mapping": lambda tables, ids, pos, bs: ns.compute_slot_mapping(tables, ids, pos, int(bs)),
            "append_attention": ns.append_attention,
            "mla_decode": ns.mla_decode,
            "mla_sparse": ns.mla_sparse,
        }
        on_gpu = lambda x: x.is_cuda
    if wants_cuda():
        return ops
    # append_attention and the MLA ops have no twin in ops.reference: their wrappers check with_cuda
    return {name: fn if name in ("append_attention", "mla_decode", "mla_sparse") else _cpu_only(name, fn, on_gpu)
            for name, fn in ops.items()}


def _cpu_only(name: str, fn: Callable[..., Any], on_gpu: Callable[[Any], bool]) -> Callable[..., Any]:
    """A CPU-only build meets GPU tensors (no nvcc here): run the reference for those."""
    ref = getattr(reference, name)

    def call(first, *args):
        if on_gpu(first):
            warn_once("cpu-only", "paddle_mla custom ops were built without CUDA (nvcc not found); "
                                  "GPU metadata uses the plain-tensor reference")
            return ref(first, *args)
        return fn(first, *args)

    return call


def _paddle_module(lib: str):
    """Register a cached library's operators and return their Python API module (what
    cpp_extension.load returns, without its setup.py subprocess, which costs seconds)."""
    with warnings.catch_warnings(), logging_off():
        warnings.simplefilter("ignore")  # its import warns that ccache is missing
        from paddle.utils.cpp_extension import extension_utils

        return extension_utils._import_module_from_library(LIB_NAME, str(Path(lib).parent), False)


def _register_torch_fakes() -> None:
    """Shape-only kernels so that torch.compile / opcheck can trace the ops."""
    if not hasattr(torch.library, "register_fake"):
        return

    @torch.library.register_fake("paddle_mla::get_position_ids")
    def _(enc, dec, this, num_tokens):
        return enc.new_empty((num_tokens,), dtype=torch.int64)

    @torch.library.register_fake("paddle_mla::get_cu_seqlens")
    def _(this, dec, num_tokens):
        b = this.shape[0] + 1
        i32 = torch.int32
        return (this.new_empty((b,), dtype=i32), this.new_empty((b,), dtype=i32),
                this.new_empty((num_tokens,), dtype=i32))

    @torch.library.register_fake("paddle_mla::compute_slot_mapping")
    def _(tables, ids, pos, block_size):
        return pos.new_empty(pos.shape, dtype=torch.int64)

    @torch.library.register_fake("paddle_mla::append_attention")
    def _(q, k, v, k_cache, v_cache, tables, cu_q, lens, ids, pos, cos_sin, out, ws, scale, neox, rot, swa, window,
          sink, swa_mask, decode_only, batch_invariant, invariant_split):
        return None  # mutates k_cache, v_cache, out

    torch.library.register_fake("paddle_mla::mla_decode")(lambda *args: None)  # mutates out and the partials
    torch.library.register_fake("paddle_mla::mla_sparse")(lambda *args: None)


def main() -> int:
    """Build (or load) the ops for the runtime PADDLE_MLA_RUNTIME selects; used by setup.py."""
    ops = load_ops()
    if ops is None:
        print(f"paddle_mla: custom ops for {runtime.name()} not built; the reference will be used")
        return 1
    how = f"built in {ops.build_seconds:.1f} s" if ops.build_seconds else "loaded from the cache"
    print(f"paddle_mla: {runtime.name()} custom ops ({'cuda' if ops.with_cuda else 'cpu'}) {how}: {ops.build_dir}")
    return 0
