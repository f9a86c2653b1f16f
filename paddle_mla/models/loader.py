"""HF checkpoint folder -> CausalLM: config.json + safetensors (single file or sharded index).

Tensor names are those of the published DeepSeek checkpoints (per-expert
``mlp.experts.E.{gate,up,down}_proj.weight``, which transformers 5 ``save_pretrained`` also
writes); fused ``mlp.experts.gate_up_proj`` [E, 2I, h] / ``mlp.experts.down_proj`` [E, h, I]
are accepted too. Layers >= num_hidden_layers (MTP / nextn) are ignored. FP8 weights are
dequantized at load (``safetensors_io``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paddle_mla.models.arch import ModelArch, load_arch
from paddle_mla.models.deepseek import CausalLM
from paddle_mla.models.safetensors_io import CheckpointReader

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
# kept in float32 whatever the model dtype (the router runs in fp32, as in transformers)
_FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")


def read_numpy_weights(model_dir: str | Path, arch: ModelArch) -> dict[str, np.ndarray]:
    """All weights the model uses, as float32 numpy, experts stacked as ``<prefix>.{gate,up,down}`` [E, ...]."""
    reader = CheckpointReader(model_dir)
    block = arch.fp8_block_size or (128, 128)
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for name in reader.keys():
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= arch.num_layers:
            continue                      # nextn / MTP layers
        if name.endswith(("_scale_inv", ".weight_scale", ".input_scale")):
            continue                      # consumed by reader.get
        if name.endswith("rotary_emb.inv_freq"):
            continue
        arr = reader.get(name, block)
        em = _EXPERT.match(name)
        if em:
            experts.setdefault(em.group(1), {}).setdefault(em.group(3), {})[int(em.group(2))] = arr
            continue
        fm = _FUSED.match(name)
        if fm:
            prefix = fm.group(1)
            if fm.group(2) == "gate_up_proj":
                inter = arr.shape[1] // 2
                out[prefix + ".gate"] = np.ascontiguousarray(arr[:, :inter])
                out[prefix + ".up"] = np.ascontiguousarray(arr[:, inter:])
            else:
                out[prefix + ".down"] = arr
            continue
        out[name] = arr
    for prefix, parts in experts.items():
        for kind, by_idx in parts.items():
            n = len(by_idx)
            if sorted(by_idx) != list(range(n)):
                raise ValueError(f"{prefix}: expert indices are not 0..{n - 1}")
            out[f"{prefix}.{kind}"] = np.stack([by_idx[e] for e in range(n)])
    return out


def to_tensors(weights: dict[str, np.ndarray], dtype: Any, device: str) -> dict[str, Any]:
    result = {}
    for name, arr in weights.items():
        t = torch.from_numpy(np.array(arr, dtype=np.float32))   # a writable copy (the file is memory-mapped)
        want = torch.float32 if name.endswith(_FP32_SUFFIXES) else dtype
        result[name] = t.to(device=device, dtype=want)
    return result


def load_model(model_dir: str, dtype: Any, device: str) -> CausalLM:
    """Load a deepseek_v2 / deepseek_v3 checkpoint folder onto ``device`` with weights in ``dtype``."""
    arch = load_arch(model_dir)
    weights = to_tensors(read_numpy_weights(model_dir, arch), dtype, device)
    return CausalLM(arch, weights, device, dtype)
