"""``load_format: dummy``: random weights built from config.json alone (benchmarks).

The independent reference is the real loader on real checkpoints: the dummy load must give every
tensor it gives (same names, shapes, dtypes, FP8-ness), per tensor-parallel rank too, for the
DeepSeek-V2 / V3 / V3.2 tiny models and for a tiny V3 in the published FP8 format (every linear of
the layers e4m3 + block scales); the dummy layout itself must equal that checkpoint's file layout.
Then the engine runs on a folder holding only config.json: generate on one rank, and (torch only,
as all TP tests) the whole TP=2 flow over gloo.
"""

import json
import shutil

import numpy as np
import pytest
from test_loader import _copy_with, _quantize_blocks, _tensors

from paddle_mla.platform import runtime
from paddle_mla.models import ensure_tiny_model, load_arch
from paddle_mla.models.dummy_weights import DummyReader, dummy_weights
from paddle_mla.models.fp8 import Fp8Weight
from paddle_mla.models.loader import load_weights
from paddle_mla.models.safetensors_io import CheckpointReader
from paddle_mla.parallel.launcher import TORCH_ONLY
from paddle_mla.platform.tensor_api import torch

SPLITS = [(0, 1), (0, 2), (1, 2)]


@pytest.fixture(scope="module")
def fp8_v3(tmp_path_factory):
    """The tiny V3 as DeepSeek publishes V3: every linear weight of the layers except the router in
    e4m3 with [ceil(N/16), ceil(K/16)] scales (16 x 16 blocks: tiny widths, partial edge blocks)."""
    tiny = ensure_tiny_model("deepseek_v3")
    tensors, fp8, raw = _tensors(tiny), {}, {}
    for name, w in tensors.items():
        if name.startswith("model.layers.") and name.endswith(("_proj.weight", "_proj_with_mqa.weight")):
            fp8[name], fp8[name + "_scale_inv"] = _quantize_blocks(w, (16, 16))
            raw[name] = "F8_E4M3"
        else:
            fp8[name] = w
    qcfg = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16],
                                    "activation_scheme": "dynamic"}}
    return _copy_with(tiny, tmp_path_factory.mktemp("dummy") / "fp8_v3", fp8, raw, qcfg)


def _describe(t):
    if isinstance(t, Fp8Weight):
        return ("fp8", tuple(t.weight.shape), str(t.weight.dtype), tuple(t.scale_inv.shape), str(t.scale_inv.dtype))
    return ("dense", tuple(t.shape), str(t.dtype))


def _same_as_loader(path, splits=SPLITS, **kwargs):
    arch = load_arch(path)
    for rank, size in splits:
        real = load_weights(path, arch, torch.float32, "cpu", tp_rank=rank, tp_size=size, **kwargs)
        fake = dummy_weights(arch, torch.float32, "cpu", tp_rank=rank, tp_size=size, **kwargs)
        assert sorted(fake) == sorted(real)
        for name in real:
            assert _describe(fake[name]) == _describe(real[name]), (name, rank, size)
    return fake


@pytest.mark.parametrize("arch_name", ["deepseek_v2", "deepseek_v3", "deepseek_v32"])
def test_builds_what_the_loader_loads(arch_name):
    path = ensure_tiny_model(arch_name)
    reader = CheckpointReader(path)       # the tiny's files are fp32, the published ones bf16: shapes here
    assert {k: shape for k, (shape, _) in DummyReader(load_arch(path)).layout.items()} == {
        k: reader.file_of(k).shape(k) for k in reader.keys()}
    _same_as_loader(path)


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept_fp8"])
def test_fp8_as_published(fp8_v3, keep):
    reader, arch = CheckpointReader(fp8_v3), load_arch(fp8_v3)
    # the tiny's plain tensors are fp32 on file, the published ones bf16; FP8 codes and scales as published
    published = {k: (reader.file_of(k).shape(k), "BF16" if reader.dtype(k) == "F32" and not k.endswith(
        ("_scale_inv", "e_score_correction_bias")) else reader.dtype(k)) for k in reader.keys()}
    assert DummyReader(arch).layout == published
    fake = _same_as_loader(fp8_v3, keep_fp8=keep, expert_fp8=keep)
    assert any(isinstance(t, Fp8Weight) for t in fake.values()) == keep


def test_values_are_an_init():
    """N(0, 0.02) linears, ones for norms, zero correction bias; replicated tensors equal on every
    rank (each is seeded from its name); FP8 codes dequantize to the same spread."""
    arch = load_arch(ensure_tiny_model("deepseek_v3"))
    r0, r1 = (dummy_weights(arch, torch.float32, "cpu", tp_rank=r, tp_size=2) for r in (0, 1))
    w = r0["model.layers.1.mlp.experts.gate"].numpy()
    assert np.isfinite(w).all() and abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002
    np.testing.assert_array_equal(r0["model.layers.0.input_layernorm.weight"].numpy(), np.ones(arch.hidden_size))
    np.testing.assert_array_equal(r0["model.layers.1.mlp.gate.e_score_correction_bias"].numpy(), 0)
    for name in ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.1.mlp.gate.weight"):
        np.testing.assert_array_equal(r0[name].numpy(), r1[name].numpy())


def test_fp8_values_spread_like_bf16(fp8_v3):
    arch = load_arch(fp8_v3)
    w = dummy_weights(arch, torch.float32, "cpu")["model.layers.0.self_attn.o_proj.weight"].numpy()  # dequantized
    assert np.isfinite(w).all() and abs(w.std() - 0.02) < 0.003


def _config_only(tmp_path, src):
    out = tmp_path / "config_only"
    out.mkdir()
    shutil.copy(src / "config.json", out / "config.json")
    return out


def _generate(path, tp: int, prompts, **cfg):
    from paddle_mla.config.schema import config_from_dict
    from paddle_mla.engine.llm import LLM
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    llm = LLM(config_from_dict({"model": str(path), "load_format": "dummy", "device": "cpu", "dtype": "float32",
                                "parallel": {"tensor_parallel_size": tp}, **cfg}))
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        outs = llm.generate([GenerationRequest(i, p, params) for i, p in enumerate(prompts)], use_tqdm=False)
        assert [o.error for o in outs] == [None] * len(prompts)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.close()


PROMPTS = [[5, 17, 33, 2, 91, 64, 40], [44, 9, 81, 27], [60, 1, 96, 38, 22]]


def test_generate_from_config_json_alone(tmp_path):
    path = _config_only(tmp_path, ensure_tiny_model("deepseek_v3"))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    tokens = _generate(path, 1, PROMPTS)
    assert [len(t) for t in tokens] == [6] * 3 and all(0 <= x < vocab for t in tokens for x in t)
    assert len({x for t in tokens for x in t}) > 1       # not one token everywhere: logits are not degenerate
    assert _generate(path, 1, PROMPTS) == tokens          # seeded: the same weights each time


@pytest.mark.skipif(runtime.is_paddle(), reason=TORCH_ONLY)
def test_tp2_over_gloo(tmp_path):
    """The whole TP flow with dummy weights: spawned worker, its own shards made on its device,
    chunked prefill, all-reduces, gathered logits."""
    path = _config_only(tmp_path, ensure_tiny_model("deepseek_v32"))
    tokens = _generate(path, 2, PROMPTS, runtime="torch",
                       scheduler={"enable_chunked_prefill": True, "max_num_batched_tokens": 8, "max_num_seqs": 2})
    assert [len(t) for t in tokens] == [6] * 3
