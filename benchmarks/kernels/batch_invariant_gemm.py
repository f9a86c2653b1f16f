"""The batch-invariant GEMM (``ops/batch_invariant_kernels``) against cuBLAS (``F.linear``), per
kernel and tile config, at a model's projection shapes and the row counts of ``--m`` (decode: 4-256
rows; prefill: 16384): pointer loads, TMA loads, the swapped kernel of few-row launches, and
``gemm_nt``'s own pick (the column the mode runs).

``deterministic: true`` needs each output element to be the same K-ordered sum whatever M is. This
program times each candidate at every shape (bf16, replays of a CUDA graph of one call, as the
engine's decode graphs run them, so host work such as building TMA descriptors is out; do_bench
medians, L2 flushed) as a ratio to cuBLAS, and checks bits: every candidate's rows against the first
candidate's at the largest M (the ``same bits`` row). Where all agree, the tile shape does not enter a
row's arithmetic, so a config may follow M without breaking the mode; where one differs, it may not.

    python -m benchmarks.kernels.batch_invariant_gemm [--dims qwen3|v2-lite] [--m 4,16,256,16384]
"""

from __future__ import annotations

import argparse

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.harness.timing import graph_median_us  # noqa: E402
from paddle_mla.ops.batch_invariant_kernels import (NARROW, WIDE, gemm_nt, gemm_nt_pointers, gemm_nt_tma,  # noqa: E402
                                                   gemm_swap_tma)

# (name, K, N) of each dense product of a layer (TP = 1) and the LM head
SHAPES = {
    "qwen3": [("q", 4096, 4096), ("k|v", 4096, 1024), ("o", 4096, 4096), ("gate|up", 4096, 12288),
              ("down", 12288, 4096), ("lm_head", 4096, 151936)],
    "v2-lite": [("q", 2048, 3072), ("kv_a", 2048, 576), ("kv_b", 512, 4096), ("o", 2048, 2048),
                ("shared gate|up", 2048, 2816), ("lm_head", 2048, 102400)],
}
# (kernel, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP, warps, stages))
FIRST = (64, 128, 64, 8, 4, 3)    # one fixed tile for every launch: the baseline tile_for is measured against
CANDIDATES = [("ptr", FIRST), ("ptr", NARROW), ("ptr", WIDE), ("tma", NARROW), ("tma", WIDE),
              ("tma", (64, 64, 64, 8, 4, 6)), ("tma", (128, 128, 128, 8, 4, 3)), ("tma", (64, 32, 128, 8, 4, 4)),
              ("tma", (64, 64, 128, 8, 4, 4)), ("tma", (64, 32, 64, 8, 4, 8)), ("tma", (64, 64, 64, 8, 4, 8)),
              ("swap", (16, 64, 128, 1, 4, 6)), ("swap", (16, 128, 128, 1, 4, 4)), ("swap", (16, 64, 128, 1, 4, 8)),
              ("swap", (32, 64, 128, 1, 4, 5)), ("swap", (64, 64, 128, 1, 4, 4)), ("swap", (64, 128, 64, 1, 4, 4)),
              ("tma", (128, 256, 64, 8, 8, 3)), ("tma", (128, 128, 64, 8, 8, 4)), ("tma", (256, 128, 64, 8, 8, 3))]
CANDIDATES.append(("auto", None))   # gemm_nt's own choice: what the mode runs
KERNELS = {"ptr": gemm_nt_pointers, "tma": gemm_nt_tma, "swap": gemm_swap_tma, "auto": lambda x, w, _: gemm_nt(x, w)}


def label(c) -> str:
    return "gemm_nt (the mode's pick)" if c[1] is None else c[0] + " " + "x".join(map(str, c[1]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", choices=sorted(SHAPES), default="qwen3")
    ap.add_argument("--m", default="4,16,256,16384")
    args = ap.parse_args(argv)
    ms = sorted(int(x) for x in args.m.split(","))
    print(f"### batch-invariant GEMM vs cuBLAS: {args.dims} shapes, bf16, {torch.cuda.get_device_name()}\n")
    print("| M | product (K x N) | cuBLAS µs | " + " | ".join(label(c) for c in CANDIDATES) + " |")
    print("| --- | --- | --- |" + " --- |" * len(CANDIDATES))
    g = torch.Generator(device="cuda").manual_seed(0)
    same = {c: True for c in CANDIDATES}
    rows = {}
    for name, K, N in SHAPES[args.dims]:
        x_all = torch.randn(ms[-1], K, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16)
        anchor = None
        for m in reversed(ms):
            if name == "lm_head" and m > 256:
                continue   # prefill computes logits for the last token of each request only
            x = x_all[:m]
            ref = F.linear(x, w)
            t_ref = graph_median_us(lambda: F.linear(x, w))
            cells = []
            for c in CANDIDATES:
                fn, tile = KERNELS[c[0]], c[1]
                got = fn(x, w, tile)
                err = float((got.float() - ref.float()).abs().max()) / max(float(ref.float().abs().max()), 1e-6)
                if err > 2e-2:
                    raise AssertionError(f"{label(c)} at {m}x{K}x{N}: relative error {err:.3g}")
                anchor = got if anchor is None else anchor
                same[c] &= bool(torch.equal(got, anchor[:m]))
                t = graph_median_us(lambda: fn(x, w, tile))
                rows.setdefault(m, {}).setdefault(c, 0.0)
                rows[m][c] += t
                cells.append(f"{t / t_ref:.2f}x")
            rows[m].setdefault("ref", 0.0)
            rows[m]["ref"] += t_ref
            print(f"| {m} | {name} ({K} x {N}) | {t_ref:.1f} | " + " | ".join(cells) + " |", flush=True)
    for m in ms:
        print(f"| {m} | a layer's products (sum) | {rows[m]['ref']:.1f} | "
              + " | ".join(f"{rows[m][c] / rows[m]['ref']:.2f}x" for c in CANDIDATES) + " |")
    print("| all | same bits as the first at the largest M | | "
          + " | ".join("yes" if same[c] else "no" for c in CANDIDATES) + " |")


if __name__ == "__main__":
    main()
