"""One decode call per case, for Nsight Compute: where do the missed targets go?

    ncu --kernel-name regex:_decode_stage1 --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats python3 tools/profile_decode_ncu.py --b 128 --h 16 --s 4096 [--cfg dv_split=2]

``--cfg`` forces a variant (the same ``decode_config`` overrides as bench_mla_decode's --variants).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_mla_decode import LORA, decode, make_case, parse_variants, torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--cfg", default="", help="decode_config overrides, e.g. dv_split=2,num_warps=8")
    a = ap.parse_args()
    cache, tables, q, lens = make_case(a.b, a.h, a.s)
    cfg = decode.decode_config(a.h, **parse_variants(a.cfg)[-1])
    print(cfg, flush=True)
    ws = decode.alloc_decode_workspace(a.b, a.h, LORA, 64, "cuda", programs=cfg.programs)
    out = torch.empty(a.b, a.h, LORA, dtype=torch.bfloat16, device="cuda")
    decode.build_decode_plan(lens, a.b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
    for _ in range(2):   # the first launch compiles; ncu skips it
        decode.mla_decode(q, cache, tables, lens, out, ws, LORA, 192 ** -0.5, cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
