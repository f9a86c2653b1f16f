"""Benchmark: the FP8 latent cache (``cache.dtype: fp8_e4m3``) against the bf16 cache, MLA decode at
DeepSeek-V3 dims (512 + 64, 64-token pages in random order), same process, same latent rows.

Per (h, b, s), one layer's decode as the engine replays it (a CUDA graph of the decode; the step's
plan outside it):
- Triton decode over the bf16 cache and over the FP8 cache, and the ``mla_decode`` CUDA op (the
  engine's decode on SM90) over each;
- each one's bytes (the cache rows it reads + q + out) over the measured copy rate: % of copy;
- error: each output against the fp32 reference over the unrounded rows (relative L2 over the
  first 8 rows): the bf16 cache's is the kernel's own rounding, the FP8 cache's adds the keys';
- the write of the step's latent rows: ``b`` rows (a decode step) and 8192 (a prefill chunk),
  a bf16 copy against the FP8 quantization.
Latent rows: an RMS-normed latent (normal x a per-channel gain, log-normal as trained norm weights
spread) and a normal rope part.

    python -m benchmarks.kernels.fp8_latent_cache [--h 16,128] [--b 1,64,128] [--s 4096,16384] [--json F]
Writes JSON to $OUT/bench_fp8_latent_cache.json when OUT is set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs and events: the benchmark runs on PyTorch

import torch  # noqa: E402

from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.mla_cases import D, LORA, PAGE, SCALE, run_cuda  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, graph_median_us  # noqa: E402
from paddle_mla.attention.triton_mla import cache_write, decode, reference  # noqa: E402
from paddle_mla.cache import fp8_latent  # noqa: E402

ERR_ROWS = 8


def latent_rows(n: int, g) -> torch.Tensor:
    gain = torch.exp(0.5 * torch.randn(LORA, device="cuda", generator=g))
    lat = torch.randn(n, LORA, device="cuda", generator=g) * gain
    rope = torch.randn(n, D - LORA, device="cuda", generator=g)
    return torch.cat([lat, rope], 1).to(torch.bfloat16)


def make_case(b: int, h: int, s: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = s // PAGE
    nb = b * pages
    rows = latent_rows(nb * PAGE, g)
    fp8 = torch.zeros(nb, PAGE, 1, fp8_latent.row_width(D), dtype=fp8_latent.storage_dtype(), device="cuda")
    cache_write.write_latent_cache(rows, fp8, torch.arange(nb * PAGE, device="cuda"))
    tables = torch.randperm(nb, device="cuda", generator=g).to(torch.int32).view(b, pages)
    q = torch.randn(b, h, D, device="cuda", generator=g).to(torch.bfloat16)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    return rows.view(nb, PAGE, 1, D), fp8, tables, q, lens


def mma_kind(handle) -> str:
    """Which tensor-core instructions stage 1 compiled to (from its PTX): wgmma (SM90 warpgroup MMA,
    operands in shared memory) or mma.sync (warp MMA, operands in registers)."""
    ptx = getattr(handle, "asm", {}).get("ptx", "") if handle is not None else ""
    return f"wgmma {ptx.count('wgmma.mma_async')} / mma.sync {ptx.count('mma.sync')}"


def triton_decode(cache, tables, q, lens, h: int):
    """(graph µs, out, stage 1's MMA kind) of the backend's Triton decode config over ``cache``."""
    b = q.shape[0]
    cfg = decode.decode_config(h, small_batch=b <= decode.SMALL_BATCH)
    ws = decode.alloc_decode_workspace(b, h, LORA, decode.split_cap(cfg.programs), "cuda", programs=cfg.programs)
    decode.build_decode_plan(lens, b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    out = torch.empty(b, h, LORA, dtype=torch.bfloat16, device="cuda")
    call = lambda: decode.mla_decode(q, cache, tables, lens, out, ws, LORA, SCALE, cfg)  # noqa: E731
    handle = call()
    return graph_median_us(call), out, mma_kind(handle)


def write_us(n: int, fp8: bool) -> float:
    g = torch.Generator(device="cuda").manual_seed(n)
    rows = latent_rows(n, g)
    nb = -(-n // PAGE) + 1
    width = fp8_latent.row_width(D) if fp8 else D
    cache = torch.zeros(nb, PAGE, 1, width, device="cuda",
                        dtype=fp8_latent.storage_dtype() if fp8 else torch.bfloat16)
    slots = torch.arange(n, device="cuda")
    return graph_median_us(lambda: cache_write.write_latent_cache(rows, cache, slots))


def run_case(b: int, h: int, s: int, bw: float) -> dict:
    plain, fp8, tables, q, lens = make_case(b, h, s)
    # the reference gathers the error rows' pages alone (in fp32): no fp32 copy of the whole cache
    exact = reference.mla_decode_ref(q[:ERR_ROWS].float(), plain, tables[:ERR_ROWS], lens[:ERR_ROWS], LORA, SCALE)
    io = q.numel() * 2 + b * h * LORA * 2
    row = {"b": b, "h": h, "s": s}
    for name, cache, width in (("bf16", plain, D * 2), ("fp8", fp8, fp8_latent.row_width(D))):
        t, out, row[f"triton_{name}_mma"] = triton_decode(cache, tables, q, lens, h)
        nbytes = b * s * width + io
        row[f"triton_{name}_us"] = t
        row[f"triton_{name}_copy"] = nbytes / (t * 1e-6) / bw
        row[f"triton_{name}_err"] = rel_err(out[:ERR_ROWS].float(), exact)
        row[f"{name}_bytes"] = nbytes
    for name, cache in (("bf16", plain), ("fp8", fp8)):
        got = run_cuda((cache, tables, q, lens), h)
        if got is not None:   # the decode alone in a graph: a layer's share of a step
            *_, t, out = got
            row[f"cuda_{name}_us"] = t
            row[f"cuda_{name}_copy"] = row[f"{name}_bytes"] / (t * 1e-6) / bw
            row[f"cuda_{name}_err"] = rel_err(out[:ERR_ROWS].float(), exact)
    return row


COLUMNS = ("h", "b", "s", "Triton bf16 µs", "Triton FP8 µs", "CUDA op bf16 µs", "CUDA op FP8 µs",
           "op FP8 / op bf16", "op FP8 / Triton FP8", "% copy: Triton bf16 / FP8, op bf16 / FP8",
           "rel err: Triton bf16 / FP8, op bf16 / FP8", "Triton stage 1 MMA: bf16 / FP8")


def table_row(r: dict) -> str:
    get = lambda key, fmt: fmt.format(r[key]) if key in r else "-"  # noqa: E731
    ratio = lambda a, b: f"{r[a] / r[b]:.2f}x" if a in r and b in r else "-"  # noqa: E731
    names = ("triton_bf16", "triton_fp8", "cuda_bf16", "cuda_fp8")
    cells = [str(r["h"]), str(r["b"]), str(r["s"])] + [get(f"{n}_us", "{:.1f}") for n in names]
    cells += [ratio("cuda_fp8_us", "cuda_bf16_us"), ratio("cuda_fp8_us", "triton_fp8_us"),
              " / ".join(get(f"{n}_copy", "{:.0%}") for n in names),
              " / ".join(get(f"{n}_err", "{:.1e}") for n in names),
              f"{r.get('triton_bf16_mma', '-')} / {r.get('triton_fp8_mma', '-')}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h", default="16,128")
    ap.add_argument("--b", default="1,64,128")
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--write-rows", default="64,8192", help="rows a cache write takes (decode step, prefill chunk)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    bw = copy_bandwidth("cuda")
    name = torch.cuda.get_device_name()
    print(f"{name}, copy {bw / 1e12:.2f} TB/s, {datetime.date.today()}")
    rows = []
    print("| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS))
    for h in ints(args.h):
        for b in ints(args.b):
            for s in ints(args.s):
                r = run_case(b, h, s, bw)
                rows.append(r)
                print(table_row(r), flush=True)
    writes = [{"rows": n, "bf16_us": write_us(n, False), "fp8_us": write_us(n, True)} for n in ints(args.write_rows)]
    print("\n| rows written | bf16 copy µs | FP8 quantize µs |\n| --- | --- | --- |")
    for w in writes:
        print(f"| {w['rows']} | {w['bf16_us']:.1f} | {w['fp8_us']:.1f} |")
    out = args.json or (os.path.join(os.environ["OUT"], "bench_fp8_latent_cache.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"gpu": name, "copy_bw": bw, "rows": rows, "writes": writes}, f, indent=1)


if __name__ == "__main__":
    main()
