"""Chooses fused MoE launch configs per token count on this GPU and writes them as JSON data.

For one shape (E, top-k, N, K) and dtype (bf16 | fp8_w8a8), each M of the list times the whole
fused MoE (align + both GEMMs + sum; CUDA-graph replay medians) over a config space and keeps the
fastest config whose output matches the heuristic default's (relative error < 1e-2; configs that
fail to compile, e.g. out of shared memory, are skipped). The table goes to
paddle_mla/models/fused_moe/configs/E=..,N=..,K=..,dtype=..,device=<GPU>.json, which
launch_config.get_config reads (nearest M). Commit the file.

  python3 -m benchmarks.kernels.tune_fused_moe --shape v2lite --dtype bf16 [--m 1,16,64,...] [--space small|full]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs and triton.testing: the tuner runs on PyTorch

from benchmarks.harness.dims import MOE_SHAPES, MoEShape  # noqa: E402
from benchmarks.harness.moe_cases import (Env, act_quant_fn, bench_us, device_name, make_inputs,  # noqa: E402
                                          make_weights)

from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe  # noqa: E402
from paddle_mla.models.fused_moe.launch_config import (CONFIG_DIR, config_file_name, default_config,  # noqa: E402
                                                      get_config, load_configs)

DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def space(kind: str, M: int, shape: MoEShape, fp8: bool, override: dict | None = None):
    rows = M * shape.top_k / shape.E
    bms = [b for b in (16, 32, 64, 128) if b <= max(16, 2 * rows)] or [16]
    if kind == "small":
        grid = dict(BLOCK_M=bms, BLOCK_N=[64, 128], BLOCK_K=[64, 128], GROUP_M=[1, 16], num_warps=[4, 8],
                    num_stages=[3, 4])
    else:
        grid = dict(BLOCK_M=bms, BLOCK_N=[32, 64, 128, 256], BLOCK_K=[64, 128, 256], GROUP_M=[1, 8, 16, 32],
                    num_warps=[4, 8], num_stages=[2, 3, 4, 5])
    if fp8:          # K tiles divide the 128-wide scale groups; the intermediate's groups are 64 or 128 wide
        grid["BLOCK_K"] = [128] if kind == "small" else [64, 128]
        grid["QUANT_GROUP"] = [64, 128]
    grid.update(override or {})
    keys = list(grid)
    # Nearest BLOCK_M to the rows each expert gets first: a per-M time budget then cuts the
    # unlikely tiles, not the likely ones (in plain product order a budget spent on BLOCK_M 16-32
    # never reached the 64-128 tiles that large M wants: V3 fp8 M=16384 kept BLOCK_M 32).
    ideal = math.log2(min(128, max(16, rows)))
    combos = sorted(itertools.product(*(grid[k] for k in keys)), key=lambda v: abs(math.log2(v[0]) - ideal))
    for values in combos:
        yield dict(zip(keys, values))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(MOE_SHAPES), required=True)
    ap.add_argument("--dtype", choices=("bf16", "fp8_w8a8"), default="bf16")
    ap.add_argument("--m", default=None, help="comma-separated token counts")
    ap.add_argument("--space", choices=("small", "full"), default="small")
    ap.add_argument("--budget-s", type=float, default=120.0, help="time limit per M (the best so far is kept)")
    ap.add_argument("--grid", default=None,
                    help='JSON replacing axes of the space, e.g. \'{"BLOCK_M": [64, 128], "GROUP_M": [1, 32]}\'')
    ap.add_argument("--out", default=None, help="JSON path (default: the package's configs/ folder)")
    ap.add_argument("--merge", action="store_true",
                    help="start from the package's table for this shape/dtype/GPU and replace only the tuned M")
    ap.add_argument("--smoke", action="store_true", help="check this tool on CPU (TRITON_INTERPRET=1, fp16)")
    args = ap.parse_args()
    if args.smoke:
        Env.set_smoke()
    shape, fp8 = MOE_SHAPES[args.shape], args.dtype == "fp8_w8a8"
    ms = tuple(int(m) for m in args.m.split(",")) if args.m else DEFAULT_M
    wts = make_weights(shape, fp8)
    quant, _ = act_quant_fn()
    ws = MoEWorkspace(max(ms), shape.top_k, shape.E, shape.N, shape.K, Env.dtype, Env.device, fp8=fp8)
    extra = dict(w_gate_scale=wts.s_gate, w_up_scale=wts.s_up, w_down_scale=wts.s_down, act_quant=quant) if fp8 else {}
    device = device_name()
    table = {}
    if args.merge:
        table = {str(m): cfg for m, cfg in (load_configs(shape.E, shape.N, shape.K, args.dtype, device) or {}).items()}
    for M in ms:
        x, ids, w = make_inputs(shape, M)

        def run(cfg):
            return fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws, config=cfg, **extra)

        base_cfg = default_config(M, shape.E, shape.top_k, args.dtype)
        base = run(base_cfg).float()
        # the config to beat: with --merge, the one the table gives this M today (else a tuned entry
        # could be slower than its nearest neighbour was), timed as the candidates are (graph replay)
        current = get_config(M, shape.E, shape.N, shape.K, shape.top_k, args.dtype, device) if args.merge else base_cfg
        best, best_us, tried, t0 = current, bench_us(lambda: run(current), use_graph=True), 0, time.time()
        print(f"  M={M}: to beat {best_us:.1f} µs with {current}")
        for cfg in space(args.space, M, shape, fp8, json.loads(args.grid) if args.grid else None):
            if time.time() - t0 > args.budget_s:
                print(f"  M={M}: budget reached after {tried} configs")
                break
            tried += 1
            try:
                out = run(cfg).float()
                err = float((out - base).norm() / base.norm().clamp_min(1e-30))
                if err > 1e-2:
                    print(f"  M={M}: {cfg} disagrees with the default config (rel err {err:.1e}); skipped")
                    continue
                us = bench_us(lambda: run(cfg), use_graph=True)
            except Exception as e:  # noqa: BLE001  (out of shared memory and the like)
                print(f"  M={M}: {cfg} failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            if us < best_us:
                best, best_us = cfg, us
        print(f"M={M}: {best_us:.1f} µs with {best} ({tried} configs tried)", flush=True)
        table[str(M)] = best
    table = {str(m): table[str(m)] for m in sorted(map(int, table))}
    path = args.out or str(CONFIG_DIR / config_file_name(shape.E, shape.N, shape.K, args.dtype, device))
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1)
        fh.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
