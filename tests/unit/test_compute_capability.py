"""The one compute-capability probe (platform.triton_host.compute_capability) and the refusals built on
it: the CUDA MLA decode needs SM90, the FP8 kernels 8.9 or newer. Triton's driver is replaced by a
stand-in reporting a chosen target, so every branch runs on a CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")

from paddle_mla.platform import triton_host  # noqa: E402


def _target(monkeypatch, backend: str, arch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    active = SimpleNamespace(get_current_target=lambda: SimpleNamespace(backend=backend, arch=arch))
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=active))


@pytest.mark.parametrize("backend, arch, want", [("cuda", 90, (9, 0)), ("cuda", 89, (8, 9)), ("cuda", 100, (10, 0)),
                                                 ("hip", "gfx942", None)])
def test_compute_capability_from_the_driver_target(monkeypatch, backend, arch, want):
    _target(monkeypatch, backend, arch)
    assert triton_host.compute_capability() == want


def test_compute_capability_without_a_driver(monkeypatch):
    def no_driver():
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    _target(monkeypatch, "cuda", 90)
    monkeypatch.setattr(triton.runtime.driver.active, "get_current_target", no_driver)
    assert triton_host.compute_capability() is None


def test_compute_capability_ignores_the_interpreter_flag(monkeypatch):
    """The op build on a GPU machine asks it even when the Triton kernels are interpreted."""
    _target(monkeypatch, "cuda", 90)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_host.compute_capability() == (9, 0)


def test_cuda_decode_names_the_capability_it_refuses(monkeypatch):
    from paddle_mla.platform import runtime

    if runtime.name() != "torch":
        pytest.skip("the CUDA decode's host side runs on the torch runtime")
    import torch

    from paddle_mla.attention.triton_mla import cuda_decode

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(cuda_decode, "compute_capability", lambda: (8, 0))
    assert cuda_decode.unavailable_reason(512, 576, torch.bfloat16, "cuda") == (
        "compute capability 8.0 (the kernel is sized for SM90)")
    monkeypatch.setattr(cuda_decode, "compute_capability", lambda: None)
    assert cuda_decode.unavailable_reason(512, 576, torch.bfloat16, "cuda") == "no CUDA device visible to Triton"


def test_fp8_kernels_refuse_below_8_9(monkeypatch):
    from paddle_mla.models import fp8
    from paddle_mla.platform import runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(fp8, "compute_capability", lambda: (8, 0))
    ok, why = fp8.fp8_kernels_available("gpu")
    assert not ok and "8.9" in why and "8.0" in why
    monkeypatch.setattr(fp8, "compute_capability", lambda: (9, 0))
    assert fp8.fp8_kernels_available("gpu") == (True, "")
    monkeypatch.setattr(fp8, "compute_capability", lambda: None)   # the launch decides
    ok, why = fp8.fp8_kernels_available("gpu")
    assert ok and "unknown" in why


def test_the_op_build_refuses_without_a_cuda_device(monkeypatch):
    from paddle_mla.platform import runtime

    if runtime.name() != "torch":
        pytest.skip("the op build module imports torch")
    from paddle_mla.ops import build

    monkeypatch.setattr(build, "compute_capability", lambda: None)
    with pytest.raises(RuntimeError, match="CUDA device"):
        build.arch_flags()
    monkeypatch.setattr(build, "compute_capability", lambda: (9, 0))
    assert build.arch_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
