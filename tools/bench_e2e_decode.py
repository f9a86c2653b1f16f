"""End-to-end decode step time on a model with DeepSeek-V3 or Qwen3-8B dimensions (GPU).

``--model deepseek_v3`` (default): a few layers, random bf16 weights, dense MLP (hidden 7168, 128
heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, MLP 18432, vocab 129280), the triton_mla
backend, a paged latent cache. ``--model qwen3``: Qwen3-8B dims (``bench_swa.QWEN3_8B``: hidden 4096,
32 query / 8 KV heads of 128, q/k norms, MLP 12288, vocab 151936, untied), random bf16 weights
(``bench_swa.write_checkpoint``, written once to /tmp/paddle_mla_qwen3_8b_<layers>l), the
append_attn backend (the GQA custom op), head-major paged K/V caches (issue 12's end-to-end target).
Caches are filled with random values, every request at ``--context`` tokens. Times the whole runner
step (metadata build, model, logits, greedy sampling incl. its one host read) with and without CUDA
graphs, and compares with the roofline: (weight bytes + KV bytes) / measured copy bandwidth.

    python tools/bench_e2e_decode.py --layers 4 --batch 1,16,64 --context 4096
    python tools/bench_e2e_decode.py --model qwen3 --layers 4 --batch 64 --context 4096
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from paddle_mla.attention.forward_meta import StepBatch  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.worker import sampler  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402
from paddle_mla.models import parse_arch  # noqa: E402
from paddle_mla.models.deepseek import CausalLM  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402

BACKENDS = {"deepseek_v3": "triton_mla", "qwen3": "append_attn"}

V3 = dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
          moe_intermediate_size=2048, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
          kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, rms_norm_eps=1e-6,
          max_position_embeddings=163840, rope_theta=10000.0, n_routed_experts=None, first_k_dense_replace=1000,
          rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
          bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)


def random_weights(cfg: dict, layers: int, device: str, dtype) -> dict:
    h, H, V = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    ql, kl, r, n, v, inter = (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"],
                              cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["intermediate_size"])
    torch.manual_seed(0)

    def w(*shape, std=0.02):
        return torch.empty(*shape, dtype=dtype, device=device).normal_(0.0, std)

    def ones(n_):
        return torch.ones(n_, dtype=dtype, device=device)

    out = {"model.embed_tokens.weight": w(V, h), "model.norm.weight": ones(h), "lm_head.weight": w(V, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_a_proj.weight": w(ql, h), p + "self_attn.q_a_layernorm.weight": ones(ql),
            p + "self_attn.q_b_proj.weight": w(H * (n + r), ql),
            p + "self_attn.kv_a_proj_with_mqa.weight": w(kl + r, h), p + "self_attn.kv_a_layernorm.weight": ones(kl),
            p + "self_attn.kv_b_proj.weight": w(H * (n + v), kl), p + "self_attn.o_proj.weight": w(h, H * v),
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
        })
    return out


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    runtime.synchronize()
    return 2 * x.numel() * 20 / (time.perf_counter() - t)


def time_steps(runner: ModelRunner, batch: StepBatch, iters: int) -> float:
    zeros = np.zeros(len(batch.num_new))

    def step():
        logits = runner.forward_step(batch)
        return sampler.sample(logits, zeros, zeros.astype(np.int64), zeros + 1, zeros.astype(np.int64),
                              zeros.astype(np.int64)).tolist()

    for _ in range(3):
        step()
    runtime.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", choices=sorted(BACKENDS), default="deepseek_v3")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    device = runtime.device_string("gpu")
    dtype = torch.bfloat16
    model, arch = build_model(args.model, args.layers, device, dtype)
    n_params = sum(p.numel() for p in _model_tensors(model))
    weight_bytes = n_params * 2
    bw = copy_bandwidth(device)
    bs_page = 64
    rows = []
    for graphs in (False, True):
        max_bs = max(batches)
        ecfg = config_from_dict({"device": "gpu", "dtype": "bfloat16", "attention": {"backend": BACKENDS[args.model]},
                                 "cuda_graph": graphs, "cache": {"block_size": bs_page,
                                                                 "num_blocks": max_bs * (args.context // bs_page + 1) + 1},
                                 "scheduler": {"max_num_seqs": max_bs, "enable_chunked_prefill": True},
                                 "max_model_len": args.context + 64})
        runner = ModelRunner(ecfg, model=model)
        for cache in runner.kv_caches:   # a latent cache per layer, or a (K, V) pair (GQA)
            for part in (cache if isinstance(cache, (tuple, list)) else (cache,)):
                part.normal_(0.0, 1.0)
        for b in batches:
            per_seq = -(-args.context // bs_page)
            perm = np.random.default_rng(b).permutation(runner.limits.num_blocks)[: b * per_seq]
            batch = StepBatch(token_ids=np.arange(b, dtype=np.int64) + 5, num_new=np.ones(b, np.int32),
                              num_cached=np.full(b, args.context - 1, np.int32),
                              block_tables=perm.reshape(b, per_seq).astype(np.int32),
                              is_prefill=np.zeros(b, bool), sample_mask=np.ones(b, bool))
            t = time_steps(runner, batch, args.iters)
            kv_bytes = b * args.context * kv_elems_per_token(arch) * 2 * args.layers
            floor = (weight_bytes + kv_bytes) / bw
            rows.append(dict(batch=b, cuda_graph=graphs, step_ms=t * 1e3, roofline_ms=floor * 1e3,
                             fraction_of_roofline=floor / t, weight_gb=weight_bytes / 1e9, kv_gb=kv_bytes / 1e9))
        del runner
    print(f"model {args.model} ({BACKENDS[args.model]}), copy bandwidth {bw / 1e12:.2f} TB/s, params "
          f"{n_params / 1e9:.2f} B, layers {args.layers}, context {args.context}")
    print("| batch | CUDA graph | step ms | roofline ms | roofline / step |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['cuda_graph']} | {r['step_ms']:.2f} | {r['roofline_ms']:.2f} | "
              f"{r['fraction_of_roofline']:.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "copy_bw": bw, "rows": rows}, f, indent=1)


def build_model(name: str, layers: int, device: str, dtype):
    """(model, arch) with random bf16 weights: DeepSeek-V3 dims (MLA) or Qwen3-8B dims (GQA)."""
    if name == "qwen3":   # bench_swa's random Qwen3-8B-dims checkpoint (written once), through the loader
        from pathlib import Path

        from bench_swa import write_checkpoint
        from paddle_mla.models.loader import load_model

        path = Path(f"/tmp/paddle_mla_qwen3_8b_{layers}l")
        write_checkpoint(path, layers)
        model = load_model(str(path), dtype, device)
        return model, model.arch
    cfg = dict(V3, num_hidden_layers=layers)
    arch = parse_arch(cfg)
    return CausalLM(arch, random_weights(cfg, layers, device, dtype), device, dtype), arch


def kv_elems_per_token(arch) -> int:
    """Cache elements one token adds per layer: the MLA latent (+ rope), or K and V of every KV head."""
    if arch.family == "gqa":
        return 2 * arch.gqa.num_kv_heads * arch.gqa.head_dim
    return arch.mla.latent_dim


def _model_tensors(model: CausalLM):
    seen = {id(model.embed): model.embed, id(model.norm): model.norm, id(model.lm_head): model.lm_head}
    for layer in model.layers:
        for obj in (layer, layer.attn, layer.mlp):
            for v in vars(obj).values():
                if hasattr(v, "numel") and hasattr(v, "element_size"):
                    seen.setdefault(id(v), v)
    return list(seen.values())


if __name__ == "__main__":
    main()
