"""``load_format: dummy``: random weights built on each rank's device, for benchmarks (vLLM's name).

The only input is the model folder's ``config.json``. ``checkpoint_layout`` lists the tensors a
published checkpoint of those dimensions holds (DeepSeek, or one of the GQA families: qwen3, llama,
ernie4_5 and their MoE) (names, shapes, safetensors dtypes: bf16,
and when the config has an FP8 ``quantization_config``, e4m3 linear weights of the layers with their
``_scale_inv`` block scales, as DeepSeek-V3 is published). ``DummyLoader`` is the streaming loader
(``paddle_mla.models.loader``) reading that layout instead of files: the same plan, the same
tensor-parallel shards (``paddle_mla.models.sharding``), the same FP8 keep / dequantize choices
and expert stacking; only the one place where bytes come from a file (``_raw``) makes them on the
device instead, already in the target dtype and already this rank's shard. No weights travel and
nothing is written.

Values: linear weights and embeddings ~ N(0, std) with std = ``initializer_range`` (0.02 when the
config has none), as a real init, so activations stay finite and the router's scores spread over
the experts (routing is not degenerate); FP8 weights are N(0, 1) in e4m3 with block scales of
std (the same spread after dequantization); norms are ones; biases zeros. Every tensor is seeded
from its name, so replicated tensors are the same on every rank. Values are not those of any
checkpoint, and a TP=2 engine's weights are not slices of a TP=1 engine's: outputs are noise. For
benchmarks only.
"""

from __future__ import annotations

import zlib
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.models.arch import ModelArch
from paddle_mla.models.loader import StreamingLoader, _TORCH_DTYPES

DEFAULT_STD = 0.02
_NORMS = ("norm.weight", "layernorm.weight")
_ZEROS = (".bias", "e_score_correction_bias")


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


class DummyReader:
    """The part of ``CheckpointReader`` (and of one file) the loader uses, over ``checkpoint_layout``."""

    _SIZES = {"F32": 4, "BF16": 2, "F8_E4M3": 1}

    def __init__(self, arch: ModelArch):
        self.layout = checkpoint_layout(arch)

    def keys(self) -> list[str]:
        return list(self.layout)

    def __contains__(self, name: str) -> bool:
        return name in self.layout

    def file_of(self, name: str) -> "DummyReader":
        return self

    def dtype(self, name: str) -> str:
        return self.layout[name][1]

    def shape(self, name: str) -> list[int]:
        return list(self.layout[name][0])

    def nbytes(self, name: str) -> int:
        shape, dt = self.layout[name]
        n = self._SIZES[dt]
        for s in shape:
            n *= s
        return n


class DummyLoader(StreamingLoader):
    """The streaming loader over ``DummyReader``: one thread (tensors are made on the device in
    order, each seeded from its name), no progress bar (nothing is read)."""

    def __init__(self, arch: ModelArch, dtype: Any, device: str, seed: int = 0, **kwargs):
        kwargs.update(threads=1, progress=False)
        super().__init__(None, arch, dtype, device, reader=DummyReader(arch), **kwargs)
        self.std = float(arch.raw.get("initializer_range") or DEFAULT_STD)
        self.seed = seed

    def _raw(self, name: str, target=None, transient: bool = False, shard=None):
        shape = self.reader.shape(name)
        if shard is not None:
            shape = shard.shape(shape)
        stored = getattr(torch, _TORCH_DTYPES[self.reader.dtype(name)])
        dtype = target if target is not None else stored
        if name.endswith("_scale_inv"):
            return torch.full(shape, self.std, dtype=dtype, device=self.device)
        if name.endswith(_ZEROS):
            return torch.zeros(shape, dtype=dtype, device=self.device)
        if name.endswith(_NORMS):
            return torch.ones(shape, dtype=dtype, device=self.device)
        torch.manual_seed(self.seed ^ zlib.crc32(name.encode()))
        if dtype == torch.float8_e4m3fn:    # N(0, 1) codes (through fp32: any runtime); the scales carry std
            return torch.empty(shape, dtype=torch.float32, device=self.device).normal_(0.0, 1.0).to(dtype)
        return torch.empty(shape, dtype=dtype, device=self.device).normal_(0.0, self.std)


def dummy_weights(arch: ModelArch, dtype: Any, device: str, **kwargs) -> dict[str, Any]:
    """What ``load_weights`` returns for a checkpoint of ``arch``'s layout, with random values."""
    return DummyLoader(arch, dtype, device, **kwargs).load()
