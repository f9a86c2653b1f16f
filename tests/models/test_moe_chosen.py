"""The CPU MoE (``routed_moe_chosen``: only the chosen experts, each over its own tokens) against the
sync-free masked reference, the kernels' oracle: same values, also with ids of experts this rank
does not hold (expert parallel), experts no token chose, an empty batch; and the CPU layer uses it."""

import numpy as np
import pytest

from paddle_mla.models.fused_moe.reference import routed_moe_reference
from paddle_mla.models.moe import MoEExec, routed_moe_chosen
from paddle_mla.platform.tensor_api import torch


def _case(T, E, top_k, h=24, inter=10, seed=0, lo=0, hi=None, dtype=np.float32):
    g = np.random.default_rng(seed)
    t = lambda *s: torch.from_numpy(g.standard_normal(s).astype(dtype))  # noqa: E731
    ids = np.stack([g.choice(np.arange(lo, hi if hi is not None else E), top_k, replace=False) for _ in range(T)])
    w = g.random((T, top_k)).astype(dtype)
    return t(T, h), t(E, inter, h), t(E, inter, h), t(E, h, inter), torch.from_numpy(ids), torch.from_numpy(w)


@pytest.mark.parametrize("T,E,top_k", [(1, 4, 1), (13, 8, 2), (40, 64, 6), (5, 32, 8)])
def test_chosen_equals_masked(T, E, top_k):
    # float64: the two forms sum the same products in different orders (and the runtimes' CPU matmuls
    # block differently), so in fp32 outputs of magnitude ~100 differ in their last bits; in float64
    # that rounding is ~1e-13 and any real difference (a wrong expert, weight or token) stands out
    args = _case(T, E, top_k, seed=T, dtype=np.float64)
    np.testing.assert_allclose(routed_moe_chosen(*args).numpy(), routed_moe_reference(*args).numpy(),
                               rtol=1e-10, atol=1e-10)


def test_ids_outside_the_held_experts_add_nothing():
    """Expert parallel: rows of ids -3..8 where this rank holds 0..4; both forms skip the rest."""
    x, wg, wu, wd, ids, w = _case(17, 5, 3, lo=-3, hi=9, seed=3, dtype=np.float64)
    got, want = routed_moe_chosen(x, wg, wu, wd, ids, w), routed_moe_reference(x, wg, wu, wd, ids, w)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-10)
    outside = ((ids.numpy() < 0) | (ids.numpy() >= 5)).all(1)
    assert outside.any() and not got.numpy()[outside].any()


def test_empty_batch():
    x, wg, wu, wd, ids, w = _case(3, 4, 2)
    assert routed_moe_chosen(x[:0], wg, wu, wd, ids[:0], w[:0]).shape[0] == 0


def test_cpu_layer_runs_only_the_chosen(monkeypatch):
    import paddle_mla.models.moe as moe

    calls = []
    monkeypatch.setattr(moe, "routed_moe_chosen", lambda *a: calls.append(a) or a[0])
    monkeypatch.setenv("PADDLE_MLA_MOE", "auto")
    exec_ = MoEExec("cpu", torch.float32)
    assert exec_.impl == "reference"
    exec_.run(*_case(4, 4, 2))
    assert len(calls) == 1


def test_host_values_refuses_a_device_tensor():
    """The CPU MoE reads its routing through ``host_values``, which cannot hide a device-to-host read."""
    from paddle_mla.platform.staging import host_values

    ids = torch.tensor([[1, 2]], dtype=torch.int64)
    assert host_values(ids).tolist() == [[1, 2]]

    class OnDevice:
        device = "cuda:0"

    with pytest.raises(ValueError, match="device-to-host"):
        host_values(OnDevice())
