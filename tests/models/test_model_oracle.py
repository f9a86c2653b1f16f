"""HF transformers DeepseekV2/V3ForCausalLM as the oracle for our models, CPU fp32.

Tiny random configs with dims that are not powers of two, weights scaled up so logits are not
near ties, saved with ``save_pretrained``, loaded with ``load_model`` and driven through the
paged latent cache (tests/helpers/model_harness.py: random block tables, block_size 4, three prompts
prefilled together, then batched decodes; also chunked prefill mixed with decodes). The HF side
is the real torch (this test module is outside the paddle proxy's scope) and results are
compared as numpy, so the same file checks both runtimes.
"""

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch as real_torch
from helpers.model_harness import run_greedy

from paddle_mla.models import load_model
from paddle_mla.platform.tensor_api import torch

NEW_TOKENS = 16
PROMPTS = [[5, 17, 33, 2, 91, 64, 40, 8, 77, 12, 3], [44, 9, 81, 27, 70, 15], [60, 1, 96, 38, 22, 49, 85, 30, 11]]

_DIMS = dict(vocab_size=101, hidden_size=72, intermediate_size=52, moe_intermediate_size=20, num_hidden_layers=3,
             num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=24, qk_rope_head_dim=12, qk_nope_head_dim=20,
             v_head_dim=28, max_position_embeddings=256, first_k_dense_replace=1, n_routed_experts=8,
             num_experts_per_tok=2, n_shared_experts=1, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
         "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

CONFIGS = {
    "v3_qlora_yarn_noaux": ("deepseek_v3", dict(
        q_lora_rank=20, rope_parameters=_YARN, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, rope_interleave=True)),
    "v3_noqlora_rope_halves": ("deepseek_v3", dict(
        q_lora_rank=None, rope_parameters=_DEFAULT_ROPE, n_group=4, topk_group=2, norm_topk_prob=False,
        routed_scaling_factor=1.5, rope_interleave=False, first_k_dense_replace=0)),
    "v2_greedy_yarn": ("deepseek_v2", dict(
        q_lora_rank=None, rope_parameters=_YARN, topk_method="greedy", n_group=1, topk_group=1,
        routed_scaling_factor=1.0, n_shared_experts=2)),
    "v2_group_limited_qlora": ("deepseek_v2", dict(
        q_lora_rank=20, rope_parameters=_DEFAULT_ROPE, topk_method="group_limited_greedy", n_group=4, topk_group=2,
        routed_scaling_factor=2.0)),
    # real routing widths (V2: 64 experts, top-6, group-limited; V3: 32 experts, top-8, noaux_tc):
    # many experts get no token, some get several, so the routed path's grouping is exercised
    "v2_64experts_top6_group_limited": ("deepseek_v2", dict(
        q_lora_rank=None, rope_parameters=_DEFAULT_ROPE, topk_method="group_limited_greedy", n_group=8, topk_group=3,
        n_routed_experts=64, num_experts_per_tok=6, norm_topk_prob=False, routed_scaling_factor=1.0,
        moe_intermediate_size=12)),
    "v3_32experts_top8_noaux": ("deepseek_v3", dict(
        q_lora_rank=20, rope_parameters=_DEFAULT_ROPE, n_group=4, topk_group=2, n_routed_experts=32,
        num_experts_per_tok=8, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        moe_intermediate_size=12)),
}


def _hf_model(model_type: str, extra: dict, seed: int = 0):
    cfg_cls = transformers.DeepseekV3Config if model_type == "deepseek_v3" else transformers.DeepseekV2Config
    lm_cls = transformers.DeepseekV3ForCausalLM if model_type == "deepseek_v3" else transformers.DeepseekV2ForCausalLM
    cfg = cfg_cls(**{**_DIMS, **extra})
    cfg._attn_implementation = "eager"
    real_torch.manual_seed(seed)
    model = lm_cls(cfg).eval()
    with real_torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * real_torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith(("mlp.gate.weight", "lm_head.weight")):
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)
    return model


def _hf_greedy(model, prompt: list[int]):
    ids = list(prompt)
    first = None
    with real_torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(real_torch.tensor([ids])).logits[0, -1].float().numpy()
            first = logits if first is None else first
            ids.append(int(np.argmax(logits)))
    return ids[len(prompt):], first


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    model_type, extra = CONFIGS[request.param]
    hf = _hf_model(model_type, extra)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours = load_model(str(path), torch.float32, "cpu")
    expected = [_hf_greedy(hf, p) for p in PROMPTS]
    return ours, expected


def test_logits_and_greedy_match_hf(pair):
    ours, expected = pair
    got = run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, seed=1)
    for r, (tokens, logits) in enumerate(expected):
        np.testing.assert_allclose(got.first_logits[r], logits, atol=1e-4, rtol=0)
        assert got.tokens[r] == tokens, f"prompt {r}"


def test_chunked_prefill_and_prefix_match_hf(pair):
    """Prompt chunks of 3 mixed with other requests' decodes; then a cached prefix continued."""
    ours, expected = pair
    chunked = run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, chunk=3, seed=2)
    prefixed = run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, prefix_tokens=4, seed=3)
    for r, (tokens, logits) in enumerate(expected):
        for got in (chunked, prefixed):
            np.testing.assert_allclose(got.first_logits[r], logits, atol=1e-4, rtol=0)
            assert got.tokens[r] == tokens, f"prompt {r}"


def test_arch_matches_hf_config(pair):
    ours, _ = pair
    assert ours.arch.family == "mla"
    assert ours.arch.num_layers == _DIMS["num_hidden_layers"]
    assert ours.arch.eos_token_ids == [1]



def _first_logits_match_hf(model_type: str, extra: dict, path):
    hf = _hf_model(model_type, extra)
    hf.save_pretrained(path)
    got = run_greedy(load_model(str(path), torch.float32, "cpu"), PROMPTS, 1, block_size=4)
    for r, prompt in enumerate(PROMPTS):
        with real_torch.no_grad():
            want = hf(real_torch.tensor([prompt])).logits[0, -1].float().numpy()
        np.testing.assert_allclose(got.first_logits[r], want, atol=1e-4, rtol=0, err_msg=f"prompt {r}")


@pytest.mark.parametrize("name", ["v3_qlora_yarn_noaux", "v2_greedy_yarn"])
def test_latent_norms_keep_eps_1e6_whatever_rms_norm_eps(name, tmp_path):
    """transformers builds q_a_layernorm and kv_a_layernorm with eps 1e-6 and only the decoder
    layers' norms and the final norm with rms_norm_eps: at rms_norm_eps 1e-2 taking it for the
    latent norms too moves the logits by ~1e-2."""
    model_type, extra = CONFIGS[name]
    _first_logits_match_hf(model_type, {**extra, "rms_norm_eps": 1e-2}, tmp_path)


def test_v2_group_limited_top_k_past_the_kept_groups(tmp_path):
    """top-3 of 8 experts in 4 groups, 1 group kept (2 experts): transformers' DeepseekV2 takes the
    weights from the group-masked scores, so the third expert it picks weighs 0."""
    _first_logits_match_hf("deepseek_v2", {
        "q_lora_rank": None, "rope_parameters": _DEFAULT_ROPE, "topk_method": "group_limited_greedy", "n_group": 4,
        "topk_group": 1, "num_experts_per_tok": 3, "routed_scaling_factor": 1.0}, tmp_path)


def test_moe_layer_freq_is_ignored_as_transformers_does(tmp_path):
    """transformers' DeepseekV2/V3 make every layer from first_k_dense_replace on a MoE layer,
    whatever moe_layer_freq says (and save it in config.json): such a checkpoint loads and matches."""
    _first_logits_match_hf("deepseek_v2", {
        "q_lora_rank": None, "rope_parameters": _DEFAULT_ROPE, "topk_method": "greedy", "n_group": 1,
        "topk_group": 1, "moe_layer_freq": 2, "first_k_dense_replace": 0}, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["moe_layer_freq"] == 2
