"""End-to-end decode step time on a model with DeepSeek-V3 or Qwen3-8B dimensions (GPU).

``--model deepseek_v3`` (default): a few layers, random bf16 weights, dense MLP (hidden 7168, 128
heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, MLP 18432, vocab 129280), the triton_mla
backend, a paged latent cache. ``--model qwen3``: Qwen3-8B dims (``dims.QWEN3_8B``: hidden 4096,
32 query / 8 KV heads of 128, q/k norms, MLP 12288, vocab 151936, untied), random bf16 weights
(``checkpoints.write_qwen3_checkpoint``, written once to /tmp/paddle_mla_qwen3_8b_<layers>l), the
append_attn backend (the GQA custom op), head-major paged K/V caches.
Caches are filled with random values, every request at ``--context`` tokens. Times the whole runner
step (metadata build, model, logits, greedy sampling incl. its one host read) with and without CUDA
graphs, and compares with the roofline: (weight bytes + KV bytes) / measured copy bandwidth.

    python -m benchmarks.e2e.decode --layers 4 --batch 1,16,64 --context 4096
    python -m benchmarks.e2e.decode --model qwen3 --layers 4 --batch 64 --context 4096
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from paddle_mla.platform import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from benchmarks.harness.batches import decode_batch  # noqa: E402
from benchmarks.harness.checkpoints import write_qwen3_checkpoint  # noqa: E402
from benchmarks.harness.models import dense_v3_model, model_tensors, time_steps  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from paddle_mla.config.schema import config_from_dict  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402
from paddle_mla.worker.model_runner import ModelRunner  # noqa: E402

BACKENDS = {"deepseek_v3": "triton_mla", "qwen3": "append_attn"}


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
    n_params = sum(p.numel() for p in model_tensors(model))
    weight_bytes = n_params * 2
    bw = copy_bandwidth(device)
    bs_page = 64
    rows = []
    for graphs in (False, True):
        max_bs = max(batches)
        ecfg = config_from_dict({"device": "gpu", "dtype": "bfloat16", "attention": {"backend": BACKENDS[args.model]},
                                 "cuda_graph": graphs,
                                 "cache": {"block_size": bs_page,
                                           "num_blocks": max_bs * (args.context // bs_page + 1) + 1},
                                 "scheduler": {"max_num_seqs": max_bs, "enable_chunked_prefill": True},
                                 "max_model_len": args.context + 64})
        runner = ModelRunner(ecfg, model=model)
        for cache in runner.kv_caches:   # a latent cache per layer, or a (K, V) pair (GQA)
            for part in (cache if isinstance(cache, (tuple, list)) else (cache,)):
                part.normal_(0.0, 1.0)
        for b in batches:
            batch = decode_batch(runner.limits.num_blocks, b, args.context, seed=b)
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
    if name == "qwen3":   # a random Qwen3-8B-dims checkpoint (written once), through the loader
        from paddle_mla.models.loader import load_model

        path = Path(f"/tmp/paddle_mla_qwen3_8b_{layers}l")
        write_qwen3_checkpoint(path, layers)
        model = load_model(str(path), dtype, device)
        return model, model.arch
    return dense_v3_model(layers, device, dtype)


def kv_elems_per_token(arch) -> int:
    """Cache elements one token adds per layer: the MLA latent (+ rope), or K and V of every KV head."""
    if arch.family == "gqa":
        return 2 * arch.gqa.num_kv_heads * arch.gqa.head_dim
    return arch.mla.latent_dim


if __name__ == "__main__":
    main()
