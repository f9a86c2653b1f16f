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


def _checkpoint(tmp_path, name):
    pytest.importorskip("transformers")     # the oracle checkpoints need it
    from test_model_oracle import CONFIGS, _hf_model

    model_type, extra = CONFIGS[name]
    hf = _hf_model(model_type, {**extra, "num_attention_heads": 4, "num_key_value_heads": 4})
    hf.save_pretrained(tmp_path)
    return hf


def _check_ep_shards(path, sizes=(2, 3, 9)):
    """Every rank's routed experts are its whole-expert range of the full load (also an empty range:
    9 ranks, 8 experts); every other tensor is its TP slice, as without EP."""
    from test_tp_loader import _expected, _np

    from paddle_mla.models import load_arch
    from paddle_mla.models.loader import load_weights
    from paddle_mla.platform.tensor_api import torch

    arch = load_arch(path)
    E = arch.moe.n_routed_experts
    full = {k: _np(v) for k, v in load_weights(path, arch, torch.float32, "cpu", progress=False).items()}
    expert_keys = [k for k in full if k.endswith((".experts.gate", ".experts.up", ".experts.down"))]
    assert expert_keys
    firsts = {k.rsplit(".", 1)[0] + ".first" for k in expert_keys}
    for size in sizes:
        for rank in range(size):
            local = load_weights(path, arch, torch.float32, "cpu", progress=False, tp_rank=rank, tp_size=size,
                                 expert_parallel=True)
            assert sorted(local) == sorted([*full, *firsts])
            lo, hi = expert_range(E, rank, size)
            for name, t in local.items():
                if name in firsts:
                    assert t == lo, name
                    continue
                want = full[name][lo:hi] if name in expert_keys else _expected(name, full[name], arch, rank, size)
                np.testing.assert_array_equal(_np(t), want, err_msg=name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from paddle_mla.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_ep_loader"))


def test_each_rank_loads_its_whole_experts(tiny):
    _check_ep_shards(tiny)


@pytest.mark.parametrize("block", [(16, 16), (24, 24)], ids=["aligned", "misaligned"])
def test_each_rank_loads_its_whole_experts_fp8(tiny, tmp_path, block):
    from test_loader import _copy_with, _fp8_checkpoint_tensors

    fp8, raw, qcfg, _ = _fp8_checkpoint_tensors(tiny, block)
    _check_ep_shards(_copy_with(tiny, tmp_path / "fp8", fp8, raw, qcfg), sizes=(2, 3))


def test_each_rank_loads_its_whole_experts_fused(tiny, tmp_path):
    from test_loader import _copy_with, _tensors

    from paddle_mla.models import load_arch

    tensors, arch = _tensors(tiny), load_arch(tiny)
    fused = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for i in range(arch.moe.first_k_dense_replace, arch.num_layers):
        p, E = f"model.layers.{i}.mlp.experts", arch.moe.n_routed_experts
        fused[p + ".gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}.{e}.gate_proj.weight"],
                                                               tensors[f"{p}.{e}.up_proj.weight"]]) for e in range(E)])
        fused[p + ".down_proj"] = np.stack([tensors[f"{p}.{e}.down_proj.weight"] for e in range(E)])
    _check_ep_shards(_copy_with(tiny, tmp_path / "fused", fused), sizes=(2, 3))


def test_ranks_partial_moe_sums_to_the_whole():
    """Two ranks' MoE layers (their experts, the same routing) add up to the one-rank layer, and
    each adds something (the routing reaches both ranks)."""
    from paddle_mla.models.arch import MoESpec
    from paddle_mla.models.moe import MoE, MoEExec
    from paddle_mla.platform.tensor_api import torch
    from types import SimpleNamespace

    E, h, inter, T = 6, 16, 8, 12
    g = np.random.default_rng(0)
    t = lambda *s: torch.from_numpy(g.standard_normal(s).astype(np.float32))  # noqa: E731
    spec = MoESpec(n_routed_experts=E, num_experts_per_tok=2, n_shared_experts=0, first_k_dense_replace=0,
                   topk_method="greedy", scoring_func="softmax", n_group=1, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=1.0, scale_after_norm=False)
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


def _generate(model_dir, tp: int, expert_parallel: bool, prompts, new_tokens: int):
    """Greedy tokens, and rank 0's routed-expert rows per MoE layer."""
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
        # routed rows (TP=1 stacks the shared experts' pieces after them; expert parallel keeps them apart)
        rows = [layer.mlp.w_gate.shape[0] - layer.mlp.shared_pieces for layer in llm.runner.model.layers
                if isinstance(layer.mlp, MoE)]
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(prompts)], use_tqdm=False)
        assert [o.error for o in outs] == [None] * len(prompts)
        return [list(o.outputs[0].token_ids) for o in outs], rows
    finally:
        llm.close()


def _check_ep(model_dir, prompts, new_tokens, expected, num_experts, tp: int = 2):
    """Chunked prefill (8-token budget) mixed with decodes, and prefix caching: TP+EP == TP=1 == HF."""
    one, rows_one = _generate(model_dir, 1, False, prompts, new_tokens)
    ep, rows_ep = _generate(model_dir, tp, True, prompts, new_tokens)
    assert one == expected
    assert ep == one
    lo, hi = expert_range(num_experts, 0, tp)
    assert rows_one and rows_one == [num_experts] * len(rows_one)
    assert rows_ep == [hi - lo] * len(rows_one)          # rank 0 holds only its experts, whole


@pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)
@pytest.mark.parametrize("name", ["v2_group_limited_qlora", "v3_qlora_yarn_noaux"])
def test_deepseek_tp2_ep_matches_tp1_and_hf(name, tmp_path):
    from test_model_oracle import NEW_TOKENS, _hf_greedy
    from test_tensor_parallel import PROMPTS

    hf = _checkpoint(tmp_path, name)
    expected = [_hf_greedy(hf, p)[0] for p in PROMPTS]
    _check_ep(tmp_path, PROMPTS, NEW_TOKENS, expected, hf.config.n_routed_experts)


@pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)
def test_deepseek_tp4_ep_matches_tp1_and_hf(tmp_path):
    """Four ranks (three workers), one head each, experts split 4 ways: the code is not written for two."""
    from test_model_oracle import NEW_TOKENS, _hf_greedy
    from test_tensor_parallel import PROMPTS

    hf = _checkpoint(tmp_path, "v2_group_limited_qlora")
    expected = [_hf_greedy(hf, p)[0] for p in PROMPTS]
    _check_ep(tmp_path, PROMPTS, NEW_TOKENS, expected, hf.config.n_routed_experts, tp=4)


@pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)
@pytest.mark.parametrize("name", ["qwen3_moe_g2_norm", "ernie4_5_moe_g3_shared_bias"])
def test_gqa_moe_tp2_ep_matches_tp1_and_hf(name, tmp_path):
    pytest.importorskip("transformers")
    from test_gqa_oracle import CONFIGS, ENGINE_PROMPTS, NEW_TOKENS, _hf_greedy, _hf_model
    from test_tensor_parallel_gqa import CASES

    prefix, extra, save_kw = CONFIGS[name]
    hf = _hf_model(prefix, {**extra, **CASES[name]})
    hf.save_pretrained(tmp_path, **save_kw)
    expected = [tokens for tokens, _ in _hf_greedy(hf, ENGINE_PROMPTS)]
    experts = getattr(hf.config, "num_experts", None) or hf.config.moe_num_experts
    _check_ep(tmp_path, ENGINE_PROMPTS, NEW_TOKENS, expected, experts)
