"""Where a small batch's MLA decode time goes on the SM90 CUDA op: the kernels of one CUDA-graph replay
(the plan, the split kernel, the combine) on a device timeline, each with its µs, the gap or overlap
before it, and the replay's span, with programmatic dependent launch (PDL) on and off. L2 is
flushed before each replay, as ``triton.testing.do_bench`` does, so the figures match the benchmark's.

  python -m benchmarks.profile.mla_decode_latency [--b 1] [--h 16,128] [--s 4096] [--iters 50]

Writes $OUT/mla_decode_latency.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from paddle_mla.platform import runtime

runtime.select("torch")

import torch  # noqa: E402

from benchmarks.harness.kernel_profile import DEVICE_CATS, load_trace, profiled  # noqa: E402
from benchmarks.harness.mla_cases import D, cuda_decode_graphs, make_decode_case, pdl_switch  # noqa: E402
from benchmarks.harness.timing import median_us  # noqa: E402


def timeline(replay, iters: int) -> dict:
    """Mean per-kernel µs, start offsets and span over ``iters`` flushed replays of ``replay``."""
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")   # 256 MB, as do_bench's flush

    def step():
        flush.zero_()
        replay()

    prof = profiled(step, iters, 3)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        evs = sorted((e for e in load_trace(f.name) if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    per = len(evs) // iters
    if per * iters != len(evs) or per < 2:
        return {"error": f"{len(evs)} device events over {iters} replays"}
    kernels = []
    for i in range(1, per):       # event 0 of each replay is the flush
        runs = [evs[j * per:(j + 1) * per] for j in range(iters)]
        kernels.append(dict(
            name=evs[i]["name"][:60],
            us=sum(r[i]["dur"] for r in runs) / iters,
            # from the previous kernel's end to this one's start; negative: they overlapped (PDL)
            gap_us=sum(r[i]["ts"] - (r[i - 1]["ts"] + r[i - 1]["dur"]) for r in runs[1:] if i > 1) / (iters - 1)
            if i > 1 else 0.0,
        ))
    spans = [max(e["ts"] + e["dur"] for e in evs[j * per + 1:(j + 1) * per]) - evs[j * per + 1]["ts"]
             for j in range(iters)]
    return {"kernels": kernels, "span_us": sorted(spans)[iters // 2]}


def measure(b: int, h: int, s: int, iters: int, pdl: bool) -> dict:
    with pdl_switch(pdl):
        got = cuda_decode_graphs(make_decode_case(b, h, s), h)
        if got is None:
            raise SystemExit("the mla_decode CUDA op cannot run here (cuda_decode.unavailable_reason)")
        dec, _, whole, layer, _ = got
        return {"b": b, "h": h, "s": s, "pdl": pdl, "programs": dec.launch.programs,
                "splits": int(dec.ws.num_kv_splits[0].item()), "window_tiles": int(dec.ws.tiles_per_prog[0].item()),
                "graph_us": median_us(whole.replay), "graph_layer_us": median_us(layer.replay),
                "plan_and_decode": timeline(whole.replay, iters), "decode_alone": timeline(layer.replay, iters)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", default="1")
    ap.add_argument("--h", default="16,128")
    ap.add_argument("--s", default="4096")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    ints = lambda x: [int(v) for v in x.split(",") if v]
    assert D == 576
    rows = []
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for b in ints(args.b):
        for h in ints(args.h):
            for s in ints(args.s):
                for pdl in (True, False):
                    r = measure(b, h, s, args.iters, pdl)
                    rows.append(r)
                    print(f"b={b} h={h} s={s} pdl={int(pdl)}: graph {r['graph_us']:.1f} µs (decode alone "
                          f"{r['graph_layer_us']:.1f}), {r['splits']} splits of {r['window_tiles']}-tile windows")
                    for part in ("plan_and_decode", "decode_alone"):
                        t = r[part]
                        if "error" in t:
                            print(f"  {part}: {t['error']}")
                            continue
                        ks = "; ".join(f"{k['name'][:40]} {k['us']:.1f} (gap {k['gap_us']:+.1f})" for k in t["kernels"])
                        print(f"  {part}: span {t['span_us']:.1f} µs: {ks}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "mla_decode_latency.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
