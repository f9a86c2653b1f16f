"""Expert parallelism (``parallel.expert_parallel``) over gloo on CPU (fp32): routed experts placed
whole on the ranks, attention and shared experts as under TP.

- TP=2 + EP gives the greedy tokens of TP=1 (and of transformers) on tiny DeepSeek V2 / V3 MoE
  checkpoints, with routing that sends tokens to both ranks' experts;
- each rank's loaded experts are exactly its contiguous range of the full load, for any number of
  ranks (also more ranks than experts: an empty range), per-expert and fused checkpoint layouts;
- the MoE layer adds only its own experts: the ranks' partial sums add up to the one-rank sum.
The engine runs (TP=2 processes) are torch-only; the placement and layer checks run on both runtimes.
"""

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.parallel.launcher import TORCH_ONLY
from paddle_mla.models.sharding import expert_range


@pytest.mark.parametrize("num_experts,size", [(8, 2), (8, 3), (64, 5), (3, 4), (7, 7)])
def test_expert_ranges_cover_every_expert_once_in_order(num_experts, size):
    ranges = [expert_range(num_experts, r, size) for r in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_experts
    for (_, stop), (start, _) in zip(ranges, ranges[1:]):
        assert start == stop                               # contiguous, no overlap, no gap
    assert all(0 <= b - a <= -(-num_experts // size) for a, b in ranges)


def _checkpoint(tmp_path, name="v2_group_limited_qlora"):
    transformers = pytest.importorskip("transformers")  # noqa: F841 - the oracle checkpoints need it
    from test_model_oracle import CONFIGS, _hf_model

    model_type, extra = CONFIGS[name]
    hf = _hf_model(model_type, {**extra, "num_attention_heads": 4, "num_key_value_heads": 4})
    hf.save_pretrained(tmp_path)
    return hf


@pytest.mark.parametrize("size", [2, 3, 9])
def test_each_rank_loads_its_whole_experts(tmp_path, size):
    from paddle_mla.models.arch import load_arch
    from paddle_mla.models.loader import load_weights
    from paddle_mla.platform.tensor_api import torch

    _checkpoint(tmp_path)
    arch = load_arch(tmp_path)
    full = load_weights(tmp_path, arch, torch.float32, "cpu", progress=False)
    E = arch.moe.n_routed_experts
    prefix = "model.layers.1.mlp."
    for rank in range(size):
        part = load_weights(tmp_path, arch, torch.float32, "cpu", progress=False, tp_rank=rank, tp_size=size,
                            expert_parallel=True)
        lo, hi = expert_range(E, rank, size)
        assert part[prefix + "experts.first"] == lo
        for which in ("gate", "up", "down"):
            got, want = part[prefix + f"experts.{which}"], full[prefix + f"experts.{which}"][lo:hi]
            assert list(got.shape) == list(want.shape)
            np.testing.assert_array_equal(got.numpy(), want.numpy())
        # shared experts stay split by width, as under TP
        shared = part[prefix + "shared_experts.gate_proj.weight"]
        assert shared.shape[0] < full[prefix + "shared_experts.gate_proj.weight"].shape[0]


def test_ranks_partial_moe_sums_to_the_whole():
    """Two ranks' MoE layers (their experts, the same routing) add up to the one-rank layer, and
    each adds something (the routing reaches both ranks)."""
    from paddle_mla.models.moe import MoE, MoEExec
    from paddle_mla.platform.tensor_api import torch
    from types import SimpleNamespace

    E, h, inter, T = 6, 16, 8, 12
    g = np.random.default_rng(0)
    t = lambda *s: torch.from_numpy(g.standard_normal(s).astype(np.float32))  # noqa: E731
    spec = SimpleNamespace(n_routed_experts=E, scoring_func="softmax", topk_method="greedy", num_experts_per_tok=2,
                           scale_after_norm=False, norm_topk_prob=True, routed_scaling_factor=1.0)
    arch = SimpleNamespace(moe=spec)
    full = {"m.gate.weight": t(E, h), "m.experts.gate": t(E, inter, h), "m.experts.up": t(E, inter, h),
            "m.experts.down": t(E, h, inter)}
    exec_ = MoEExec("cpu", torch.float32)
    x = t(T, h)
    whole = MoE(arch, full, "m.", exec_, None).forward(x)
    parts = []
    for rank in range(2):
        lo, hi = expert_range(E, rank, 2)
        w = {**full, "m.experts.first": lo, **{f"m.experts.{k}": full[f"m.experts.{k}"][lo:hi]
                                               for k in ("gate", "up", "down")}}
        parts.append(MoE(arch, w, "m.", exec_, None).forward(x))
    assert all(float(p.abs().sum()) > 0 for p in parts)
    np.testing.assert_allclose((parts[0] + parts[1]).numpy(), whole.numpy(), rtol=1e-5, atol=1e-5)


def _generate(model_dir, tp: int, expert_parallel: bool):
    """Greedy tokens of PROMPTS, and rank 0's routed-expert rows per MoE layer."""
    from test_model_oracle import NEW_TOKENS
    from test_tensor_parallel import PROMPTS

    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.models.moe import MoE
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({
        "model": str(model_dir), "runtime": "torch", "device": "cpu", "dtype": "float32",
        "cache": {"block_size": 4, "enable_prefix_caching": True},
        "scheduler": {"enable_chunked_prefill": True, "max_num_batched_tokens": 8, "max_num_seqs": 3},
        "parallel": {"tensor_parallel_size": tp, "expert_parallel": expert_parallel}}))
    try:
        rows = [layer.mlp.w_gate.shape[0] for layer in llm.runner.model.layers if isinstance(layer.mlp, MoE)]
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(PROMPTS)], use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], rows
    finally:
        llm.close()


@pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)
@pytest.mark.parametrize("name", ["v2_group_limited_qlora", "v3_qlora_yarn_noaux"])
def test_tp2_ep_matches_tp1_and_hf(name, tmp_path):
    """Chunked prefill (8-token budget) mixed with decodes, and prefix caching."""
    from test_model_oracle import _hf_greedy
    from test_tensor_parallel import PROMPTS

    hf = _checkpoint(tmp_path, name)
    expected = [_hf_greedy(hf, p)[0] for p in PROMPTS]
    one, rows_one = _generate(tmp_path, 1, False)
    ep, rows_ep = _generate(tmp_path, 2, True)
    assert one == expected
    assert ep == one
    assert rows_one == [8, 8] and rows_ep == [4, 4]      # rank 0 holds experts 0..3 of 8 in both MoE layers
