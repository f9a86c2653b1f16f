"""The fused routing kernel (``route_kernel``) against ``moe.route_plain``, the plain form it
replaces on GPUs: under TRITON_INTERPRET=1 on CPU and on a GPU.

The same experts in the same order (random logits have no ties), and weights equal to a few fp32
units in the last place (the kernel sums in another order; softmax and sigmoid use another exp).
"""

import numpy as np
import pytest

from paddle_mla.platform import runtime

pytestmark = pytest.mark.triton

DEV = runtime.device_string("gpu" if runtime.gpu_available() else "cpu")


def _spec(E, k, method, scoring, groups, topk_group, norm, factor, after_norm=True, norm_min=0.0):
    from paddle_mla.models.arch import MoESpec

    return MoESpec(n_routed_experts=E, num_experts_per_tok=k, n_shared_experts=0, first_k_dense_replace=0,
                   topk_method=method, scoring_func=scoring, n_group=groups, topk_group=topk_group,
                   norm_topk_prob=norm, routed_scaling_factor=factor, scale_after_norm=after_norm, norm_min=norm_min)


SPECS = {
    "v2_lite": _spec(64, 6, "greedy", "softmax", 1, 1, False, 1.0, after_norm=False),
    "v2": _spec(160, 6, "group_limited_greedy", "softmax", 8, 3, False, 16.0, after_norm=False),  # groups of 20
    "v2_norm": _spec(160, 6, "group_limited_greedy", "softmax", 8, 3, True, 16.0, after_norm=False),
    "v3": _spec(256, 8, "noaux_tc", "sigmoid", 8, 4, True, 2.5),
    "v3_no_norm": _spec(256, 8, "noaux_tc", "sigmoid", 8, 4, False, 2.5),
    "ernie": _spec(64, 8, "noaux_tc", "softmax", 1, 1, True, 1.0),      # one group: bias-ranked softmax
    # moe_norm_min 0.8: rows whose top-8 probs sum below it are divided by 0.8, the others by their sum
    "ernie_norm_min": _spec(64, 8, "noaux_tc", "softmax", 1, 1, True, 1.0, norm_min=0.8),
    "odd": _spec(12, 3, "noaux_tc", "sigmoid", 3, 2, False, 1.5),       # groups of 4, 2 kept
    "top1": _spec(24, 1, "greedy", "softmax", 1, 1, True, 1.0, after_norm=False),
}


def _t(a, dev=DEV):
    from paddle_mla.platform.tensor_api import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dev)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("tokens", [1, 37])
def test_kernel_matches_plain_routing(name, tokens):
    from paddle_mla.models import fused_ops
    from paddle_mla.models.moe import route_plain
    from paddle_mla.models.route_kernel import route_call

    spec = SPECS[name]
    E = spec.n_routed_experts
    rng = np.random.default_rng(E + tokens)
    logits = rng.standard_normal((tokens, E)) * 2
    bias = rng.standard_normal(E) * 0.1 if spec.topk_method == "noaux_tc" else None
    args = fused_ops.route_kernel_args(spec)
    assert args is not None
    ids, w = route_call(_t(logits), _t(bias) if bias is not None else None, **args)
    want_ids, want_w = route_plain(spec, _t(logits, "cpu"), _t(bias, "cpu") if bias is not None else None)
    assert ids.shape == (tokens, spec.num_experts_per_tok) and str(ids.dtype).endswith("int64")
    np.testing.assert_array_equal(ids.cpu().numpy(), want_ids.numpy())
    np.testing.assert_allclose(w.cpu().numpy(), want_w.numpy(), rtol=4e-6, atol=0)


@pytest.mark.parametrize("name,extra", [("v2_lite", 2), ("v3", 1), ("top1", 3)])
def test_kernel_appends_shared_pieces(name, extra):
    """The shared experts' columns (``moe.fold_shared_experts``): ids E.., weight 1, after routed
    columns that are the plain form's, normalised and scaled without them."""
    from paddle_mla.models import fused_ops
    from paddle_mla.models.moe import route_plain
    from paddle_mla.models.route_kernel import route_call

    spec = SPECS[name]
    E, k = spec.n_routed_experts, spec.num_experts_per_tok
    rng = np.random.default_rng(7 * E + extra)
    logits = rng.standard_normal((9, E)) * 2
    bias = rng.standard_normal(E) * 0.1 if spec.topk_method == "noaux_tc" else None
    ids, w = route_call(_t(logits), _t(bias) if bias is not None else None, extra=extra,
                        **fused_ops.route_kernel_args(spec))
    want_ids, want_w = route_plain(spec, _t(logits, "cpu"), _t(bias, "cpu") if bias is not None else None)
    assert ids.shape == (9, k + extra)
    np.testing.assert_array_equal(ids[:, :k].cpu().numpy(), want_ids.numpy())
    np.testing.assert_array_equal(ids[:, k:].cpu().numpy(), np.tile(np.arange(E, E + extra), (9, 1)))
    np.testing.assert_allclose(w[:, :k].cpu().numpy(), want_w.numpy(), rtol=4e-6, atol=0)
    np.testing.assert_array_equal(w[:, k:].cpu().numpy(), np.ones((9, extra), np.float32))


def test_group_limit_takes_experts_from_kept_groups_only():
    """A row whose best expert sits in a group with a poor group score: group-limited routing must
    skip it (a greedy top-k would take it), in both forms."""
    from paddle_mla.models import fused_ops
    from paddle_mla.models.moe import route_plain
    from paddle_mla.models.route_kernel import route_call

    spec = _spec(8, 2, "noaux_tc", "sigmoid", 4, 2, True, 1.0)   # groups {0,1} {2,3} {4,5} {6,7}, 2 kept
    # group scores (sum of the two best): g0 0+0 low, g1 high, g2 high, g3 has the best single expert
    logits = np.array([[-4.0, -4.0, 2.0, 1.5, 1.8, 1.2, 3.0, -6.0]])
    ids, w = route_call(_t(logits), _t(np.zeros(8)), **fused_ops.route_kernel_args(spec))
    want_ids, want_w = route_plain(spec, _t(logits, "cpu"), _t(np.zeros(8), "cpu"))
    assert sorted(ids.cpu().numpy()[0].tolist()) == [2, 4]   # expert 6 is best alone, its group is not kept
    np.testing.assert_array_equal(ids.cpu().numpy(), want_ids.numpy())
    np.testing.assert_allclose(w.cpu().numpy(), want_w.numpy(), rtol=4e-6, atol=0)



def _dense(ids, w, E):
    """[T, E] weight of each expert (0 where not picked)."""
    out = np.zeros((ids.shape[0], E), np.float32)
    np.put_along_axis(out, ids, w, 1)
    return out


def test_group_limited_top_k_past_the_kept_groups_weighs_the_rest_0():
    """group_limited_greedy with top-3 of 8 experts in 4 groups, 1 kept (2 experts): the kept group's
    two experts weigh their softmax scores, the third pick (outside it) 0, as in transformers'
    DeepseekV2. Which zero-weight expert fills the third column is a tie, so the forms compare per expert."""
    from paddle_mla.models import fused_ops
    from paddle_mla.models.moe import route_plain
    from paddle_mla.models.route_kernel import route_call

    spec = _spec(8, 3, "group_limited_greedy", "softmax", 4, 1, False, 1.0, after_norm=False)
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((37, 8)) * 2
    ids, w = route_call(_t(logits), None, **fused_ops.route_kernel_args(spec))
    want_ids, want_w = route_plain(spec, _t(logits, "cpu"))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    kept = probs.reshape(37, 4, 2).max(2).argmax(1)
    expect = np.zeros((37, 8), np.float32)
    for t, g in enumerate(kept):
        expect[t, 2 * g:2 * g + 2] = probs[t, 2 * g:2 * g + 2]
    for got_ids, got_w in ((want_ids.numpy(), want_w.numpy()), (ids.cpu().numpy(), w.cpu().numpy())):
        assert all(len(set(row)) == 3 for row in got_ids.tolist())
        np.testing.assert_allclose(_dense(got_ids, got_w, 8), expect, rtol=4e-6, atol=0)


def test_routing_args_refuse_what_the_kernel_cannot_do():
    from paddle_mla.models import fused_ops

    assert fused_ops.route_kernel_args(_spec(64, 6, "greedy", "softmax", 1, 1, False, 1.0)) is not None
    assert fused_ops.route_kernel_args(_spec(64, 6, "greedy", "relu", 1, 1, False, 1.0)) is None
    assert fused_ops.route_kernel_args(_spec(64, 6, "topk_other", "softmax", 1, 1, False, 1.0)) is None
    assert fused_ops.route_kernel_args(_spec(60, 6, "noaux_tc", "sigmoid", 8, 4, True, 1.0)) is None   # 60 % 8
    assert fused_ops.route_kernel_args(_spec(64, 6, "noaux_tc", "sigmoid", 8, 9, True, 1.0)) is None
    assert fused_ops.route_kernel_args(_spec(64, 40, "greedy", "softmax", 1, 1, False, 1.0)) is None
    assert fused_ops.route_kernel_args(_spec(8, 2, "noaux_tc", "sigmoid", 8, 4, True, 1.0)) is None   # groups of 1


@pytest.mark.parametrize("name", ["v2_lite", "v2", "v3"])
def test_a_row_of_nan_logits_still_routes_to_experts_of_the_model(name):
    """A NaN logit (softmax: the whole row's scores) must not make the kernel pick past the experts:
    the MoE's one-token path indexes the weights by these ids. The other rows are untouched."""
    from paddle_mla.models import fused_ops
    from paddle_mla.models.moe import route_plain
    from paddle_mla.models.route_kernel import route_call

    spec = SPECS[name]
    E, k = spec.n_routed_experts, spec.num_experts_per_tok
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, E))
    logits[1, 5] = np.nan
    logits[2, :] = np.nan
    bias = rng.standard_normal(E) * 0.1 if spec.topk_method == "noaux_tc" else None
    ids, w = route_call(_t(logits), _t(bias) if bias is not None else None, **fused_ops.route_kernel_args(spec))
    ids = ids.cpu().numpy()
    for row in ids:
        assert ((row >= 0) & (row < E)).all() and len(set(row.tolist())) == k, row
    want_ids, want_w = route_plain(spec, _t(logits[:1], "cpu"), _t(bias, "cpu") if bias is not None else None)
    np.testing.assert_array_equal(ids[:1], want_ids.numpy())
    np.testing.assert_allclose(w.cpu().numpy()[:1], want_w.numpy(), rtol=4e-6, atol=0)
