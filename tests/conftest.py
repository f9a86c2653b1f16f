"""Selects the runtime (PADDLE_MLA_RUNTIME=paddle|torch) before any tensor module is imported,
and skips GPU / Triton tests where they cannot run."""

import os

import pytest

from paddle_mla.platform import runtime

runtime.select()


def pytest_sessionstart(session):
    # Build (or load from the cache) the custom ops once, up front, so no test pays the build
    # inside its own time limit.
    from paddle_mla.ops.build import load_ops

    load_ops()


def pytest_report_header(config):
    return f"paddle_mla runtime: {runtime.name()}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}"


def pytest_collection_modifyitems(config, items):
    gpu = runtime.gpu_available()
    triton_ok, why = runtime.supports_triton_on("gpu" if gpu else "cpu")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs these on the GPU machine)")
    skip_triton = pytest.mark.skip(reason=f"Triton kernels cannot launch here: {why}")
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        elif "triton" in item.keywords and not triton_ok:
            item.add_marker(skip_triton)
