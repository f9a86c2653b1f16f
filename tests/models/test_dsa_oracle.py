"""HF transformers DeepseekV32ForCausalLM (DSA) as the oracle, CPU fp32.

Tiny random configs whose ``index_topk`` (12..32) is far below the prompt lengths (up to 300), so
attention is really sparse; q_lora is always set (the indexer reads its residual), with YaRN and
default rope. Driven through the paged caches (tests/helpers/model_harness.py): batched prefill, chunked
prefill mixed with decodes, a cached prefix, and preemption with recompute into dirty blocks.
Last-token logits within 1e-4 and identical 16-token greedy continuations.
"""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV32Config"):
    pytest.skip("transformers without deepseek_v32 (needs >= 5.23)", allow_module_level=True)
import torch as real_torch
from helpers.model_harness import run_greedy

from paddle_mla.models import load_model
from paddle_mla.platform.tensor_api import torch

NEW_TOKENS = 16
_rng = np.random.default_rng(7)
PROMPTS = [[int(t) for t in _rng.integers(2, 101, n)] for n in (300, 157, 41)]

_DIMS = dict(vocab_size=101, hidden_size=72, intermediate_size=52, moe_intermediate_size=20, num_hidden_layers=3,
             num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=24, qk_rope_head_dim=12, qk_nope_head_dim=20,
             v_head_dim=28, max_position_embeddings=512, first_k_dense_replace=1, n_routed_experts=8,
             num_experts_per_tok=2, n_shared_experts=1, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
             q_lora_rank=20, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
         "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}

CONFIGS = {
    "v32_yarn_topk16": dict(rope_parameters=_YARN, index_topk=16, index_n_heads=16, index_head_dim=16),
    "v32_default_topk32": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, index_topk=32,
                               index_n_heads=16, index_head_dim=24),
    "v32_yarn_topk12_dense0": dict(rope_parameters=_YARN, index_topk=12, index_n_heads=16, index_head_dim=12,
                                   first_k_dense_replace=0),
}


def _hf_model(extra: dict, seed: int = 0):
    cfg = transformers.DeepseekV32Config(**{**_DIMS, **extra})
    cfg._attn_implementation = "eager"
    real_torch.manual_seed(seed)
    model = transformers.DeepseekV32ForCausalLM(cfg).eval()
    with real_torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * real_torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith(("mlp.gate.weight", "lm_head.weight")):
                p.normal_(0.0, 0.3)
            elif name.endswith(("indexer.wq_b.weight", "indexer.wk.weight")):
                p.normal_(0.0, 0.3)      # sharp index scores: few near-ties at the top-k boundary
            else:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)
    return model


def _hf_greedy(model, prompt: list[int]):
    """Prefill, then decode with transformers' own cache (latent + indexer keys)."""
    out, first, past = [], None, None
    step = list(prompt)
    with real_torch.no_grad():
        for _ in range(NEW_TOKENS):
            res = model(real_torch.tensor([step]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].float().numpy()
            first = logits if first is None else first
            out.append(int(np.argmax(logits)))
            step = out[-1:]
    return out, first


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    hf = _hf_model(CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours = load_model(str(path), torch.float32, "cpu")
    expected = [_hf_greedy(hf, p) for p in PROMPTS]
    return ours, expected


def _check(got, expected):
    for r, (tokens, logits) in enumerate(expected):
        np.testing.assert_allclose(got.first_logits[r], logits, atol=1e-4, rtol=0, err_msg=f"prompt {r}")
        assert got.tokens[r] == tokens, f"prompt {r}"


def test_batched_prefill_matches_hf(pair):
    ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, seed=1), expected)


def test_chunked_prefill_with_decodes_matches_hf(pair):
    ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=16, chunk=37, seed=2), expected)


def test_cached_prefix_matches_hf(pair):
    ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=8, prefix_tokens=100, seed=3), expected)


def test_preemption_recompute_matches_hf(pair):
    ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, chunk=64, preempt_at=5, seed=4), expected)


def test_sparsity_matters(pair):
    """The same weights attending densely give other logits: the oracle really checks the top-k."""
    ours, expected = pair
    spec = ours.arch.indexer
    assert spec.topk < len(PROMPTS[0]) // 8
    saved = spec.topk
    spec.topk = 10_000
    try:
        dense = run_greedy(ours, PROMPTS[:1], 1, block_size=4, seed=5)
    finally:
        spec.topk = saved
    assert np.abs(dense.first_logits[0] - expected[0][1]).max() > 1e-2
