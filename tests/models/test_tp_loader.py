"""Tensor-parallel loading: each rank's tensors are exactly its slices of the full load.

No processes here (the loader needs no collectives), so it runs under both runtimes: plain,
FP8 block-scaled (block-aligned shards keep the matching scale slice; misaligned ones are
dequantized whole, then sliced), and fused-expert checkpoints; an uneven vocabulary split.
"""

import numpy as np
import pytest
from test_loader import _copy_with, _fp8_checkpoint_tensors, _tensors

from paddle_mla.models import load_arch, make_tiny_model
from paddle_mla.models.fp8 import Fp8Weight
from paddle_mla.models.loader import load_weights
from paddle_mla.models.sharding import checkpoint_shard, local_arch, split_range
from paddle_mla.platform.tensor_api import torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_tp_loader"))


def _np(t):
    if isinstance(t, Fp8Weight):
        t = t.dequantize(torch.float32)
    return t.to(torch.float32).cpu().numpy()


def _expected(name, full, arch, rank, size):
    """The slice of the full load's tensor ``name`` that ``rank`` must hold."""
    if name.endswith(".experts.gate") or name.endswith(".experts.up"):
        lo, hi = split_range(full.shape[1], rank, size)
        return full[:, lo:hi]
    if name.endswith(".experts.down"):
        lo, hi = split_range(full.shape[2], rank, size)
        return full[:, :, lo:hi]
    shard = checkpoint_shard(name, list(full.shape), arch, rank, size)
    return full if shard is None else full[shard.numpy_index()]


def _check_shards(path, size=2):
    arch = load_arch(path)
    full = {k: _np(v) for k, v in load_weights(path, arch, torch.float32, "cpu").items()}
    sharded_some = False
    for rank in range(size):
        local = load_weights(path, arch, torch.float32, "cpu", tp_rank=rank, tp_size=size)
        assert sorted(local) == sorted(full)
        for name, t in local.items():
            want = _expected(name, full[name], arch, rank, size)
            sharded_some |= want.shape != full[name].shape
            np.testing.assert_array_equal(_np(t), want, err_msg=name)
    assert sharded_some


def test_plain_checkpoint_shards(tiny):
    _check_shards(tiny)


@pytest.mark.parametrize("block", [(16, 16), (24, 24)], ids=["aligned", "misaligned"])
def test_fp8_checkpoint_shards(tiny, tmp_path, block):
    fp8, raw, qcfg, _ = _fp8_checkpoint_tensors(tiny, block)
    _check_shards(_copy_with(tiny, tmp_path / "fp8", fp8, raw, qcfg))


def test_fused_expert_checkpoint_shards(tiny, tmp_path):
    tensors = _tensors(tiny)
    arch = load_arch(tiny)
    fused = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for i in range(arch.moe.first_k_dense_replace, arch.num_layers):
        p = f"model.layers.{i}.mlp.experts"
        E = arch.moe.n_routed_experts
        fused[p + ".gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}.{e}.gate_proj.weight"],
                                                               tensors[f"{p}.{e}.up_proj.weight"]]) for e in range(E)])
        fused[p + ".down_proj"] = np.stack([tensors[f"{p}.{e}.down_proj.weight"] for e in range(E)])
    _check_shards(_copy_with(tiny, tmp_path / "fused", fused))


def test_uneven_vocab_and_bad_head_split(tiny):
    arch = load_arch(tiny)
    v = arch.vocab_size
    parts = [split_range(v + 1, r, 3) for r in range(3)]
    assert parts[0][0] == 0 and parts[-1][1] == v + 1
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert local_arch(arch, 2).mla.num_heads == arch.mla.num_heads // 2
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        local_arch(arch, 3)


def test_parallel_config_is_validated():
    from paddle_mla.config.schema import ConfigError, load_config

    cfg = load_config(None, ("parallel.tensor_parallel_size=2",))
    assert (cfg.parallel.tensor_parallel_size, cfg.parallel.data_parallel_size) == (2, 1)
    for bad, words in ((("parallel.tensor_parallel_size=0",), "tensor_parallel_size' is 0"),
                       (("parallel.data_parallel_size=0",), "data_parallel_size' is 0"),
                       (("runtime=paddle", "parallel.tensor_parallel_size=2"), "torch-only")):
        with pytest.raises(ConfigError, match=words):
            load_config(None, bad)


def test_gqa_checkpoint_shards(tmp_path):
    """A llama checkpoint with every bias (6 q heads, 2 KV heads, head_dim 10) over 2 ranks: each
    rank holds its KV head's k/v rows and biases and the q heads of that group, its o_proj columns,
    its MLP widths; o_proj / down_proj biases and norms whole. Head ranges written out here."""
    pytest.importorskip("transformers")
    from test_gqa_oracle import CONFIGS, _hf_model

    prefix, extra, _ = CONFIGS["llama_g1_llama3_bias"]
    dims = {"num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 10}
    _hf_model(prefix, {**extra, **dims}).save_pretrained(tmp_path)
    _check_shards(tmp_path)
    arch = load_arch(tmp_path)
    full = {k: _np(v) for k, v in load_weights(tmp_path, arch, torch.float32, "cpu").items()}
    a, inter = "model.layers.1.self_attn.", full["model.layers.1.mlp.gate_proj.weight"].shape[0]
    for rank in range(2):
        loaded = load_weights(tmp_path, arch, torch.float32, "cpu", tp_rank=rank, tp_size=2)
        local = {k: _np(v) for k, v in loaded.items()}
        q, kv = slice(rank * 30, rank * 30 + 30), slice(rank * 10, rank * 10 + 10)   # 3 q heads / 1 KV head of 10
        for n in ("q_proj.weight", "q_proj.bias"):
            np.testing.assert_array_equal(local[a + n], full[a + n][q])
        for n in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
            np.testing.assert_array_equal(local[a + n], full[a + n][kv])
        np.testing.assert_array_equal(local[a + "o_proj.weight"], full[a + "o_proj.weight"][:, q])
        np.testing.assert_array_equal(local[a + "o_proj.bias"], full[a + "o_proj.bias"])
        lo, hi = split_range(inter, rank, 2)
        m = "model.layers.1.mlp."
        np.testing.assert_array_equal(local[m + "up_proj.bias"], full[m + "up_proj.bias"][lo:hi])
        np.testing.assert_array_equal(local[m + "down_proj.weight"], full[m + "down_proj.weight"][:, lo:hi])
        np.testing.assert_array_equal(local[m + "down_proj.bias"], full[m + "down_proj.bias"])
    local_dims = local_arch(arch, 2).gqa
    assert (local_dims.num_heads, local_dims.num_kv_heads, local_dims.head_dim) == (3, 1, 10)


def test_gqa_shards_balance_head_wise_swa_heads(tmp_path):
    """4 KV heads of 10 (8 q heads, group 2), the last 2 SWA heads, over 2 ranks: rank r holds full
    head r, then SWA head 2 + r (q heads, k/v rows, biases and o_proj columns alike, in that order);
    the dummy loader makes the same shapes. Head ranges written out here."""
    pytest.importorskip("transformers")
    from test_gqa_oracle import CONFIGS, _hf_model

    from paddle_mla.models.dummy_weights import dummy_weights

    prefix, extra, _ = CONFIGS["llama_g1_llama3_bias"]
    dims = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 10, "hidden_size": 56}
    _hf_model(prefix, {**extra, **dims}).save_pretrained(tmp_path)
    arch = load_arch(tmp_path)
    full = {k: _np(v) for k, v in load_weights(tmp_path, arch, torch.float32, "cpu").items()}
    a = "model.layers.0.self_attn."
    for rank in range(2):
        local = {k: _np(v) for k, v in load_weights(tmp_path, arch, torch.float32, "cpu", tp_rank=rank, tp_size=2,
                                                    swa_kv_heads=2).items()}
        q = np.r_[rank * 20:rank * 20 + 20, 40 + rank * 20:40 + rank * 20 + 20]     # 2 q heads of each KV head
        kv = np.r_[rank * 10:rank * 10 + 10, 20 + rank * 10:20 + rank * 10 + 10]
        for n in ("q_proj.weight", "q_proj.bias"):
            np.testing.assert_array_equal(local[a + n], full[a + n][q])
        for n in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
            np.testing.assert_array_equal(local[a + n], full[a + n][kv])
        np.testing.assert_array_equal(local[a + "o_proj.weight"], full[a + "o_proj.weight"][:, q])
        fake = dummy_weights(arch, torch.float32, "cpu", tp_rank=rank, tp_size=2, swa_kv_heads=2)
        assert {k: tuple(v.shape) for k, v in fake.items() if "self_attn" in k} == {
            k: v.shape for k, v in local.items() if "self_attn" in k}
    with pytest.raises(Exception, match="must divide both the 3 full and the 1 SWA"):
        checkpoint_shard(a + "k_proj.weight", [40, 1], arch, 0, 2, swa_kv_heads=1)
