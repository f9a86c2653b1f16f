"""Decode calls for Nsight Compute: where do the missed targets go? One process, one case (V3 dims,
64-token pages in random order), then either the Triton decode under one or more configs, or the
``mla_decode`` CUDA op over a bf16 cache and / or the same rows as FP8 (``cache.fp8_latent``). Every
call is launched once to warm up (compile), then once more for ncu, in the printed order (skip the
first N, N = the number of calls):

    ncu --kernel-name regex:_decode_stage1 --launch-skip N --launch-count N \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section LaunchStats python3 -m benchmarks.profile.decode_ncu --b 128 --h 16 --s 4096 \\
        [--cfg "dv_split=2;num_warps=8"]
    ncu --kernel-name regex:mla_decode_wgmma --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        --section WarpStateStats python3 -m benchmarks.profile.decode_ncu --b 64 --h 16 --cuda bf16,fp8

``--cfg``: ';'-separated ``decode_config`` overrides (as benchmarks.kernels.mla_decode's --variants);
today's config comes first, so N = 1 + the number of overrides. ``--cuda``: the CUDA op's caches.
``--flashinfer``: FlashInfer's MLA decode after them, the anchor's profile. The profiled launches sit
in an NVTX range, so ``ncu --nvtx --nvtx-include "profiled/"`` takes every kernel of that pass (plans,
splits, combines, the anchor's) without knowing their names.
"""

from __future__ import annotations

import argparse

from paddle_mla.platform import runtime

runtime.select("torch")  # as the decode kernel benchmark

from benchmarks.harness.mla_cases import D, LORA, SCALE, make_decode_case, parse_variants  # noqa: E402
from paddle_mla.attention.triton_mla import decode  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def triton_calls(case, a) -> list:
    cache, tables, q, lens = case
    runs = []
    for i, over in enumerate(parse_variants(a.cfg)):
        cfg = decode.decode_config(a.h, **over)
        print(f"config {i}: {over or 'today'} -> {cfg}", flush=True)
        ws = decode.alloc_decode_workspace(a.b, a.h, LORA, decode.split_cap(cfg.programs), "cuda",
                                           programs=cfg.programs)
        out = torch.empty(a.b, a.h, LORA, dtype=torch.bfloat16, device="cuda")
        decode.build_decode_plan(lens, a.b, ws, cfg.block_n, cfg.target_items, cfg.min_tiles)
        runs.append(lambda cfg=cfg, ws=ws, out=out: decode.mla_decode(q, cache, tables, lens, out, ws, LORA,
                                                                        SCALE, cfg))
    return runs


def cuda_calls(case, a) -> list:
    from paddle_mla.attention.triton_mla import cuda_decode
    from paddle_mla.cache import fp8_latent

    why = cuda_decode.unavailable_reason(LORA, D, torch.bfloat16, "cuda")
    if why:
        raise SystemExit(f"the mla_decode op cannot run here: {why}")
    cache, tables, q, lens = case
    nb, page = cache.shape[:2]
    names = [n for n in a.cuda.split(",") if n]
    unknown = set(names) - {"bf16", "fp8"}
    if unknown:
        raise SystemExit(f"--cuda takes bf16 and / or fp8, not {', '.join(sorted(unknown))}")
    caches = {"bf16": cache}
    if "fp8" in names:   # the same rows as FP8 (the whole cache quantized: built only when asked for)
        caches["fp8"] = fp8_latent.quantize(cache.view(-1, D)).view(nb, page, 1, fp8_latent.row_width(D))
    dec = cuda_decode.CudaDecode(a.h, a.b, "cuda")
    out = torch.empty(a.b, a.h, LORA, dtype=torch.bfloat16, device="cuda")
    dec.plan(lens, a.b)
    print(f"CUDA op over {', '.join(names)}", flush=True)
    return [lambda kv=caches[n]: dec.run(q, kv, tables, lens, out, a.b, SCALE) for n in names]


def flashinfer_call(case, a):
    """FlashInfer's MLA decode on the same case (the anchor's own profile; its kernels' names differ)."""
    from benchmarks.harness import flashinfer_mla

    fi, origin = flashinfer_mla.load()
    if fi is None:
        raise SystemExit(f"FlashInfer: {origin}")
    print(f"then FlashInfer: {origin}", flush=True)
    return flashinfer_mla.FlashInferMla(fi, case, a.h, SCALE).run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--cfg", default="", help="';'-separated decode_config overrides, e.g. dv_split=2;num_warps=8")
    ap.add_argument("--cuda", default="", help="the CUDA op instead, over these caches in order: bf16 and / or fp8")
    ap.add_argument("--flashinfer", action="store_true",
                    help="then FlashInfer's MLA decode (scripts/fetch_flashinfer.sh)")
    a = ap.parse_args()
    case = make_decode_case(a.b, a.h, a.s)
    runs = cuda_calls(case, a) if a.cuda else triton_calls(case, a)
    if a.flashinfer:
        runs.append(flashinfer_call(case, a))
    for fn in runs:   # compiles / warms up (ncu skips these launches)
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")   # ncu --nvtx --nvtx-include "profiled/": every kernel below
    for fn in runs:   # the profiled launches, in the printed order
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
