"""Benchmark: streaming checkpoint load vs the time to read the files, and peak host memory.

Writes (once; reused when present) a sharded random bf16 checkpoint with DeepSeek-V2-Lite
dimensions: hidden 2048, 16 heads, kv_lora 512, 64 routed experts (top-6) of 1408, 2 shared,
vocab 102400, first layer dense (10944). ``--layers 27`` is the full depth: 15.7 B parameters,
31.4 GB. Then, in this order, with the files in the same cache state:
  1. ``cat`` of every shard to /dev/null, and a raw Python read (pread, 64 MB chunks), timed;
  2. ``load_model`` onto the device in a fresh subprocess: wall time (synchronized), peak host
     RSS (VmHWM) above the RSS after imports, GB/s.
Targets: load <= 1.5x the read time; peak RSS <= 2 GB above baseline at 31 GB.

  python -m benchmarks.e2e.loader [--layers 27] [--dir /tmp/bench_v2lite] [--shard-gb 5]
      [--threads 4] [--device gpu] [--json out.json] [--drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.checkpoints import tensor_specs, write_checkpoint  # noqa: E402
from benchmarks.harness.dims import V2_LITE  # noqa: E402


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
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]) + os.pathsep
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
