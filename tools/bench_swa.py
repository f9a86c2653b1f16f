"""Benchmark: head-wise sliding-window attention on the GPU (docs/head_wise_swa.md), whole engine.

A Qwen3-8B-dimension checkpoint cut to ``--layers`` layers, random bf16 weights written once (to
``--dir``, reused when present; tools/bench_loader.py does the same for DeepSeek), run through the
LLM in three modes at one fixed KV budget (``--num-blocks`` blocks per KV head range):
  uniform          ratio 0: every head full, uniform tables (the op has no "walk the whole row and
                   mask" mode: it skips keys outside a window whatever the table shape, so the
                   seed's uniform-tables-with-window baseline is not measurable; this is full attention)
  headwise         ratio 0.5, window W, sink S, recycling off
  headwise_recycle ratio 0.5, recycling on
Per mode: TTFT (one request of ``--context`` tokens, 1 output token), TBT (the same request, mean
time per output token after the first), decode throughput (``--requests`` requests of ``--context``
tokens, ``--output`` tokens each: output tokens / s), KV memory per request (one request alone:
peak blocks held summed over KV heads x bytes per head-block) and peak concurrent requests (most
rows scheduled in one step).

  PYTHONPATH=. python tools/bench_swa.py [--layers 4] [--context 32768] [--json out.json]
Targets (issue 13): headwise vs uniform TTFT and TBT >= 5% better; headwise_recycle decode
throughput >= 1.4x uniform at the same KV budget.
NOTE: every KV head gets the same range (the caches are [Hkv, num_blocks, ...]), so with ratio 0.5
the full heads still bound concurrency; recycling frees SWA memory but does not admit more requests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from paddle_mla import runtime

runtime.select(os.environ.get("PADDLE_MLA_RUNTIME", "torch"))

from paddle_mla.config import config_from_dict  # noqa: E402
from paddle_mla.engine.llm import LLM  # noqa: E402
from paddle_mla.engine.request import GenerationRequest, SamplingParams  # noqa: E402
from paddle_mla.tensor_api import torch  # noqa: E402

QWEN3_8B = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
                tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16")
MODES = {
    "uniform": {"head_wise_swa_ratio": 0.0},
    "headwise": {"head_wise_swa_ratio": 0.5, "recycle": False},
    "headwise_recycle": {"head_wise_swa_ratio": 0.5, "recycle": True},
}


def write_checkpoint(out: Path, layers: int, tiny: bool = False) -> None:
    """Random bf16 Qwen3 weights (std 0.02, norms 1), one safetensors file per layer."""
    from safetensors.torch import save_file
    import torch as real_torch

    if (out / "config.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    c = dict(QWEN3_8B, num_hidden_layers=layers)
    if tiny:     # CPU smoke test of this script: same structure, small dims
        c.update(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)
    h, hq, hk, d, inter, v = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                             c["intermediate_size"], c["vocab_size"])
    gen = real_torch.Generator().manual_seed(0)

    def w(*shape):
        return (real_torch.randn(*shape, generator=gen) * 0.02).to(real_torch.bfloat16)

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


def engine(path: Path, mode: str, args) -> LLM:
    m = MODES[mode]
    attention = {"backend": "append_attn", "head_wise_swa_ratio": m["head_wise_swa_ratio"]}
    if m["head_wise_swa_ratio"]:
        attention.update(sliding_window=args.window, sink_tokens=args.sink)
    return LLM(config_from_dict({
        "model": str(path), "device": args.device, "dtype": "bfloat16" if args.device == "gpu" else "float32",
        "attention": attention,
        "max_model_len": args.context + args.output + 64,
        "cache": {"block_size": 64, "num_blocks": args.num_blocks, "enable_prefix_caching": False,
                  "swa_recycle": bool(m.get("recycle", False))},
        "scheduler": {"max_num_seqs": args.requests, "max_num_batched_tokens": 8192,
                      "enable_chunked_prefill": True}}))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(llm: LLM, n: int, context: int, output: int, seed: int) -> tuple[float, int]:
    """Seconds for ``n`` requests of ``context`` random tokens and ``output`` tokens each; the most
    rows scheduled in one step."""
    rng = np.random.default_rng(seed)
    reqs = [GenerationRequest(id=i, prompt_token_ids=rng.integers(2, llm.runner.arch.vocab_size - 2, context).tolist(),
                              params=SamplingParams(max_tokens=output, ignore_eos=True)) for i in range(n)]
    peak = [0]
    schedule = llm.scheduler.schedule

    def counting():
        out = schedule()
        peak[0] = max(peak[0], len(out.scheduled))
        return out
    llm.scheduler.schedule = counting
    sync()
    t = time.perf_counter()
    outs = llm.generate(reqs, use_tqdm=False)
    sync()
    dt = time.perf_counter() - t
    llm.scheduler.schedule = schedule
    assert all(o.error is None for o in outs), [o.error for o in outs if o.error]
    return dt, peak[0]


def bench_mode(path: Path, mode: str, args) -> dict:
    llm = engine(path, mode, args)
    run(llm, 1, min(1024, args.context), 4, seed=99)       # warm-up (graphs, kernels)
    ttft, _ = run(llm, 1, args.context, 1, seed=1)
    pool = llm.pool
    head_wise = hasattr(pool, "peak_head_blocks")
    llm.reset_stats()            # restarts the uniform pool's peak
    if head_wise:
        pool.peak_head_blocks = 0
    full, _ = run(llm, 1, args.context, args.output, seed=1)
    tbt = (full - ttft) / (args.output - 1)
    arch = llm.runner.arch.gqa
    elt = torch.zeros(1, dtype=llm.runner.dtype).element_size()
    per_head_block = 2 * 64 * arch.head_dim * elt * llm.runner.arch.num_layers     # K + V, all layers
    held = pool.peak_head_blocks if head_wise else pool.peak_used * arch.num_kv_heads
    dt, peak = run(llm, args.requests, args.context, args.output, seed=2)
    return {"mode": mode, "ttft_ms": ttft * 1e3, "tbt_ms": tbt * 1e3,
            "decode_tok_s": args.requests * args.output / dt, "kv_mib_per_request": held * per_head_block / 2**20,
            "peak_concurrent": peak, "elapsed_s": dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=8192, help="blocks of 64 tokens per KV head range")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dir", default="/tmp/paddle_mla_bench_qwen3_swa")
    ap.add_argument("--json")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--tiny", action="store_true", help="small dims (a CPU smoke test of the script)")
    args = ap.parse_args()
    path = Path(args.dir) / (f"layers{args.layers}" + ("_tiny" if args.tiny else ""))
    write_checkpoint(path, args.layers, args.tiny)
    rows = []
    for mode in args.modes.split(","):
        rows.append(bench_mode(path, mode, args))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = rows[0]
    print(f"Qwen3-8B dims, {args.layers} layers, context {args.context}, W {args.window}, S {args.sink}, "
          f"{args.num_blocks} blocks/head, {args.requests} requests x {args.output} tokens")
    print("| mode | TTFT ms | TBT ms | decode tok/s | vs first | KV MiB/request | peak concurrent |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['ttft_ms']:.1f} | {r['tbt_ms']:.2f} | {r['decode_tok_s']:.0f} | "
              f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x | {r['kv_mib_per_request']:.1f} | {r['peak_concurrent']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
