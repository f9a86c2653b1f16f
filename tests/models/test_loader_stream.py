"""The streaming loader: round trips of fp32 / bf16 / fp8 checkpoints (single and sharded, one and
several threads), FP8 kept or dequantized (dense and stacked experts, per-expert and fused), the
tiny model with FP8 kept on CPU, the progress bar, and peak host memory of a ~200 MB load."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_loader import _copy_with, _fp8_checkpoint_tensors, _quantize_blocks

from paddle_mla.models import ensure_tiny_model
from paddle_mla.models.deepseek import CausalLM
from paddle_mla.models.fp8 import Fp8Weight
from paddle_mla.models.loader import load_weights
from paddle_mla.models.safetensors_io import E4M3_TABLE, save_file
from paddle_mla.platform.tensor_api import torch

ROOT = Path(__file__).resolve().parents[2]
E = 4


def _arch(num_layers=2, block=None):
    return SimpleNamespace(num_layers=num_layers, fp8_block_size=block)


def _write(path: Path, tensors, raw=None, shards=1):
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, path / "model.safetensors", raw)
        return path
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, path / fname, {n: d for n, d in (raw or {}).items() if n in part})
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def _float_weights(seed=0):
    """fp32 weights under the checkpoint names the loader routes: plain, router, experts, nextn."""
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.standard_normal((37, 64)),
         "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((40, 64)),
         "model.layers.0.self_attn.kv_b_proj.weight": rng.standard_normal((48, 32)),
         "model.layers.1.mlp.gate.weight": rng.standard_normal((E, 64)),
         "model.layers.2.self_attn.o_proj.weight": rng.standard_normal((3, 3))}      # nextn: ignored
    for e in range(E):
        for kind, shape in (("gate", (32, 64)), ("up", (32, 64)), ("down", (64, 32))):
            w[f"model.layers.1.mlp.experts.{e}.{kind}_proj.weight"] = rng.standard_normal(shape)
    return {k: v.astype(np.float32) for k, v in w.items()}


def _np(t):
    return t.to(torch.float32).numpy()


def _expected(w, name):
    if ".experts." in name:
        prefix, rest = name.split(".experts.")
        kind = rest.split(".")[1].split("_")[0]
        return f"{prefix}.experts.{kind}"
    return name


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("threads", [1, 3])
def test_fp32_and_bf16_round_trip(tmp_path, shards, threads):
    w = _float_weights()
    bf = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in w.items()}
    p32 = _write(tmp_path / "f32", w, shards=shards)
    p16 = _write(tmp_path / "bf16", bf, {k: "BF16" for k in bf}, shards=shards)
    got32 = load_weights(p32, _arch(), torch.float32, "cpu", threads=threads, progress=False)
    got16 = load_weights(p16, _arch(), torch.bfloat16, "cpu", threads=threads, progress=False)
    widened = load_weights(p16, _arch(), torch.float32, "cpu", threads=threads, progress=False)
    assert sorted(got32) == sorted(got16) == sorted({_expected(w, k) for k in w if ".layers.2." not in k})
    for name in got32:
        src = [k for k in w if _expected(w, k) == name]
        want = np.stack([w[k] for k in sorted(src)]) if ".experts." in name else w[name]
        want_bf = np.stack([bf[k] for k in sorted(src)]) if ".experts." in name else bf[name]
        np.testing.assert_array_equal(_np(got32[name]), want)
        np.testing.assert_array_equal(_np(widened[name]), (want_bf.astype(np.uint32) << 16).view(np.float32))
        if name.endswith("mlp.gate.weight"):
            assert got16[name].dtype == torch.float32           # the router stays fp32
        else:
            assert got16[name].dtype == torch.bfloat16
            np.testing.assert_array_equal(got16[name].view(torch.int16).numpy().view(np.uint16), want_bf)


def _fp8_checkpoint(block=(16, 16)):
    w = _float_weights(1)
    tensors, raw, deq = {}, {}, {}
    for name, arr in w.items():
        if name.endswith("proj.weight"):
            codes, scales = _quantize_blocks(arr, block)
            tensors[name], tensors[name + "_scale_inv"], raw[name] = codes, scales, "F8_E4M3"
            full = np.repeat(np.repeat(scales, block[0], 0), block[1], 1)[:arr.shape[0], :arr.shape[1]]
            deq[name] = E4M3_TABLE[codes] * full
        else:
            tensors[name] = deq[name] = arr
    return tensors, raw, deq


@pytest.mark.parametrize("shards", [1, 2])
def test_fp8_kept_or_dequantized(tmp_path, shards):
    tensors, raw, deq = _fp8_checkpoint()
    path = _write(tmp_path / "fp8", tensors, raw, shards=shards)
    arch = _arch(block=(16, 16))
    plain = load_weights(path, arch, torch.float32, "cpu", progress=False)
    kept = load_weights(path, arch, torch.float32, "cpu", keep_fp8=True, progress=False)
    experts = load_weights(path, arch, torch.float32, "cpu", keep_fp8=True, expert_fp8=True, threads=3,
                           progress=False)
    o = "model.layers.0.self_attn.o_proj.weight"
    kv_b = "model.layers.0.self_attn.kv_b_proj.weight"
    np.testing.assert_array_equal(_np(plain[o]), deq[o])
    assert isinstance(kept[o], Fp8Weight) and kept[o].block == (16, 16) and not kept[o].kernel
    np.testing.assert_array_equal(kept[o].weight.view(torch.uint8).numpy(), tensors[o])
    np.testing.assert_array_equal(kept[o].scale_inv.numpy(), tensors[o + "_scale_inv"])
    np.testing.assert_array_equal(_np(kept[kv_b]), deq[kv_b])          # reshaped by MLA: dequantized
    for kind in ("gate", "up", "down"):
        key = f"model.layers.1.mlp.experts.{kind}"
        names = [f"model.layers.1.mlp.experts.{e}.{kind}_proj.weight" for e in range(E)]
        want = np.stack([deq[n] for n in names])
        np.testing.assert_array_equal(_np(plain[key]), want)
        np.testing.assert_array_equal(_np(kept[key]), want)            # experts dequantized unless asked
        fp8 = experts[key]
        assert isinstance(fp8, Fp8Weight) and fp8.weight.dtype == torch.float8_e4m3fn
        np.testing.assert_array_equal(fp8.weight.view(torch.uint8).numpy(), np.stack([tensors[n] for n in names]))
        np.testing.assert_array_equal(fp8.scale_inv.numpy(), np.stack([tensors[n + "_scale_inv"] for n in names]))
        np.testing.assert_array_equal(_np(fp8.dequantize()), want)


def test_fused_fp8_experts_split(tmp_path):
    rng = np.random.default_rng(5)
    gate_up = rng.standard_normal((E, 64, 48)).astype(np.float32)       # [E, 2I, h], I = 32: two 16-row blocks
    parts = [_quantize_blocks(gate_up[e], (16, 16)) for e in range(E)]
    codes, scales = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
    name = "model.layers.0.mlp.experts.gate_up_proj"
    path = _write(tmp_path / "fused", {name: codes, name + "_scale_inv": scales}, {name: "F8_E4M3"})
    deq = np.stack([E4M3_TABLE[c] * np.repeat(np.repeat(s, 16, 0), 16, 1) for c, s in parts])
    arch = _arch(block=(16, 16))
    kept = load_weights(path, arch, torch.float32, "cpu", keep_fp8=True, expert_fp8=True, progress=False)
    plain = load_weights(path, arch, torch.float32, "cpu", progress=False)
    p = "model.layers.0.mlp.experts"
    for key, rows in ((".gate", slice(0, 32)), (".up", slice(32, 64))):
        assert isinstance(kept[p + key], Fp8Weight) and kept[p + key].shape == (E, 32, 48)
        np.testing.assert_array_equal(_np(kept[p + key].dequantize()), deq[:, rows])
        np.testing.assert_array_equal(_np(plain[p + key]), deq[:, rows])


def test_tiny_model_with_fp8_kept_on_cpu(tmp_path, capsys, monkeypatch):
    """Every attention projection but kv_b kept FP8: the model runs the w8a8 reference path. With
    the activation quant made exact, it must equal the dequantized model (every kept weight and its
    block scales are wired right); with the real quant it runs and stays finite."""
    from helpers.model_harness import run_greedy

    from paddle_mla.models import fp8 as fp8_mod
    from paddle_mla.models import loader as loader_mod
    from paddle_mla.models.arch import load_arch

    monkeypatch.setattr(loader_mod, "LOAD_BAR_MIN_BYTES", 0)    # show the bar even for this tiny load
    tiny = ensure_tiny_model()
    fp8, raw, qcfg, _ = _fp8_checkpoint_tensors(tiny, (16, 16))
    path = _copy_with(tiny, tmp_path / "fp8", fp8, raw, qcfg)
    arch = load_arch(path)
    kept_w = load_weights(path, arch, torch.float32, "cpu", keep_fp8=True)
    assert "loading weights" in capsys.readouterr().err                     # the progress bar
    kept = CausalLM(arch, kept_w, "cpu", torch.float32)
    attn = kept.layers[1].attn
    assert all(isinstance(w, Fp8Weight) for w in (attn.q_a_proj, attn.q_b_proj, attn.kv_a_proj, attn.o_proj))
    deq = CausalLM(arch, load_weights(path, arch, torch.float32, "cpu", progress=False), "cpu", torch.float32)
    prompts = [[3, 9, 27, 81, 243, 100, 7], [11, 12, 13]]
    real = run_greedy(kept, prompts, 2, block_size=4)
    assert all(np.isfinite(x).all() for x in real.first_logits)

    def exact_quant(x, group=128, kernel=False):
        return x.to(torch.float32), torch.ones(x.shape[0], x.shape[1] // group, dtype=torch.float32)
    monkeypatch.setattr(fp8_mod, "per_token_group_quant", exact_quant)
    a, b = run_greedy(kept, prompts, 4, block_size=4), run_greedy(deq, prompts, 4, block_size=4)
    for x, y in zip(a.first_logits, b.first_logits):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    assert a.tokens == b.tokens


_RSS_SCRIPT = r"""
import json, sys
from types import SimpleNamespace
from paddle_mla.platform import runtime
runtime.select()
from paddle_mla.platform.tensor_api import torch
from paddle_mla.models.loader import load_weights

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
torch.zeros(4, dtype=torch.bfloat16).to(torch.float32)          # first-use allocations of the library
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                             # reset VmHWM to the current RSS
except OSError:
    pass
base = max(status("VmRSS"), status("VmHWM"))
w = load_weights(sys.argv[1], SimpleNamespace(num_layers=1, fp8_block_size=None), getattr(torch, sys.argv[2]),
                 "cpu", progress=False)
model_bytes = sum(int(t.numel()) * t.element_size() for t in w.values())
print(json.dumps({"base": base, "peak": status("VmHWM"), "model_bytes": model_bytes}))
"""


@pytest.mark.parametrize("target", ["bfloat16", "float32"])
def test_peak_host_memory_of_a_200mb_load(tmp_path_factory, target):
    """On CPU the model is host memory; above it the loader may hold only the tensor in flight (the
    largest is 8 MB stored, 16 MB cast to float32) and some allocator slack: not a float32 staging
    copy of the checkpoint (>= 400 MB here), nor the checkpoint's mapped file pages (200 MB)."""
    path = tmp_path_factory.getbasetemp() / "ckpt200"
    if not (path / "model.safetensors.index.json").exists():
        rng = np.random.default_rng(0)
        t = {f"model.layers.0.mlp.experts.{e}.{k}_proj.weight": rng.integers(0, 1 << 14, (1024, 1024), np.uint16)
             for e in range(32) for k in ("gate", "up", "down")}
        t["model.embed_tokens.weight"] = rng.integers(0, 1 << 14, (4096, 1024), np.uint16)
        _write(path, t, {k: "BF16" for k in t}, shards=2)
    ckpt_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    assert ckpt_bytes > 195e6
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path), target], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    above = r["peak"] - r["base"]
    extra = above - r["model_bytes"]
    assert extra <= (8 + 16 + 32) * 2 ** 20, (above, r)


@pytest.mark.gpu
@pytest.mark.parametrize("shards", [1, 3])
def test_gpu_load_matches_cpu_load(tmp_path, shards):
    """The device path (reused host buffers, several threads, cast on the device) gives the same
    tensors as the CPU path, for bf16 and FP8 (kept and dequantized) checkpoints."""
    from paddle_mla.platform import runtime

    dev = runtime.device_string("gpu")
    w = _float_weights()
    bf = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in w.items()}
    p16 = _write(tmp_path / "bf16", bf, {k: "BF16" for k in bf}, shards=shards)
    tensors, raw, _ = _fp8_checkpoint((32, 32))                      # GPU FP8 needs K blocks >= 32
    p8 = _write(tmp_path / "fp8", tensors, raw, shards=shards)
    cases = [(p16, _arch(), torch.bfloat16, {}), (p16, _arch(), torch.float32, {}),
             (p8, _arch(block=(32, 32)), torch.float32, {}),
             (p8, _arch(block=(32, 32)), torch.bfloat16, {"keep_fp8": True, "expert_fp8": True})]
    for path, arch, dtype, kw in cases:
        cpu = load_weights(path, arch, dtype, "cpu", progress=False, **kw)
        gpu = load_weights(path, arch, dtype, dev, threads=4, progress=False, **kw)
        assert sorted(cpu) == sorted(gpu)
        for name, c in cpu.items():
            g = gpu[name]
            if isinstance(c, Fp8Weight):
                assert isinstance(g, Fp8Weight) and g.kernel and not c.kernel
                assert torch.equal(g.weight.view(torch.uint8).cpu(), c.weight.view(torch.uint8))
                assert torch.equal(g.scale_inv.cpu(), c.scale_inv)
            else:
                assert g.dtype == c.dtype and torch.equal(g.cpu(), c), name
