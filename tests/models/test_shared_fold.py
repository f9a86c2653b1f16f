"""Shared experts folded into the routed stacks (``moe.fold_shared_experts``): the layer's sum is the
one the separate shared MLP gives, for one and several pieces, plain and FP8; the refusals keep the
MLP apart. The model oracles (test_model_oracle, test_gqa_oracle) check the folded layers against
transformers end to end; these check the fold itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from paddle_mla.models.arch import MoESpec
from paddle_mla.models.deepseek import DenseMLP
from paddle_mla.models.fp8 import Fp8Weight
from paddle_mla.models.moe import MoE, MoEExec, fold_shared_experts, route
from paddle_mla.platform import runtime
from paddle_mla.platform.tensor_api import torch

E, H, INTER, T = 6, 16, 8, 11


def _spec(top_k=2, **kw):
    base = dict(n_routed_experts=E, num_experts_per_tok=top_k, n_shared_experts=1, first_k_dense_replace=0,
                topk_method="greedy", scoring_func="softmax", n_group=1, topk_group=1,
                norm_topk_prob=True, routed_scaling_factor=2.5, scale_after_norm=False)
    return MoESpec(**{**base, **kw})


def _weights(pieces: int, seed: int = 0, bias: bool = False) -> dict:
    g = np.random.default_rng(seed)
    t = lambda *s: torch.from_numpy((g.standard_normal(s) * 0.3).astype(np.float32))  # noqa: E731
    w = {"m.gate.weight": t(E, H), "m.experts.gate": t(E, INTER, H), "m.experts.up": t(E, INTER, H),
         "m.experts.down": t(E, H, INTER), "m.shared_experts.gate_proj.weight": t(pieces * INTER, H),
         "m.shared_experts.up_proj.weight": t(pieces * INTER, H),
         "m.shared_experts.down_proj.weight": t(H, pieces * INTER)}
    if bias:
        w["m.shared_experts.down_proj.bias"] = t(H)
    return w


def _apart(spec, w, x):
    """The layer with the shared MLP computed on its own, as transformers does (in fp32 here)."""
    exec_ = MoEExec("cpu", torch.float32)
    ids, weights = route(spec, x, w["m.gate.weight"])
    routed = exec_.run(x, w["m.experts.gate"], w["m.experts.up"], w["m.experts.down"], ids, weights)
    return routed + DenseMLP(w, "m.shared_experts.").forward(x)


@pytest.mark.parametrize("pieces", [1, 2, 3])
@pytest.mark.parametrize("tokens", [11, 100])
def test_folded_layer_equals_separate_shared_mlp(pieces, tokens):
    """Up to FOLD_MAX_TOKENS the pieces run in the routed sum; past it the shared MLP runs apart over
    the stacks' rows. Both give the separate MLP's layer."""
    from paddle_mla.models.moe import FOLD_MAX_TOKENS

    spec = _spec()
    w = _weights(pieces)
    x = torch.from_numpy((np.random.default_rng(1).standard_normal((tokens, H))).astype(np.float32))
    want = _apart(spec, dict(w), x)
    moe = MoE(SimpleNamespace(moe=spec), w, "m.", MoEExec("cpu", torch.float32), DenseMLP)
    assert moe.shared_pieces == pieces and moe.folds_shared(tokens) == (tokens <= FOLD_MAX_TOKENS)
    assert tuple(moe.w_gate.shape) == (E + pieces, INTER, H) and moe.pairs_per_token == 2 + pieces
    assert "m.experts.gate" not in w and "m.shared_experts.down_proj.weight" not in w   # the dict let go
    # the apart form reads the stacks' rows: gate and up are views of them
    assert moe.shared.gate.data_ptr() == moe.w_gate[E:].data_ptr()
    assert moe.shared.up.data_ptr() == moe.w_up[E:].data_ptr()
    got = moe.forward(x)
    assert float(want.abs().max()) > 0.1
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_deterministic_mode_folds_every_call():
    """Under ``deterministic: true`` a row's sum must not follow the batch: one form for all sizes."""
    from paddle_mla.models.moe import FOLD_MAX_TOKENS
    from paddle_mla.ops import batch_invariant

    moe = MoE(SimpleNamespace(moe=_spec()), _weights(2), "m.", MoEExec("cpu", torch.float32), DenseMLP)
    big = FOLD_MAX_TOKENS + 1
    assert not moe.folds_shared(big)
    batch_invariant.set_enabled(True)
    try:
        assert moe.folds_shared(big) and moe.folds_shared(1)
    finally:
        batch_invariant.set_enabled(False)


def test_route_appends_the_pieces_with_weight_one():
    spec = _spec(top_k=3)
    w = _weights(1)
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((T, H)).astype(np.float32))
    ids, weights = route(spec, x, w["m.gate.weight"])
    ids2, weights2 = route(spec, x, w["m.gate.weight"], shared_pieces=2)
    assert tuple(ids2.shape) == (T, 5)
    np.testing.assert_array_equal(ids2[:, :3].numpy(), ids.numpy())
    np.testing.assert_array_equal(ids2[:, 3:].numpy(), np.tile([E, E + 1], (T, 1)))
    np.testing.assert_array_equal(weights2[:, :3].numpy(), weights.numpy())
    np.testing.assert_array_equal(weights2[:, 3:].numpy(), np.ones((T, 2), np.float32))


def test_fp8_pieces_cut_on_block_edges():
    """FP8 weights: the pieces carry their own scale blocks, so dequantized they are the shared
    MLP's rows and columns."""
    g = np.random.default_rng(3)
    inter, h, n, blk = 4, 8, 2, (2, 2)

    def fp8(rows, cols, lead=()):
        w = torch.from_numpy(g.standard_normal((*lead, rows, cols)).astype(np.float32))
        s = torch.from_numpy(g.uniform(0.5, 2, (*lead, rows // blk[0], cols // blk[1])).astype(np.float32))
        return Fp8Weight(w, s, blk, False)
    routed = [fp8(inter, h, (E,)), fp8(inter, h, (E,)), fp8(h, inter, (E,))]
    shared = SimpleNamespace(gate=fp8(n * inter, h), up=fp8(n * inter, h), down=fp8(h, n * inter),
                             gate_b=None, up_b=None, down_b=None)
    (gate, up, down), pieces = fold_shared_experts(routed, shared)
    assert pieces == n
    deq = lambda t: t.dequantize(torch.float32).numpy()  # noqa: E731
    np.testing.assert_array_equal(deq(gate)[:E], deq(routed[0]))
    np.testing.assert_array_equal(deq(gate)[E:].reshape(n * inter, h), deq(shared.gate))
    np.testing.assert_array_equal(deq(up)[E:].reshape(n * inter, h), deq(shared.up))
    for p in range(n):
        np.testing.assert_array_equal(deq(down)[E + p], deq(shared.down)[:, p * inter:(p + 1) * inter])


def test_refusals_keep_the_shared_mlp():
    spec = _spec()
    # a bias on the shared MLP (ERNIE's use_bias): no piece can carry it
    moe = MoE(SimpleNamespace(moe=spec), _weights(1, bias=True), "m.", MoEExec("cpu", torch.float32), DenseMLP)
    assert moe.shared is not None and moe.shared_pieces == 0 and moe.w_gate.shape[0] == E
    assert not moe.folds_shared(1)
    # a width that is not a multiple of the routed one
    w = _weights(1)
    for k in ("gate_proj", "up_proj"):
        w[f"m.shared_experts.{k}.weight"] = w[f"m.shared_experts.{k}.weight"][:INTER - 2]
    w["m.shared_experts.down_proj.weight"] = w["m.shared_experts.down_proj.weight"][:, :INTER - 2].contiguous()
    moe = MoE(SimpleNamespace(moe=spec), w, "m.", MoEExec("cpu", torch.float32), DenseMLP)
    assert moe.shared is not None and moe.shared_pieces == 0
    # plain shared weights beside FP8 routed ones
    routed = [Fp8Weight(torch.zeros(E, INTER, H), torch.ones(E, 1, 1), (INTER, H), False)] * 2 + \
             [Fp8Weight(torch.zeros(E, H, INTER), torch.ones(E, 1, 1), (H, INTER), False)]
    mlp = DenseMLP(_weights(1), "m.shared_experts.")
    assert fold_shared_experts(routed, mlp) is None
    # expert parallel (this rank holds fewer experts than the model): kept apart
    w = _weights(1)
    for k in ("gate", "up", "down"):
        w[f"m.experts.{k}"] = w[f"m.experts.{k}"][:E // 2]
    moe = MoE(SimpleNamespace(moe=spec), w, "m.", MoEExec("cpu", torch.float32), DenseMLP)
    assert moe.expert_parallel and moe.shared is not None and moe.shared_pieces == 0


def test_tiny_deepseek_models_fold_their_shared_experts(tmp_path):
    import json

    from paddle_mla.models.loader import load_model
    from paddle_mla.models.safetensors_io import save_file
    from paddle_mla.models.tiny import tiny_config, tiny_weights

    for name, pieces in (("deepseek_v3", 1), ("deepseek_v2", 2)):
        cfg = tiny_config(name, 64, 0, 1)
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(cfg))
        save_file(tiny_weights(cfg, 0), path / "model.safetensors")
        model = load_model(str(path), torch.float32, "cpu", progress=False)
        moes = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]
        assert moes and all(m.shared_pieces == pieces for m in moes), name


@pytest.mark.skipif(runtime.is_paddle(), reason="the benchmark selects the torch runtime (CUDA graphs, triton.testing)")
def test_fold_benchmark_smoke_runs_both_forms():
    """The benchmark program behind BENCHMARKS.md's fold figures, on CPU: both layers agree, and the
    engine's layer folds only the small call."""
    from benchmarks.kernels.moe_shared_fold import main

    rows = main(["--smoke"])
    assert [(r["tp"], r["tokens"], r["folds"]) for r in rows] == [(1, 3, True), (1, 65, False), (2, 3, True),
                                                                   (2, 65, False)]
    assert all(r["rel_diff"] <= 1e-6 and r["apart_us"] > 0 and r["folded_us"] > 0 for r in rows)
