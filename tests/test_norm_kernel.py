"""The fused RMSNorm (+ residual add) Triton kernel vs the plain-tensor form it replaces on GPUs.

Under TRITON_INTERPRET=1 on CPU (float32/float16, the interpreter has no bfloat16) and on a GPU
(bf16 too). The kernel rounds at the same points as the plain form (the sum to the model dtype, the
normalised row to the model dtype, the product with the weight); only the fp32 reduction order
differs, so 16-bit outputs may differ by one unit in the last place and fp32 outputs by rounding.
"""

import numpy as np
import pytest

from paddle_mla import runtime

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")
DTYPES = ["float32", "float16"] + (["bfloat16"] if DEV != "cpu" else [])


@pytest.fixture(scope="module")
def mods():
    from paddle_mla.models import norm, norm_kernels

    return norm, norm_kernels


def _ulp(dtype_name: str) -> float:
    return {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype_name]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 64), (3, 4, 100), (33, 2048)])
def test_kernel_matches_plain_rms_norm(mods, dtype_name, shape):
    norm, kern = mods
    from paddle_mla.tensor_api import torch

    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(sum(shape))
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 3).to(DEV).to(dtype)
    d = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(DEV).to(dtype)
    w = torch.from_numpy(rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)).to(DEV).to(dtype)
    _, y = kern.rms_norm_kernel_call(x, None, w, 1e-6)
    ref = norm._rms_norm_plain(x, w, 1e-6)
    tol = 2 * _ulp(dtype_name) * float(ref.abs().max()) + 1e-6
    assert y.dtype == dtype and y.shape == x.shape
    assert float((y.float() - ref.float()).abs().max()) <= tol
    h, y2 = kern.rms_norm_kernel_call(x, d, w, 1e-6)
    assert torch.equal(h, x + d)   # the residual sum rounds exactly as ``x + d`` does
    ref2 = norm._rms_norm_plain(x + d, w, 1e-6)
    assert float((y2.float() - ref2.float()).abs().max()) <= 2 * _ulp(dtype_name) * float(ref2.abs().max()) + 1e-6


def test_empty_rows(mods):
    _, kern = mods
    from paddle_mla.tensor_api import torch

    x = torch.zeros(0, 16, device=DEV)
    h, y = kern.rms_norm_kernel_call(x, x, torch.ones(16, device=DEV), 1e-6)
    assert y.shape == (0, 16) and h.shape == (0, 16)
