"""Random checkpoints the end-to-end benchmarks load (written once per folder, then reused): sharded
safetensors of a DeepSeek-family config streamed from a bf16 pool (numpy only: a data-parallel replica
that re-imports its script does not select a runtime through this), Qwen3 per-layer files, and
folders holding config.json alone for ``load_format: dummy``."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness.dims import QWEN3_8B, SMOKE_GQA, SMOKE_MOE, V2_LITE


def dummy_model_dir(path: Path, cfg: dict) -> Path:
    """``path`` holding only ``cfg`` as config.json: the engine draws the weights (``load_format: dummy``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def tensor_specs(cfg: dict) -> list[tuple[str, list[int]]]:
    h, heads, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, v, kvl = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    specs = [("model.embed_tokens.weight", [vocab, h])]

    def mlp(p, inter):
        specs.extend([(p + "gate_proj.weight", [inter, h]), (p + "up_proj.weight", [inter, h]),
                      (p + "down_proj.weight", [h, inter])])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        specs += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                  (a + "q_proj.weight", [heads * (nope + rope), h]), (a + "kv_a_proj_with_mqa.weight", [kvl + rope, h]),
                  (a + "kv_a_layernorm.weight", [kvl]), (a + "kv_b_proj.weight", [heads * (nope + v), kvl]),
                  (a + "o_proj.weight", [h, heads * v])]
        if i >= cfg["first_k_dense_replace"]:
            specs.append((p + "mlp.gate.weight", [cfg["n_routed_experts"], h]))
            for e in range(cfg["n_routed_experts"]):
                mlp(f"{p}mlp.experts.{e}.", cfg["moe_intermediate_size"])
            mlp(p + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            mlp(p + "mlp.", cfg["intermediate_size"])
    specs += [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]
    return specs


def write_checkpoint(out: Path, cfg: dict, shard_bytes: int) -> int:
    """Stream random bf16 tensors into shards (no shard is built in memory); returns parameters."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(32 << 20).astype(np.float32) * 0.02).view(np.uint32) >> 16
    pool = pool.astype(np.uint16).tobytes()           # 64 MB of bf16 values, cycled through
    specs = tensor_specs(cfg)
    shards, cur, size = [], [], 0
    for name, shape in specs:
        nbytes = int(np.prod(shape)) * 2
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, nbytes))
        size += nbytes
    shards.append(cur)
    weight_map, params, pos = {}, 0, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, nbytes in shard:
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[name] = fname
            params += nbytes // 2
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for _, _, nbytes in shard:
                left = nbytes
                while left:
                    start = pos % len(pool)
                    take = min(left, len(pool) - start)
                    f.write(pool[start:start + take])
                    pos, left = pos + take, left - take
        print(f"  wrote {fname} ({off / 1e9:.2f} GB)", file=sys.stderr, flush=True)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return params


def moe_checkpoint(layers: int, smoke: bool = False, folder: str = "", dummy: bool = False) -> tuple[Path, dict]:
    """(folder, config) of the end-to-end MoE workload's checkpoint: V2-Lite dims cut to ``layers``
    (``smoke``: tiny dims), in /tmp/bench_e2e_moe_<layers>L[_smoke] unless ``folder``; shared by the
    MoE, data-parallel, chunked-prefill and profiling benchmarks. ``dummy``: config.json alone, in a
    folder of its own (for ``load_format: dummy``; a checkpoint's folder is never overwritten)."""
    cfg = dict(V2_LITE, num_hidden_layers=layers, **(SMOKE_MOE if smoke else {}))
    if dummy:
        return dummy_model_dir(Path(f"/tmp/bench_dummy_moe_{layers}L{'_smoke' if smoke else ''}"), cfg), cfg
    path = Path(folder or f"/tmp/bench_e2e_moe_{layers}L{'_smoke' if smoke else ''}")
    if not (path / "config.json").exists():
        print(f"writing a random bf16 checkpoint to {path}", file=sys.stderr)
        write_checkpoint(path, cfg, 5 * 10 ** 9)
    return path, cfg


def write_qwen3_checkpoint(out: Path, layers: int, tiny: bool = False) -> None:
    """Random bf16 Qwen3-8B-dims weights (std 0.02, norms 1), one safetensors file per layer; ``tiny``:
    the same structure at CPU smoke dims. Drawn on the GPU when there is one (3 GB in seconds)."""
    from safetensors.torch import save_file
    import torch as real_torch   # file writing only: the real torch whatever runtime the script selected

    if (out / "config.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    c = dict(QWEN3_8B, num_hidden_layers=layers, **(SMOKE_GQA if tiny else {}))
    h, hq, hk, d, inter, v = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                             c["intermediate_size"], c["vocab_size"])
    dev = "cuda" if real_torch.cuda.is_available() else "cpu"
    gen = real_torch.Generator(device=dev).manual_seed(0)

    def w(*shape):
        return (real_torch.randn(*shape, generator=gen, device=dev) * 0.02).to(real_torch.bfloat16).cpu()

    def ones(n):
        return real_torch.ones(n, dtype=real_torch.bfloat16)

    save_file({"model.embed_tokens.weight": w(v, h), "model.norm.weight": ones(h), "lm_head.weight": w(v, h)},
              str(out / "embed.safetensors"))
    for i in range(layers):
        p = f"model.layers.{i}."
        save_file({p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                   p + "self_attn.q_proj.weight": w(hq * d, h), p + "self_attn.k_proj.weight": w(hk * d, h),
                   p + "self_attn.v_proj.weight": w(hk * d, h), p + "self_attn.o_proj.weight": w(h, hq * d),
                   p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d),
                   p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
                   p + "mlp.down_proj.weight": w(h, inter)}, str(out / f"layer{i}.safetensors"))
    (out / "config.json").write_text(json.dumps(c))
