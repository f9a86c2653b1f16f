"""GQA families: config parsing (dims, rope style and scaling), the capability checks that keep MLA
backends off GQA models, and the K/V cache geometry. Plain data and small tensors: fast."""

import math

import numpy as np
import pytest

from paddle_mla.config.backends import BACKEND_CAPS, check_model_backend, model_family, resolve_backend
from paddle_mla.cache.kv_cache import allocate_gqa_caches, bytes_per_block, kv_width
from paddle_mla.models.arch import parse_arch
from paddle_mla.models.deepseek import Rope
from paddle_mla.platform.tensor_api import torch

LLAMA = dict(model_type="llama", vocab_size=100, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2, max_position_embeddings=128, eos_token_id=[1, 2])


def test_llama_dims_and_llama3_rope():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    arch = parse_arch({**LLAMA, "rope_scaling": rope}, {"eos_token_id": [2, 3]})
    g = arch.gqa
    assert arch.family == "gqa" and (g.num_heads, g.num_kv_heads, g.head_dim, g.group) == (6, 2, 8, 3)
    assert g.softmax_scale == pytest.approx(8 ** -0.5)
    assert arch.eos_token_ids == [1, 2, 3] and not arch.tie_word_embeddings
    r = arch.rope
    assert (r.rope_type, r.dim, r.interleave, r.factor, r.original_max_position_embeddings) == \
        ("llama3", 8, False, 8.0, 8192)
    # transformers' rule, written out: wavelengths past 8192 are divided by 8, below 2048 kept, smooth between
    inv = 1.0 / 500000.0 ** (np.arange(0, 8, 2) / 8)
    wl = 2 * math.pi / inv
    smooth = (8192 / wl - 1) / 3
    want = np.where(wl > 8192, inv / 8, np.where(wl < 2048, inv, (1 - smooth) * inv / 8 + smooth * inv))
    np.testing.assert_allclose(Rope(r, "cpu").inv_freq.numpy(), want, rtol=1e-5)


def test_family_rope_styles_and_defaults():
    ernie = parse_arch({**LLAMA, "model_type": "ernie4_5", "head_dim": 10})
    assert ernie.rope.interleave and ernie.tie_word_embeddings and ernie.gqa.head_dim == 10
    qwen = parse_arch({**LLAMA, "model_type": "qwen3", "head_dim": 12,
                       "rope_parameters": {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}})
    assert not qwen.rope.interleave and qwen.rope.dim == 12
    np.testing.assert_allclose(Rope(qwen.rope, "cpu").inv_freq.numpy(),
                               1.0 / 100.0 ** (np.arange(0, 12, 2) / 12) / 2, rtol=1e-6)


def test_moe_families_routing_and_layers():
    q = parse_arch({**LLAMA, "model_type": "qwen3_moe", "num_hidden_layers": 4, "num_local_experts": 16,
                    "num_experts_per_tok": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                    "norm_topk_prob": True})
    m = q.moe
    assert (m.n_routed_experts, m.num_experts_per_tok, m.n_shared_experts, m.topk_method) == (16, 4, 0, "greedy")
    assert m.norm_topk_prob and m.scale_after_norm and m.routed_scaling_factor == 1.0
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    e = parse_arch({**LLAMA, "model_type": "ernie4_5_moe", "num_hidden_layers": 5, "moe_num_experts": 8, "moe_k": 2,
                    "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 3,
                    "moe_layer_interval": 1, "head_dim": 8})
    m = e.moe
    assert (m.n_routed_experts, m.num_experts_per_tok, m.n_shared_experts, m.topk_method, m.n_group) == \
        (8, 2, 2, "noaux_tc", 1)
    assert [m.is_moe_layer(i) for i in range(5)] == [False, True, True, True, False]
    assert m.norm_min == 1e-12 and q.moe.norm_min == 0.0     # transformers' default moe_norm_min; qwen3_moe: none
    assert e.rope.interleave and e.tie_word_embeddings
    assert parse_arch(LLAMA).moe is None
    # transformers' defaults: MoE from layer 1 to the last, and an end index of -1 is the last layer
    for extra in ({}, {"moe_layer_end_index": -1}):
        d = parse_arch({**LLAMA, "model_type": "ernie4_5_moe", "num_hidden_layers": 3, "moe_num_experts": 4,
                        "moe_k": 2, "head_dim": 8, **extra}).moe
        assert [d.is_moe_layer(i) for i in range(3)] == [False, True, True], extra


@pytest.mark.parametrize("cfg,match", [
    ({**LLAMA, "num_key_value_heads": 4}, "not a multiple"),
    ({**LLAMA, "model_type": "qwen3", "use_sliding_window": True}, "sliding-window"),
    ({**LLAMA, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "unsupported rope type"),
    ({**LLAMA, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary"),
    ({**LLAMA, "hidden_act": "gelu"}, "silu"),
    ({**LLAMA, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok 5"),
])
def test_unsupported_configs_say_why(cfg, match):
    with pytest.raises(ValueError, match=match):
        parse_arch(cfg)


def test_backends_for_gqa_models():
    assert model_family("qwen3") == "gqa" and model_family("deepseek_v3") == "mla" and model_family(None) == "mla"
    assert "gqa" in BACKEND_CAPS["native"].families and "mla" in BACKEND_CAPS["native"].families
    for mt in ("qwen3", "ernie4_5", "llama"):
        assert resolve_backend("auto", "gpu", mt) == "append_attn"
        assert resolve_backend("auto", "cpu", mt) == "native"
        assert check_model_backend(mt, "native") is None
        for mla_only in ("triton_mla", "dsa"):
            err = check_model_backend(mt, mla_only)
            assert err and mla_only in err and "GQA" in err and "native" in err
    assert "triton_mla" in check_model_backend("deepseek_v3", "dsa")
    err = check_model_backend("deepseek_v3", "append_attn")
    assert err and "MLA" in err and "dsa" not in err


def test_gqa_cache_geometry_and_block_bytes():
    arch = parse_arch(LLAMA)
    assert kv_width(arch) == 2 * 2 * 8
    assert bytes_per_block(arch.num_layers, 16, kv_width(arch), 2) == 2 * 16 * 32 * 2
    caches = allocate_gqa_caches(arch.num_layers, 2, 5, 16, 8, torch.float32, "cpu")
    assert len(caches) == 2 and all(tuple(t.shape) == (2, 5, 16, 8) for kv in caches for t in kv)
    assert caches[0][0].data_ptr() != caches[0][1].data_ptr()
