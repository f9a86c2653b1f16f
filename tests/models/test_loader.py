"""Checkpoint loading: sharded index, FP8 block dequant, bf16, nextn layers, fused experts, rope spellings."""

import json
import shutil

import numpy as np
import pytest
from helpers.model_harness import run_greedy

from paddle_mla.models import load_model, make_tiny_model, parse_arch
from paddle_mla.models.safetensors_io import (
    E4M3_TABLE,
    CheckpointReader,
    SafetensorsFile,
    dequant_fp8_blocks,
    encode_e4m3,
    save_file,
)
from paddle_mla.platform.tensor_api import torch

PROMPTS = [[3, 9, 27, 81, 243, 100, 7], [11, 12, 13]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_loader"))


def _tensors(path):
    f = SafetensorsFile(path / "model.safetensors")
    return {k: np.array(f.get(k)) for k in f.keys()}


def _copy_with(src, dst, tensors, raw_dtypes=None, config_update=None):
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    if tensors is not None:
        save_file(tensors, dst / "model.safetensors", raw_dtypes)
    if config_update:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_update)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _logits(path):
    model = load_model(str(path), torch.float32, "cpu")
    res = run_greedy(model, PROMPTS, 4, block_size=4)
    return np.stack([res.first_logits[0], res.first_logits[1]]), res.tokens


def _quantize_blocks(w, block):
    """Per-block amax / 448 scales and e4m3 codes, the DeepSeek-V3 FP8 recipe."""
    br, bc = block
    rows, cols = w.shape
    scales = np.zeros(((rows + br - 1) // br, (cols + bc - 1) // bc), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            s = max(float(np.abs(blk).max()), 1e-12) / 448.0
            scales[i, j] = s
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = encode_e4m3(blk / s)
    return codes, scales


def test_e4m3_table_matches_torch():
    """The numpy decode table against the tensor library's own float8_e4m3fn (either runtime: a real
    ``import torch`` is not possible once Paddle's proxy is on)."""
    codes = torch.from_numpy(np.arange(256, dtype=np.uint8))
    want = codes.view(torch.float8_e4m3fn).to(torch.float32).numpy()
    np.testing.assert_array_equal(np.isnan(E4M3_TABLE), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(E4M3_TABLE[ok], want[ok])


@pytest.mark.parametrize("shape", [(200, 300), (128, 256), (37, 5), (129, 127)])
def test_fp8_block_dequant(tmp_path, shape):
    rng = np.random.default_rng(shape[0])
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3.0, size=(1, shape[1]))).astype(np.float32)
    codes, scales = _quantize_blocks(w, (128, 128))
    save_file({"layer.weight": codes, "layer.weight_scale_inv": scales}, tmp_path / "model.safetensors",
              raw_dtypes={"layer.weight": "F8_E4M3"})
    got = CheckpointReader(tmp_path).get("layer.weight")
    assert got.shape == shape and got.dtype == np.float32
    expect = E4M3_TABLE[codes] * np.repeat(np.repeat(scales, 128, 0), 128, 1)[:shape[0], :shape[1]]
    np.testing.assert_array_equal(got, expect)
    # e4m3 keeps 3 mantissa bits: relative error <= 1/16 of the value, plus subnormal steps of the block scale
    block_scale = np.repeat(np.repeat(scales, 128, 0), 128, 1)[:shape[0], :shape[1]]
    assert np.all(np.abs(got - w) <= np.abs(w) / 16 + block_scale * 2.0 ** -9 + 1e-7)
    np.testing.assert_array_equal(dequant_fp8_blocks(E4M3_TABLE[codes], scales), expect)


def _fp8_checkpoint_tensors(tiny, block):
    """The tiny model with attention projections and expert 1 of each layer in FP8 (``block`` blocks):
    (tensors, raw dtypes, config update, the same weights dequantized)."""
    tensors = _tensors(tiny)
    fp8, deq, raw = dict(tensors), dict(tensors), {}
    for name, w in tensors.items():
        if ".self_attn." in name and name.endswith(("proj.weight", "mqa.weight")) or ".experts.1." in name:
            codes, scales = _quantize_blocks(w, block)
            fp8[name], fp8[name + "_scale_inv"] = codes, scales
            raw[name] = "F8_E4M3"
            full = np.repeat(np.repeat(scales, block[0], 0), block[1], 1)[:w.shape[0], :w.shape[1]]
            deq[name] = E4M3_TABLE[codes] * full
    qcfg = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block),
                                    "activation_scheme": "dynamic"}}
    return fp8, raw, qcfg, deq


def test_fp8_checkpoint_loads_like_its_dequantized_weights(tiny, tmp_path):
    # small blocks so the tiny weights have many partial edge blocks
    fp8, raw, qcfg, deq = _fp8_checkpoint_tensors(tiny, (16, 16))
    a, ta = _logits(_copy_with(tiny, tmp_path / "fp8", fp8, raw, qcfg))
    b, tb = _logits(_copy_with(tiny, tmp_path / "deq", deq))
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert ta == tb


def test_sharded_checkpoint(tiny, tmp_path):
    tensors = _tensors(tiny)
    names = sorted(tensors)
    out = _copy_with(tiny, tmp_path / "sharded", None)
    weight_map = {}
    for k, part in enumerate((names[0::3], names[1::3], names[2::3])):
        fname = f"model-{k + 1:05d}-of-00003.safetensors"
        save_file({n: tensors[n] for n in part}, out / fname)
        weight_map.update({n: fname for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    a, ta = _logits(out)
    b, tb = _logits(tiny)
    np.testing.assert_array_equal(a, b)
    assert ta == tb


def test_nextn_layers_ignored_and_bf16(tiny, tmp_path):
    tensors = _tensors(tiny)
    n = json.loads((tiny / "config.json").read_text())["num_hidden_layers"]
    extra = dict(tensors)
    extra[f"model.layers.{n}.eh_proj.weight"] = np.ones((3, 5), np.float32)
    extra[f"model.layers.{n}.self_attn.kv_b_proj.weight"] = np.ones((7, 7), np.float32)
    extra[f"model.layers.{n}.mlp.experts.0.gate_proj.weight"] = np.ones((2, 2), np.float32)
    a, _ = _logits(_copy_with(tiny, tmp_path / "mtp", extra, config_update={"num_nextn_predict_layers": 1}))
    b, _ = _logits(tiny)
    np.testing.assert_array_equal(a, b)
    # bf16 storage: the loader widens to float32 exactly (truncated mantissa)
    bf = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in tensors.items()}
    path = _copy_with(tiny, tmp_path / "bf16", bf, raw_dtypes={k: "BF16" for k in bf})
    got = SafetensorsFile(path / "model.safetensors").get("model.norm.weight")
    np.testing.assert_array_equal(got, (bf["model.norm.weight"].astype(np.uint32) << 16).view(np.float32))
    load_model(str(path), torch.float32, "cpu")


def test_fused_expert_tensors(tiny, tmp_path):
    tensors = _tensors(tiny)
    cfg = json.loads((tiny / "config.json").read_text())
    fused = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        E = cfg["n_routed_experts"]
        fused[p + ".gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}.{e}.gate_proj.weight"],
                                                               tensors[f"{p}.{e}.up_proj.weight"]]) for e in range(E)])
        fused[p + ".down_proj"] = np.stack([tensors[f"{p}.{e}.down_proj.weight"] for e in range(E)])
    a, _ = _logits(_copy_with(tiny, tmp_path / "fused", fused))
    b, _ = _logits(tiny)
    np.testing.assert_array_equal(a, b)


def test_rope_parameters_and_rope_scaling_spellings(tiny, tmp_path):
    cfg = json.loads((tiny / "config.json").read_text())
    assert "rope_scaling" in cfg
    new = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta")}
    params = {("rope_type" if k == "type" else k): v for k, v in cfg["rope_scaling"].items()}
    new["rope_parameters"] = {**params, "rope_theta": cfg["rope_theta"]}
    a1, a2 = parse_arch(cfg), parse_arch(new)
    assert a1.rope == a2.rope and a1.mla == a2.mla
    assert a1.rope.rope_type == "yarn" and a1.rope.factor == 4.0
    # YaRN: softmax scale = qk_head_dim^-0.5 * mscale(mscale_all_dim)^2
    m = 0.1 * cfg["rope_scaling"]["mscale_all_dim"] * np.log(4.0) + 1.0
    assert a1.mla.softmax_scale == pytest.approx((cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5 * m * m)
    path = tmp_path / "rope_parameters"
    _copy_with(tiny, path, None)
    shutil.copy(tiny / "model.safetensors", path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(new))
    np.testing.assert_array_equal(_logits(path)[0], _logits(tiny)[0])
    plain = parse_arch({**cfg, "rope_scaling": None})
    assert plain.rope.rope_type == "default" and plain.mla.softmax_scale == pytest.approx(48 ** -0.5)


def test_unsupported_model_type_is_clear():
    with pytest.raises(ValueError, match="unsupported model_type"):
        parse_arch({"model_type": "gpt2"})


def test_non_silu_activation_is_refused(tiny):
    """The MLPs and experts are SwiGLU: a DeepSeek config of another hidden_act would run as SiLU."""
    cfg = json.loads((tiny / "config.json").read_text())
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        parse_arch({**cfg, "hidden_act": "gelu"})


@pytest.mark.parametrize("update,match", [
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok 9 must be 1 to the number of routed experts \(8\)"),
    ({"n_group": 3}, "n_group 3 does not divide the 8 routed experts"),
    ({"topk_group": 3}, r"topk_group 3 must be 1 to n_group \(2\)"),
    ({"n_group": 8, "topk_group": 2}, "noaux_tc needs groups of 2 or more experts; n_group 8 makes groups of 1"),
    ({"scoring_func": "relu"}, r"scoring_func 'relu' is not supported \(supported: softmax, sigmoid\)"),
    ({"topk_method": "top_p"}, "topk_method 'top_p' is not supported"),
])
def test_routing_a_router_cannot_run_is_refused(tiny, update, match):
    """Refused when config.json is parsed, naming the key, not at the first MoE layer's forward."""
    cfg = json.loads((tiny / "config.json").read_text())    # deepseek_v3: 8 experts, top-2, noaux_tc in 2 groups
    with pytest.raises(ValueError, match=match):
        parse_arch({**cfg, **update})


def test_greedy_routing_ignores_the_groups(tiny):
    """greedy routing does not read the groups: n_group 3 of 8 experts is no error there."""
    cfg = json.loads((tiny / "config.json").read_text())
    assert parse_arch({**cfg, "topk_method": "greedy", "n_group": 3}).moe.n_group == 3


def test_zero_shared_experts_with_empty_tensors_load(tiny, tmp_path):
    """n_shared_experts 0, saved (as transformers does) with zero-row shared-expert tensors: no shared
    MLP, the same logits as the checkpoint without those tensors."""
    weights = _tensors(tiny)
    hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    plain = {k: v for k, v in weights.items() if ".shared_experts." not in k}
    empty = {k: np.zeros((0, hidden) if "down" not in k else (hidden, 0), v.dtype) for k, v in weights.items()
             if ".shared_experts." in k}
    assert empty, "the tiny checkpoint has shared experts"
    path = _copy_with(tiny, tmp_path / "no_shared", {**plain, **empty}, config_update={"n_shared_experts": 0})
    ref = _copy_with(tiny, tmp_path / "no_shared_ref", plain, config_update={"n_shared_experts": 0})
    np.testing.assert_array_equal(_logits(path)[0], _logits(ref)[0])


@pytest.mark.parametrize("update,match", [
    ({"first_k_dense_replace": 2}, (r"model\.layers\.1\.mlp\.gate_proj\.weight is missing \(config\.json makes "
                                    r"layer 1 a dense layer, the checkpoint a MoE layer\)$")),
    ({"first_k_dense_replace": 0}, (r"model\.layers\.0\.mlp\.gate\.weight is missing \(config\.json makes layer 0 "
                                    r"a MoE layer of 8 routed experts, the checkpoint a dense layer\)$")),
    ({"num_hidden_layers": 4}, r"model\.layers\.3\.input_layernorm\.weight is missing$"),
    ({"num_attention_heads": 2}, (r"model\.layers\.0\.self_attn\.q_b_proj\.weight has shape \(192, 48\), "
                                  r"config\.json implies \(96, 48\)$")),
    ({"n_routed_experts": 4}, (r"model\.layers\.1\.mlp\.gate\.weight has shape \(8, 64\), config\.json implies "
                               r"\(4, 64\)$")),
    ({"n_shared_experts": 2}, (r"model\.layers\.1\.mlp\.shared_experts\.gate_proj\.weight has shape "
                               r"\(32, 64\), config\.json implies \(64, 64\)$")),
], ids=["dense_layer_is_moe", "moe_layer_is_dense", "layers", "heads", "experts", "shared_experts"])
def test_a_config_that_disagrees_with_its_checkpoint_fails_in_one_line(tiny, tmp_path, update, match):
    """Checked against config.json's layout before any weight is read: one line naming the tensor,
    not a KeyError or a reshape error from the middle of the load."""
    path = _copy_with(tiny, tmp_path / "disagrees", None, config_update=update)
    shutil.copy(tiny / "model.safetensors", path / "model.safetensors")
    with pytest.raises(ValueError, match="^config.json and the checkpoint disagree: " + match) as err:
        load_model(str(path), torch.float32, "cpu")
    assert "\n" not in str(err.value)


def test_a_fused_experts_checkpoint_of_other_expert_count_is_named(tiny, tmp_path):
    """The fused spelling (gate_up_proj [E, 2I, h]) is checked as its per-expert tensors."""
    tensors = _tensors(tiny)
    cfg = json.loads((tiny / "config.json").read_text())
    fused = {k: v for k, v in tensors.items() if not k.startswith("model.layers.2.mlp.experts.")}
    p = "model.layers.2.mlp.experts"
    fused[p + ".gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}.{e}.gate_proj.weight"],
                                                           tensors[f"{p}.{e}.up_proj.weight"]]) for e in range(6)])
    fused[p + ".down_proj"] = np.stack([tensors[f"{p}.{e}.down_proj.weight"] for e in range(6)])
    path = _copy_with(tiny, tmp_path / "fused6", fused)
    with pytest.raises(ValueError, match=r"disagree: model\.layers\.2\.mlp\.experts\.6\.gate_proj\.weight is missing "
                                         rf"\(config\.json makes layer 2 a MoE layer of {cfg['n_routed_experts']} "
                                         r"routed experts\)$"):
        load_model(str(path), torch.float32, "cpu")
