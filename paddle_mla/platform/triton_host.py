"""Host-side helpers of kernel launches (no tensor imports): SM count, compute capability, device
index, launch-config overrides from the environment, the Triton interpreter flag, power-of-two
rounding."""

from __future__ import annotations

import functools
import os


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def dot_precision(dtype) -> str:
    """``tl.dot`` input precision for operands of ``dtype``: exact ("ieee") for float32, so fp32 runs
    agree with fp32 references whatever TRITON_F32_DEFAULT says and whichever module compiled the
    kernel first; "tf32" otherwise (ignored for 16-bit operands)."""
    return "ieee" if str(dtype).endswith("float32") else "tf32"


def env_overrides(name: str) -> dict[str, int]:
    """Launch-config overrides for tuning from environment variable ``name``: "key=int,key=int"."""
    text = os.environ.get(name, "")
    return {k.strip(): int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv.strip())}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def num_sms(device_index: int = 0) -> int:
    """Multiprocessor count of the GPU (runtime-neutral: asks Triton's driver); 4 under the interpreter."""
    if interpreting():
        return 4
    import triton

    props = triton.runtime.driver.active.utils.get_device_properties(device_index)
    return int(props["multiprocessor_count"])


def compute_capability() -> tuple[int, int] | None:
    """The current CUDA device's (major, minor); None where Triton sees no CUDA device (runtime-neutral:
    asks Triton's driver, so the torch and Paddle runtimes get one answer). The interpreter flag does
    not change it: the op build on a GPU machine needs the real target even then."""
    import triton

    try:
        target = triton.runtime.driver.active.get_current_target()
    except RuntimeError:   # no active driver: no GPU
        return None
    if target.backend != "cuda" or not isinstance(target.arch, int):
        return None
    return divmod(int(target.arch), 10)


def device_index(t) -> int:
    idx = getattr(t.device, "index", None)
    if idx is None:  # Paddle places: gpu:N
        s = str(t.place) if hasattr(t, "place") else str(t.device)
        idx = int(s.split(":")[-1].rstrip(")")) if ":" in s else 0
    return int(idx)
