"""The tensors a checkpoint of a ``ModelArch`` holds (plain data, no tensors), and the one check
that a checkpoint folder's tensors are those its config.json implies.

``checkpoint_layout``: {name: (shape, safetensors dtype)} of a published checkpoint of those
dimensions (DeepSeek, or one of the GQA families: qwen3, llama, ernie4_5 and their MoE): bf16, and
with an FP8 ``quantization_config`` e4m3 linear weights of the layers with their ``_scale_inv``
block scales, as DeepSeek-V3 is published. ``load_format: dummy`` makes its weights from it
(``models/dummy_weights.py``); ``load_model`` checks a real checkpoint against it
(``check_checkpoint``) before any weight is read, so a config.json that disagrees with its tensors
fails with one line naming a tensor rather than with a KeyError or a reshape error mid-load.
"""

from __future__ import annotations

import re

from paddle_mla.models.arch import ModelArch


def checkpoint_layout(arch: ModelArch) -> dict[str, tuple[list[int], str]]:
    """{name: (shape, safetensors dtype)} of a published checkpoint with ``arch``'s dimensions."""
    out = _gqa_layout(arch) if arch.family == "gqa" else _mla_layout(arch)
    if arch.fp8_block_size:
        _as_fp8(out, tuple(arch.fp8_block_size))
    return out


def _mlp(out: dict, p: str, h: int, inter: int, bias: bool = False) -> None:
    for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        out[f"{p}{name}.weight"] = (list(shape), "BF16")
        if bias:
            out[f"{p}{name}.bias"] = ([shape[0]], "BF16")


def _gqa_layout(arch: ModelArch) -> dict[str, tuple[list[int], str]]:
    """The transformers layout of qwen3 / llama / ernie4_5 and their MoE: q/k/v/o projections with
    the bias flags each family's config names, qwen3's per-head q/k norms, and (MoE) a router, the
    experts, ernie4_5_moe's shared experts and its correction bias ``moe_statics`` [1, E]."""
    g, h, V, raw, m = arch.gqa, arch.hidden_size, arch.vocab_size, arch.raw, arch.moe
    attn_bias = bool(raw.get("attention_bias") or raw.get("use_bias"))
    mlp_bias = bool(raw.get("mlp_bias") or raw.get("use_bias"))
    out: dict[str, tuple[list[int], str]] = {"model.embed_tokens.weight": ([V, h], "BF16")}
    for i in range(arch.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out[p + "input_layernorm.weight"] = ([h], "BF16")
        out[p + "post_attention_layernorm.weight"] = ([h], "BF16")
        for proj, rows in (("q", g.num_heads), ("k", g.num_kv_heads), ("v", g.num_kv_heads)):
            out[f"{a}{proj}_proj.weight"] = ([rows * g.head_dim, h], "BF16")
            if attn_bias:
                out[f"{a}{proj}_proj.bias"] = ([rows * g.head_dim], "BF16")
        out[a + "o_proj.weight"] = ([h, g.num_heads * g.head_dim], "BF16")
        if attn_bias:
            out[a + "o_proj.bias"] = ([h], "BF16")
        if arch.model_type in ("qwen3", "qwen3_moe"):
            out[a + "q_norm.weight"] = ([g.head_dim], "BF16")
            out[a + "k_norm.weight"] = ([g.head_dim], "BF16")
        if m is not None and m.is_moe_layer(i):
            inter = int(raw["moe_intermediate_size"])
            out[p + "mlp.gate.weight"] = ([m.n_routed_experts, h], "BF16")
            for e in range(m.n_routed_experts):
                _mlp(out, f"{p}mlp.experts.{e}.", h, inter)
            if m.n_shared_experts:
                _mlp(out, p + "mlp.shared_experts.", h, inter * m.n_shared_experts)
            if arch.model_type == "ernie4_5_moe":
                out[p + "mlp.moe_statics.e_score_correction_bias"] = ([1, m.n_routed_experts], "F32")
        else:
            _mlp(out, p + "mlp.", h, int(raw["intermediate_size"]), mlp_bias)
    out["model.norm.weight"] = ([h], "BF16")
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = ([V, h], "BF16")
    return out


def _mla_layout(arch: ModelArch) -> dict[str, tuple[list[int], str]]:
    d, h, V = arch.mla, arch.hidden_size, arch.vocab_size
    nope, rope, v, kvl, heads = d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim, d.kv_lora_rank, d.num_heads
    out: dict[str, tuple[list[int], str]] = {"model.embed_tokens.weight": ([V, h], "BF16")}

    def add(name: str, *shape: int) -> None:
        out[name] = (list(shape), "BF16")

    def mlp(p: str, inter: int) -> None:
        _mlp(out, p, h, inter)

    for i in range(arch.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        add(p + "input_layernorm.weight", h)
        add(p + "post_attention_layernorm.weight", h)
        if arch.q_lora_rank:
            add(a + "q_a_proj.weight", arch.q_lora_rank, h)
            add(a + "q_a_layernorm.weight", arch.q_lora_rank)
            add(a + "q_b_proj.weight", heads * (nope + rope), arch.q_lora_rank)
        else:
            add(a + "q_proj.weight", heads * (nope + rope), h)
        add(a + "kv_a_proj_with_mqa.weight", kvl + rope, h)
        add(a + "kv_a_layernorm.weight", kvl)
        add(a + "kv_b_proj.weight", heads * (nope + v), kvl)
        add(a + "o_proj.weight", h, heads * v)
        if arch.indexer is not None:
            s = arch.indexer
            add(a + "indexer.wq_b.weight", s.n_heads * s.head_dim, arch.q_lora_rank)
            add(a + "indexer.wk.weight", s.head_dim, h)
            add(a + "indexer.k_norm.weight", s.head_dim)
            add(a + "indexer.k_norm.bias", s.head_dim)
            add(a + "indexer.weights_proj.weight", s.n_heads, h)
        m = arch.moe
        if m is not None and m.is_moe_layer(i):
            add(p + "mlp.gate.weight", m.n_routed_experts, h)    # the loader makes it fp32
            if m.topk_method == "noaux_tc":
                out[p + "mlp.gate.e_score_correction_bias"] = ([m.n_routed_experts], "F32")
            inter = int(arch.raw["moe_intermediate_size"])
            for e in range(m.n_routed_experts):
                mlp(f"{p}mlp.experts.{e}.", inter)
            if m.n_shared_experts:
                mlp(p + "mlp.shared_experts.", inter * m.n_shared_experts)
        else:
            mlp(p + "mlp.", int(arch.raw["intermediate_size"]))
    add("model.norm.weight", h)
    if not arch.tie_word_embeddings:
        add("lm_head.weight", V, h)
    return out


def _as_fp8(out: dict, block: tuple[int, int]) -> None:
    """The published FP8 format: every linear weight of the layers (not the router, norms, the
    indexer, embeddings or lm_head) e4m3 with an fp32 ``_scale_inv`` [ceil(N/bn), ceil(K/bk)]."""
    for name, (shape, _) in list(out.items()):
        if name.startswith("model.layers.") and name.endswith(("_proj.weight", "_proj_with_mqa.weight")) \
                and ".indexer." not in name:
            out[name] = (shape, "F8_E4M3")
            out[name + "_scale_inv"] = ([-(-shape[0] // block[0]), -(-shape[1] // block[1])], "F32")


_MLP = re.compile(r"^model\.layers\.(\d+)\.mlp\.(experts\.\d+\.|shared_experts\.|gate\.)?")
# fused expert tensors (one [E, ...] tensor a projection): the layout check and the loader's split
# match them by this one rule
FUSED_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
# transformers initialises a missing correction bias to zeros, which is what the router does without one
_OPTIONAL = ("e_score_correction_bias",)


def _found_shapes(reader) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the checkpoint, fused experts ([E, 2I, h] gate_up_proj, [E, h, I] down_proj)
    under the per-expert names the layout lists."""
    out = {}
    for name in list(reader.keys()):
        shape = tuple(reader.file_of(name).shape(name))
        m = FUSED_EXPERTS.match(name)
        if not m or len(shape) != 3:
            out[name] = shape
        elif m.group(2) == "down_proj":
            out.update({f"{m.group(1)}.{e}.down_proj.weight": shape[1:] for e in range(shape[0])})
        else:
            half = (shape[1] // 2, shape[2])
            for e in range(shape[0]):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = out[f"{m.group(1)}.{e}.up_proj.weight"] = half
    return out


def _why_expected(name: str, arch: ModelArch, found) -> str:
    """Which part of config.json asks for ``name`` (and what the checkpoint has there instead)."""
    if name == "lm_head.weight":
        return " (config.json: tie_word_embeddings false)"
    m = _MLP.match(name)
    if not m:
        return ""
    i = int(m.group(1))
    layer = f"model.layers.{i}.mlp."
    moe_there = any(n.startswith((layer + "experts.", layer + "gate.")) for n in found)
    if m.group(2) is None:
        return f" (config.json makes layer {i} a dense layer" + (", the checkpoint a MoE layer)" if moe_there else ")")
    if m.group(2) == "shared_experts.":
        return f" (config.json: n_shared_experts {arch.moe.n_shared_experts})"
    dense_there = layer + "gate_proj.weight" in found
    return (f" (config.json makes layer {i} a MoE layer of {arch.moe.n_routed_experts} routed experts"
            + (", the checkpoint a dense layer)" if dense_there else ")"))


def check_checkpoint(arch: ModelArch, reader) -> None:
    """A ValueError naming the first tensor that config.json implies and the checkpoint (``reader``:
    a ``CheckpointReader``) lacks or holds in another shape. Tensors it has beyond those (MTP
    layers, biases the config does not name, zero-row shared experts) are not checked here."""
    found = _found_shapes(reader)
    for name, (shape, _) in checkpoint_layout(arch).items():
        if name.endswith("_scale_inv"):      # an FP8 config's scales; a bf16 checkpoint has none
            continue
        got = found.get(name)
        if got is None and not name.endswith(_OPTIONAL):
            raise ValueError(f"config.json and the checkpoint disagree: {name} is missing"
                             + _why_expected(name, arch, found))
        if got is not None and got != tuple(shape):
            raise ValueError(f"config.json and the checkpoint disagree: {name} has shape {got}, "
                             f"config.json implies {tuple(shape)}")
