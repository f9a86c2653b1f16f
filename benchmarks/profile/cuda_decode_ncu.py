"""The ``mla_decode`` CUDA op for Nsight Compute: one case (V3 dims, 64-token pages in random order),
over a bf16 cache and over the same rows as FP8 (``cache.fp8_latent``). Each cache's decode is launched
once to warm up, then once more for ncu, in the order of ``--caches``:

    ncu --kernel-name regex:mla_decode_wgmma --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 -m benchmarks.profile.cuda_decode_ncu --b 64 --h 16 --s 4096 [--caches bf16,fp8]

(skip = count = the number of caches: the warm-up launches come first.)
"""

from __future__ import annotations

import argparse

from paddle_mla.platform import runtime

runtime.select("torch")  # as the decode kernel benchmarks

from benchmarks.harness.mla_cases import D, LORA, make_decode_case  # noqa: E402
from paddle_mla.attention.triton_mla import cuda_decode  # noqa: E402
from paddle_mla.cache import fp8_latent  # noqa: E402
from paddle_mla.platform.tensor_api import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--caches", default="bf16,fp8", help="bf16 and / or fp8, in launch order")
    a = ap.parse_args()
    why = cuda_decode.unavailable_reason(LORA, D, torch.bfloat16, "cuda")
    if why:
        raise SystemExit(f"the mla_decode op cannot run here: {why}")
    cache, tables, q, lens = make_decode_case(a.b, a.h, a.s)
    nb, page = cache.shape[:2]
    caches = {"bf16": cache,
              "fp8": fp8_latent.quantize(cache.view(-1, D)).view(nb, page, 1, fp8_latent.row_width(D))}
    dec = cuda_decode.CudaDecode(a.h, a.b, "cuda")
    out = torch.empty(a.b, a.h, LORA, dtype=torch.bfloat16, device="cuda")
    dec.plan(lens, a.b)
    order = [caches[name] for name in a.caches.split(",") if name]
    for kv in order + order:   # the warm-up launches, then the profiled ones
        dec.run(q, kv, tables, lens, out, a.b, 192 ** -0.5)
    torch.cuda.synchronize()
    print(f"b={a.b} h={a.h} s={a.s}: {a.caches} launched twice each", flush=True)


if __name__ == "__main__":
    main()
