"""Benchmark: the ``append_attention`` decode with head-wise SWA, one process, on the GPU.

ERNIE-4.5-21B-A3B's attention (20 query / 4 KV heads of 128, bf16, blocks of 64), ``--b`` rows of
``--s`` tokens, ratio 0.5 (the last 2 KV heads SWA, window ``--window``, sink ``--sink``), one layer's
decode step (``decode_only``: RoPE + cache write of the step's token, split-KV attention, merge):
  full          no SWA heads (the bytes every head reads whole)
  uniform_mask  uniform tables, SWA heads read the whole row and mask it (the seed's baseline)
  headwise      head-wise tables, SWA heads read only sink + window
each with the op's two decode split plans: by length (the default: one split size for the launch from
each (row, KV head)'s visible keys) and equal (PADDLE_MLA_GQA_SPLITS=equal: every (row, head) in the
same number of equal splits). uniform_mask reads every key it masks, as the seed's kernel does. Per case: median
µs (do_bench), the K/V bytes the mode must read, those bytes / time against the measured copy rate,
and headwise's time saved against uniform_mask beside the fraction of bytes it skips.

  python -m benchmarks.kernels.head_wise_swa_decode [--b 3,5,8] [--s 32768]
"""

from __future__ import annotations

import argparse
import os

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402

from benchmarks.harness.timing import copy_bandwidth, median_us  # noqa: E402
from paddle_mla.ops import append_attention as op  # noqa: E402

HQ, HKV, D, BS, NSWA = 20, 4, 128, 64, 2


def inputs(b: int, s: int, window: int, sink: int) -> dict:
    """One decode token per row at position s - 1; uniform and head-wise tables over the same blocks
    (SWA heads' blocks wholly outside sink and window are -1, as the head-wise pool leaves them)."""
    dev, m = "cuda", -(-s // BS)
    g = torch.Generator(device="cpu").manual_seed(0)
    kc = (torch.randn(HKV, b * m, BS, D, generator=g) * 0.5).to(dev, torch.bfloat16)
    uniform = torch.arange(b * m, dtype=torch.int32).reshape(b, m)
    head_wise = uniform[:, None, :].repeat(1, HKV, 1)
    p = s - 1
    for blk in range(m):
        lo, hi = blk * BS, (blk + 1) * BS - 1
        if lo >= sink and hi <= p - window:
            head_wise[:, HKV - NSWA:, blk] = -1
    return dict(q=torch.randn(b, HQ, D, generator=g).to(dev, torch.bfloat16),
                k=torch.randn(b, HKV, D, generator=g).to(dev, torch.bfloat16),
                v=torch.randn(b, HKV, D, generator=g).to(dev, torch.bfloat16), kc=kc, vc=kc.clone(),
                uniform=uniform.to(dev), head_wise=head_wise.to(dev),
                cu=torch.arange(b + 1, dtype=torch.int32, device=dev),
                lens=torch.full((b,), s, dtype=torch.int32, device=dev),
                ids=torch.arange(b, dtype=torch.int32, device=dev),
                pos=torch.full((b,), p, dtype=torch.int64, device=dev),
                cs=torch.randn(s, D, generator=g).to(dev), out=torch.empty(b, HQ, D, device=dev, dtype=torch.bfloat16),
                ws=torch.empty(op.workspace_numel(256, HQ, D), dtype=torch.float32, device=dev))


def call(x: dict, mode: str, window: int, sink: int):
    swa = {} if mode == "full" else dict(num_swa_heads=NSWA, window=window, sink=sink, swa_mask=mode == "uniform_mask")
    tables = x["head_wise"] if mode == "headwise" else x["uniform"]
    return lambda: op.append_attention(x["q"], x["k"], x["v"], x["kc"], x["vc"], tables, x["cu"], x["lens"], x["ids"],
                                       x["pos"], x["cs"], x["out"], softmax_scale=D ** -0.5, neox=False, rot_dim=D,
                                       workspace=x["ws"], decode_only=True, **swa)


def kv_bytes(mode: str, b: int, s: int, window: int, sink: int) -> int:
    swa_keys = min(s, window + sink)
    keys = HKV * s if mode != "headwise" else (HKV - NSWA) * s + NSWA * swa_keys
    return b * keys * D * 2 * 2     # K and V, bf16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", default="3,5,8")
    ap.add_argument("--s", type=int, default=32768)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--plans", default="by length,equal", help="which split plans to time (comma-separated)")
    args = ap.parse_args()
    rate = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy rate {rate / 1e12:.2f} TB/s; ERNIE-4.5-21B-A3B attention "
          f"(20 q / 4 KV heads of 128), bf16, s {args.s}, W {args.window}, S {args.sink}, 2 of 4 KV heads SWA")
    print("| b | splits | mode | µs | KV MB | % of copy rate | headwise saves (vs uniform_mask) | bytes skipped |")
    print("|---|---|---|---|---|---|---|---|")
    for b in (int(v) for v in args.b.split(",")):
        x = inputs(b, args.s, args.window, args.sink)
        for plan in args.plans.split(","):
            if plan == "equal":
                os.environ["PADDLE_MLA_GQA_SPLITS"] = "equal"
            else:
                os.environ.pop("PADDLE_MLA_GQA_SPLITS", None)
            t = {m: median_us(call(x, m, args.window, args.sink)) for m in ("full", "uniform_mask", "headwise")}
            for m, us in t.items():
                nbytes = kv_bytes(m, b, args.s, args.window, args.sink)
                saved = ""
                if m == "headwise":
                    skipped = 1 - nbytes / kv_bytes("uniform_mask", b, args.s, args.window, args.sink)
                    saved = f"{1 - us / t['uniform_mask']:+.1%} | {skipped:.1%}"
                print(f"| {b} | {plan} | {m} | {us:.1f} | {nbytes / 1e6:.0f} | {nbytes / (us * 1e-6) / rate:.0%} | "
                      f"{saved or '- | -'} |")
        os.environ.pop("PADDLE_MLA_GQA_SPLITS", None)


if __name__ == "__main__":
    main()
