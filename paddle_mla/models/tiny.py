"""A tiny random DeepSeek-style checkpoint (config, safetensors, byte-level BPE tokenizer) in seconds.

Deterministic from the seed: weights come from numpy's PCG64, the tokenizer is trained on the
built-in text below. ``ensure_tiny_model`` builds once into a cache folder and reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from paddle_mla.models.safetensors_io import save_file

TINY_VERSION = "1"
BOS, EOS = "<|begin_of_sentence|>", "<|end_of_sentence|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Once upon a time there was a little model that wanted to learn how to speak. It read every book in
the library, counted the words, and found that the most common ones were the, of, and, to, in, is,
that, it, was, for, on, are, as, with, his, they, at, be, this, have, from, or, one, had, by, word,
but, not, what, all, were, we, when, your, can, said, there, use, an, each, which, she, do, how,
their, if, will, up, other, about, out, many, then, them, these, so, some, her, would, make, like,
him, into, time, has, look, two, more, write, go, see, number, no, way, could, people, my, than,
first, water, been, call, who, oil, its, now, find, long, down, day, did, get, come, made, may, part.
Attention is all you need. Multi-head latent attention compresses keys and values into a small
latent vector per token, so the cache stays small while every head still sees the whole history.
Hello, world! What is the capital of France? Paris is the capital of France. Numbers: 0 1 2 3 4 5
6 7 8 9 10 100 1000. Tell me a story about a robot who learns to paint the sea at night.
"""


def train_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1)
    tok.train_from_iterator([_TEXT] * 4, trainer=trainer)
    return tok


def tiny_config(arch: str, vocab_size: int, bos: int, eos: int) -> dict:
    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=2048,
        rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False,
        first_k_dense_replace=1, moe_layer_freq=1, n_routed_experts=8, num_experts_per_tok=2,
        attention_bias=False, torch_dtype="float32",
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        rope_theta=10000.0,
    )
    if arch == "deepseek_v3":
        return dict(common, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], q_lora_rank=48,
                    n_shared_experts=1, n_group=2, topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid",
                    norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True, num_nextn_predict_layers=0)
    if arch == "deepseek_v2":
        return dict(common, model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], q_lora_rank=None,
                    n_shared_experts=2, n_group=2, topk_group=1, topk_method="group_limited_greedy",
                    scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0)
    if arch == "deepseek_v32":   # V3 + the DSA lightning indexer; index_topk well below max_model_len
        return dict(tiny_config("deepseek_v3", vocab_size, bos, eos), model_type="deepseek_v32",
                    architectures=["DeepseekV32ForCausalLM"], index_topk=16, index_n_heads=8, index_head_dim=32)
    raise ValueError(f"unknown tiny arch {arch!r}; choose deepseek_v3, deepseek_v2 or deepseek_v32")


def tiny_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v, kvl = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    w: dict[str, np.ndarray] = {}

    def normal(*shape, std=0.08):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    def mlp(p, inter):
        w[p + "gate_proj.weight"] = normal(inter, h)
        w[p + "up_proj.weight"] = normal(inter, h)
        w[p + "down_proj.weight"] = normal(h, inter)

    w["model.embed_tokens.weight"] = normal(cfg["vocab_size"], h, std=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w(h)
        w[p + "post_attention_layernorm.weight"] = norm_w(h)
        a = p + "self_attn."
        if cfg["q_lora_rank"]:
            w[a + "q_a_proj.weight"] = normal(cfg["q_lora_rank"], h)
            w[a + "q_a_layernorm.weight"] = norm_w(cfg["q_lora_rank"])
            w[a + "q_b_proj.weight"] = normal(heads * (nope + rope), cfg["q_lora_rank"])
        else:
            w[a + "q_proj.weight"] = normal(heads * (nope + rope), h)
        w[a + "kv_a_proj_with_mqa.weight"] = normal(kvl + rope, h)
        w[a + "kv_a_layernorm.weight"] = norm_w(kvl)
        w[a + "kv_b_proj.weight"] = normal(heads * (nope + v), kvl)
        w[a + "o_proj.weight"] = normal(h, heads * v)
        if cfg.get("index_topk"):
            ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
            w[a + "indexer.wq_b.weight"] = normal(ih * idim, cfg["q_lora_rank"], std=0.3)
            w[a + "indexer.wk.weight"] = normal(idim, h, std=0.3)
            w[a + "indexer.k_norm.weight"] = norm_w(idim)
            w[a + "indexer.k_norm.bias"] = normal(idim)
            w[a + "indexer.weights_proj.weight"] = normal(ih, h)
        if i >= cfg["first_k_dense_replace"]:
            m = p + "mlp."
            w[m + "gate.weight"] = normal(cfg["n_routed_experts"], h, std=0.3)
            if cfg["topk_method"] == "noaux_tc":
                w[m + "gate.e_score_correction_bias"] = normal(cfg["n_routed_experts"], std=0.05)
            for e in range(cfg["n_routed_experts"]):
                mlp(f"{m}experts.{e}.", cfg["moe_intermediate_size"])
            mlp(m + "shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            mlp(p + "mlp.", cfg["intermediate_size"])
    w["model.norm.weight"] = norm_w(h)
    w["lm_head.weight"] = normal(cfg["vocab_size"], h, std=0.3)
    return w


def make_tiny_model(out_dir, arch: str = "deepseek_v3", seed: int = 0) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    cfg = tiny_config(arch, tok.get_vocab_size(with_added_tokens=True), bos, eos)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(tiny_weights(cfg, seed), out / "model.safetensors")
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
               "add_bos_token": True, "add_eos_token": False, "model_max_length": cfg["max_position_embeddings"],
               "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, indent=2) + "\n")
    return out


def tiny_cache_dir(arch: str = "deepseek_v3") -> Path:
    root = os.environ.get("PADDLE_MLA_CACHE") or str(Path.home() / ".cache" / "paddle_mla")
    suffix = "" if arch == "deepseek_v3" else f"-{arch}"
    return Path(root) / f"tiny-{TINY_VERSION}{suffix}"


def ensure_tiny_model(arch: str = "deepseek_v3") -> Path:
    """The cached tiny model folder, built on first use. Safe under concurrent callers: each builds
    into its own temp folder and renames it into place; a loser of the race discards its copy."""
    final = tiny_cache_dir(arch)
    if (final / "model.safetensors").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        make_tiny_model(tmp, arch=arch, seed=0)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model.safetensors").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
