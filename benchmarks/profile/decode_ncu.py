"""Decode calls for Nsight Compute: where do the missed targets go? One process, one case, one or
more configs: every config is launched once to compile, then once more for ncu (skip the first N).

    ncu --kernel-name regex:_decode_stage1 --launch-skip N --launch-count N \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section LaunchStats python3 -m benchmarks.profile.decode_ncu --b 128 --h 16 --s 4096 \\
        [--cfg "dv_split=2;num_warps=8"]

``--cfg``: ';'-separated ``decode_config`` overrides (as benchmarks.kernels.mla_decode's --variants); today's config
comes first, so N = 1 + the number of overrides, and ncu reports the configs in the printed order.
"""

from __future__ import annotations

import argparse

from paddle_mla.platform import runtime

runtime.select("torch")  # as the decode kernel benchmark

from benchmarks.harness.mla_cases import LORA, make_decode_case, parse_variants  # noqa: E402
from paddle_mla.attention.triton_mla import decode  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--cfg", default="", help="';'-separated decode_config overrides, e.g. dv_split=2;num_warps=8")
    a = ap.parse_args()
    cache, tables, q, lens = make_decode_case(a.b, a.h, a.s)
    runs = []
    for i, over in enumerate(parse_variants(a.cfg)):
        cfg = decode.decode_config(a.h, **over)
        print(f"config {i}: {over or 'today'} -> {cfg}", flush=True)
        ws = decode.alloc_decode_workspace(a.b, a.h, LORA, decode.split_cap(cfg.programs), "cuda",
                                           programs=cfg.programs)
        out = torch.empty(a.b, a.h, LORA, dtype=torch.bfloat16, device="cuda")
        decode.build_decode_plan(lens, a.b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
        runs.append(lambda cfg=cfg, ws=ws, out=out: decode.mla_decode(q, cache, tables, lens, out, ws, LORA,
                                                                        192 ** -0.5, cfg))
    for fn in runs:   # compiles (ncu skips these launches)
        fn()
    torch.cuda.synchronize()
    for fn in runs:   # the profiled launches, in the printed order
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
