"""Benchmark: streaming checkpoint load vs the time to read the files, and peak host memory.

Writes (once; reused when present) a sharded random bf16 checkpoint with DeepSeek-V2-Lite
dimensions: hidden 2048, 16 heads, kv_lora 512, 64 routed experts (top-6) of 1408, 2 shared,
vocab 102400, first layer dense (10944). ``--layers 27`` is the full depth: 15.7 B parameters,
31.4 GB. Then, in this order, with the files in the same cache state:
  1. ``cat`` of every shard to /dev/null, and a raw Python read (pread, 64 MB chunks), timed;
  2. ``load_model`` onto the device in a fresh subprocess: wall time (synchronized), peak host
     RSS (VmHWM) above the RSS after imports, GB/s.
Targets (issue 10): load <= 1.5x the read time; peak RSS <= 2 GB above baseline at 31 GB.

  PYTHONPATH=. python tools/bench_loader.py [--layers 27] [--dir /tmp/bench_v2lite] [--shard-gb 5]
      [--threads 4] [--device gpu] [--json out.json] [--drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

V2_LITE = dict(
    model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], vocab_size=102400, hidden_size=2048,
    intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=16, num_key_value_heads=16,
    kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1,
    n_group=1, topk_group=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
    routed_scaling_factor=1.0, max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    bos_token_id=100000, eos_token_id=100001, tie_word_embeddings=False, torch_dtype="bfloat16",
    attention_bias=False, hidden_act="silu")


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


def time_cat(files) -> float:
    t = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def time_raw_read(files) -> float:
    buf = memoryview(np.empty(64 << 20, dtype=np.uint8))
    t = time.perf_counter()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while (got := os.preadv(fd, [buf], off)) > 0:
                off += got
        finally:
            os.close(fd)
    return time.perf_counter() - t


_LOAD = r"""
import json, sys, time
from paddle_mla.platform import runtime
runtime.select()
from paddle_mla.platform.tensor_api import torch
from paddle_mla.models.loader import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
device = runtime.device_string(sys.argv[2])
torch.zeros(1, device=device)                                   # context creation outside the timing
try:
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
base = max(status("VmRSS"), status("VmHWM"))
t = time.perf_counter()
model = load_model(sys.argv[1], torch.bfloat16, device, threads=int(sys.argv[3]) or None)
runtime.synchronize()
dt = time.perf_counter() - t
print(json.dumps({"load_s": dt, "base_rss": base, "peak_rss": status("VmHWM"), "rss_after": status("VmRSS")}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=27, help="27 = full V2-Lite depth (31.4 GB); 4 for a quick run")
    ap.add_argument("--dir", default="", help="checkpoint folder (default /tmp/bench_v2lite_<layers>L)")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=0, help="loader threads (0: the loader's default)")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache first (needs root)")
    ap.add_argument("--vocab", type=int, default=V2_LITE["vocab_size"], help="smaller for a smoke run")
    ap.add_argument("--experts", type=int, default=V2_LITE["n_routed_experts"], help="smaller for a smoke run")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cfg = dict(V2_LITE, num_hidden_layers=args.layers, vocab_size=args.vocab, n_routed_experts=args.experts)
    suffix = "" if (args.vocab, args.experts) == (V2_LITE["vocab_size"], V2_LITE["n_routed_experts"]) else \
        f"_v{args.vocab}_e{args.experts}"
    path = Path(args.dir or f"/tmp/bench_v2lite_{args.layers}L{suffix}")
    if not (path / "model.safetensors.index.json").exists():
        print(f"writing a {args.layers}-layer V2-Lite-dimension bf16 checkpoint to {path}", file=sys.stderr)
        t = time.perf_counter()
        write_checkpoint(path, cfg, int(args.shard_gb * 1e9))
        print(f"  written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    files = sorted(path.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    params = sum(int(np.prod(s)) for _, s in tensor_specs(cfg))
    if args.drop_caches:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
    t_cat = time_cat(files)
    t_raw = time_raw_read(files)
    t_read = min(t_cat, t_raw)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _LOAD, str(path), args.device, str(args.threads)],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"load failed:\n{res.stderr[-3000:]}")
    r = json.loads(res.stdout.strip().splitlines()[-1])
    above = (r["peak_rss"] - r["base_rss"]) / 2 ** 30
    print(f"# Loader: {args.layers}-layer DeepSeek-V2-Lite dims, {params / 1e9:.2f} B params, {total / 1e9:.2f} GB "
          f"in {len(files)} shards, bf16 -> {args.device}\n")
    print("| read (cat) s | read (pread) s | load s | load / read | load GB/s | peak RSS above baseline |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {t_cat:.2f} | {t_raw:.2f} | {r['load_s']:.2f} | {r['load_s'] / t_read:.2f}x | "
          f"{total / r['load_s'] / 1e9:.2f} | {above:.2f} GiB |")
    print("\ntargets: load <= 1.5x read; peak RSS <= 2 GB above baseline "
          "(files were read just before loading: both times are warm page cache unless --drop-caches)")
    out = args.json or (os.path.join(os.environ["OUT"], "bench_loader.json") if os.environ.get("OUT") else "")
    if out:
        with open(out, "w") as f:
            json.dump({"layers": args.layers, "params": params, "bytes": total, "shards": len(files),
                       "cat_s": t_cat, "pread_s": t_raw, **r, "peak_rss_above_GiB": above}, f, indent=1)


if __name__ == "__main__":
    main()
