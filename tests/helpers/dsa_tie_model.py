"""A tiny deepseek_v32 checkpoint built to tie at the indexer's top-k boundary.

An index score is ``sum_h w_h * relu(q_h . k_j)``: exactly 0 wherever every head's ReLU is 0, and
with few heads that is a large share of the keys, so the k-th largest score of a row is often one of
many zeros. Taken from the tiny model by keeping the first ``index_heads`` indexer heads (the
weights of the others dropped, the rest unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

from paddle_mla.models import make_tiny_model
from paddle_mla.models.safetensors_io import CheckpointReader, save_file


def make_tie_model(out_dir, index_heads: int = 4, seed: int = 0) -> Path:
    out = make_tiny_model(out_dir, arch="deepseek_v32", seed=seed)
    cfg = json.loads((out / "config.json").read_text())
    assert index_heads <= cfg["index_n_heads"]
    head_dim = cfg["index_head_dim"]
    reader = CheckpointReader(out)
    weights = {name: reader.get(name).copy() for name in reader.keys()}
    del reader
    for name in weights:
        if name.endswith("indexer.wq_b.weight"):
            weights[name] = weights[name][:index_heads * head_dim].copy()
        elif name.endswith("indexer.weights_proj.weight"):
            weights[name] = weights[name][:index_heads].copy()
    cfg["index_n_heads"] = index_heads
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(weights, out / "model.safetensors")
    return out
