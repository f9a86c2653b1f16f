"""HF transformers Qwen3 / Ernie4_5 / Llama (+ Qwen3Moe, Ernie4_5_Moe) ForCausalLM as the oracle for our
GQA models, CPU fp32.

Tiny random configs (head dims and hidden sizes not powers of two, GQA group sizes 1, 2 and 3, each
family's rope: qwen3 neox + yarn, ernie4_5 interleaved, llama llama3 / linear scaling; biases; tied
and untied embeddings; one sharded checkpoint), saved with ``save_pretrained`` and loaded with
``load_model``. Last-token logits within 1e-4 and 16 greedy tokens identical through the paged cache
(tests/helpers/model_harness.py): batched prefill, chunked prefill mixed with decodes, a cached prefix,
preemption; and through the engine (LLM) with prefix caching, chunked prefill and a pool small
enough to preempt. The HF side is the real torch; results compare as numpy, so one file checks
both runtimes.
"""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch as real_torch
from helpers.model_harness import run_greedy

from paddle_mla.config.schema import config_from_dict
from paddle_mla.engine.llm import LLM
from paddle_mla.sched.request import GenerationRequest, SamplingParams
from paddle_mla.models import load_model
from paddle_mla.platform.tensor_api import torch

NEW_TOKENS = 16
PROMPTS = [[5, 17, 33, 2, 91, 64, 40, 8, 77, 12, 3], [44, 9, 81, 27, 70, 15], [60, 1, 96, 38, 22, 49, 85, 30, 11]]
# engine run: prompts sharing a 9-token prefix (prefix-cache hits at block_size 4) with the ones above
ENGINE_PROMPTS = PROMPTS + [PROMPTS[0][:9] + [7, 55, 19], PROMPTS[2] + [4, 88]]

_BASE = dict(vocab_size=101, num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=0,
             eos_token_id=1, pad_token_id=None)
_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}

# name: (HF class prefix, config kwargs, save kwargs)
CONFIGS = {
    "qwen3_g2_yarn_sharded": ("Qwen3", dict(
        hidden_size=44, intermediate_size=52, num_attention_heads=6, num_key_value_heads=3, head_dim=12,
        tie_word_embeddings=False, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 64}),
        {"max_shard_size": "20KB"}),
    "qwen3_g1_bias_tied": ("Qwen3", dict(
        hidden_size=36, intermediate_size=40, num_attention_heads=4, num_key_value_heads=4, head_dim=10,
        attention_bias=True, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
        {}),
    "ernie4_5_g3_tied": ("Ernie4_5", dict(
        hidden_size=50, intermediate_size=44, num_attention_heads=6, num_key_value_heads=2, head_dim=14,
        use_bias=False, tie_word_embeddings=True, rope_parameters=_DEFAULT), {}),
    "ernie4_5_g1_bias_untied_sharded": ("Ernie4_5", dict(
        hidden_size=30, intermediate_size=38, num_attention_heads=3, num_key_value_heads=3, head_dim=10,
        use_bias=True, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
        {"max_shard_size": "20KB"}),
    "llama_g1_llama3_bias": ("Llama", dict(
        hidden_size=54, intermediate_size=46, num_attention_heads=3, num_key_value_heads=3, head_dim=None,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), {}),
    "llama_g3_linear_tied": ("Llama", dict(
        hidden_size=42, intermediate_size=50, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
        tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), {}),
    # routed MoE (models/moe.py): layer 0 dense, layer 1 MoE; HF's grouped expert GEMM wants rows of
    # 16-byte multiples, so hidden and expert sizes are multiples of 4 (still not powers of two)
    "qwen3_moe_g2_norm": ("Qwen3Moe", dict(
        hidden_size=44, intermediate_size=52, moe_intermediate_size=20, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0], num_attention_heads=6, num_key_value_heads=3,
        head_dim=12, tie_word_embeddings=False, rope_parameters=_DEFAULT), {}),
    "ernie4_5_moe_g3_shared_bias": ("Ernie4_5_Moe", dict(
        hidden_size=52, intermediate_size=44, moe_intermediate_size=12, moe_num_experts=8, moe_k=2,
        moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_interval=1, num_attention_heads=6,
        num_key_value_heads=2, head_dim=14, tie_word_embeddings=True, rope_parameters=_DEFAULT), {}),
}


def _hf_model(prefix: str, extra: dict, seed: int = 0):
    cfg = getattr(transformers, prefix + "Config")(**{**_BASE, **extra})
    cfg._attn_implementation = "eager"
    real_torch.manual_seed(seed)
    model = getattr(transformers, prefix + "ForCausalLM")(cfg).eval()
    with real_torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * real_torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith("lm_head.weight"):
                p.normal_(0.0, 0.3)
            else:   # projections and their biases
                p.normal_(0.0, 0.15)
    return model


def _hf_greedy(model, prompts: list[list[int]]):
    """HF's own greedy continuation of every prompt, in one left-padded batch (its KV cache and
    attention mask; within 3e-6 of one prompt at a time here) -> [(tokens, first logits)]."""
    width = max(len(p) for p in prompts)
    ids = real_torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = real_torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with real_torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    tokens = out.sequences[:, width:].tolist()
    return [(tokens[r], out.logits[0][r].float().numpy()) for r in range(len(prompts))]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    prefix, extra, save_kw = CONFIGS[request.param]
    hf = _hf_model(prefix, extra)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, **save_kw)
    if save_kw:
        assert (path / "model.safetensors.index.json").exists(), "expected a sharded checkpoint"
    ours = load_model(str(path), torch.float32, "cpu", progress=False)
    expected = _hf_greedy(hf, ENGINE_PROMPTS)
    return request.param, path, ours, expected


def _check(got, expected, what: str):
    for r in range(len(got.tokens)):
        tokens, logits = expected[r]
        np.testing.assert_allclose(got.first_logits[r], logits, atol=1e-4, rtol=0, err_msg=f"{what}, prompt {r}")
        assert got.tokens[r] == tokens, f"{what}, prompt {r}"


def test_arch_matches_hf_config(pair):
    name, _, ours, _ = pair
    prefix, extra, _ = CONFIGS[name]
    g = ours.arch.gqa
    assert ours.arch.family == "gqa" and ours.arch.mla is None
    assert (g.num_heads, g.num_kv_heads) == (extra["num_attention_heads"], extra["num_key_value_heads"])
    assert g.head_dim == (extra["head_dim"] or extra["hidden_size"] // extra["num_attention_heads"])
    assert ours.arch.rope.interleave == prefix.startswith("Ernie4_5")
    assert (ours.arch.moe is not None) == prefix.endswith("Moe")
    if ours.arch.moe is not None:
        assert [ours.arch.moe.is_moe_layer(i) for i in range(ours.arch.num_layers)] == [False, True]
    assert (ours.lm_head is ours.embed) == extra["tie_word_embeddings"]
    assert ours.arch.eos_token_ids == [1]


def test_batched_prefill_matches_hf(pair):
    _, _, ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, seed=1), expected, "batched prefill")


def test_chunked_prefix_and_preemption_match_hf(pair):
    """Prompt chunks of 3 mixed with other requests' decodes; a cached prefix continued; request 0
    preempted after 5 tokens and recomputed into reused, dirty blocks."""
    _, _, ours, expected = pair
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, chunk=3, seed=2), expected, "chunked prefill")
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, prefix_tokens=4, seed=3), expected, "cached prefix")
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, chunk=5, preempt_at=5, seed=4), expected, "preemption")


def test_engine_matches_hf(pair):
    """The whole engine: prefix caching + chunked prefill + a pool that forces preemption."""
    _, path, _, expected = pair
    llm = LLM(config_from_dict({
        "model": str(path), "device": "cpu", "dtype": "float32", "attention": {"backend": "auto"},
        "cache": {"block_size": 4, "num_blocks": 14, "enable_prefix_caching": True},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8, "enable_chunked_prefill": True}}))
    assert llm.runner.backend.name == "native"
    reqs = [GenerationRequest(id=i, prompt_token_ids=p, params=SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
            for i, p in enumerate(ENGINE_PROMPTS)]
    outs = llm.generate(reqs, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(reqs)
    for r, o in enumerate(outs):
        assert list(o.token_ids) == expected[r][0], f"engine, prompt {r}"
    st = llm.stats()
    assert st.num_preemptions > 0, "the small pool must force preemption"
    assert st.cached_prompt_tokens > 0, "the shared prefixes must hit the prefix cache"


def test_ernie_moe_norm_min_floors_the_weights_sum(tmp_path):
    """transformers divides ernie4_5_moe's top-k probs by max(their sum, moe_norm_min): at 1.0 (top-2
    of 8 never sums to 1) every token's routed weights are its plain probs, not renormalised ones."""
    prefix, extra, _ = CONFIGS["ernie4_5_moe_g3_shared_bias"]
    hf = _hf_model(prefix, {**extra, "moe_norm_min": 1.0})
    hf.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path), torch.float32, "cpu", progress=False)
    assert ours.arch.moe.norm_min == 1.0
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, seed=1), _hf_greedy(hf, PROMPTS), "moe_norm_min 1")


@pytest.mark.parametrize("backend", ["triton_mla", "dsa"])
def test_mla_backends_on_gqa_checkpoint_are_config_errors(tmp_path, backend):
    """Refused from config.json alone, before any weight is read (the folder has no weights)."""
    import json

    from paddle_mla.config.schema import ConfigError

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen3", **_BASE, **CONFIGS["qwen3_g2_yarn_sharded"][1]}))
    with pytest.raises(ConfigError, match=f"{backend}.*GQA.*native"):
        LLM(config_from_dict({"model": str(tmp_path), "device": "cpu", "attention": {"backend": backend}}))


@pytest.mark.gpu
def test_gpu_native_matches_hf(pair):
    """The same models on the GPU (native backend, fp32 weights and caches): same tokens as HF on CPU."""
    from paddle_mla.platform import runtime

    _, path, _, expected = pair
    dev = runtime.device_string("gpu")
    ours = load_model(str(path), torch.float32, dev, progress=False)
    _check(run_greedy(ours, PROMPTS, NEW_TOKENS, block_size=4, chunk=3, seed=5, device=dev), expected, "gpu chunked")
