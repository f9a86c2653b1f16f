"""The MoE layer under expert parallelism against TP-sliced experts, one rank's work, one GPU.

Under tensor parallelism every rank holds every token's hidden state (attention's output is
all-reduced), so both ways of splitting the routed experts over R ranks end in the same one
all-reduce, and differ only in each rank's grouped GEMMs:
- TP-sliced: all E experts, each cut to N/R of its intermediate width, every (token, expert) pair;
- EP: E/R whole experts, only the pairs routed to them (the rest are skipped by the kernel).
The layer's time is the slowest rank's, so this program times each rank's fused MoE call (bf16,
CUDA-graph replay, L2 flushed) on one GPU and reports max over ranks, EP/TP. The communication is the
same in both and is left out. Routing is uniformly random (distinct experts per token), which keeps
EP's ranks balanced on average; a skewed router would load one rank more. Both outputs summed over
ranks are compared with the unsplit layer, so a wrong split cannot post a fast time.

    python -m benchmarks.kernels.moe_ep [--shape v2lite] [--ranks 2] [--m 16,64,128,256,1024]
    python -m benchmarks.kernels.moe_ep --smoke     (CPU, TRITON_INTERPRET=1: the code path only)
"""

from __future__ import annotations

import argparse
import json

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs and triton.testing: the benchmark runs on PyTorch

import torch  # noqa: E402

from benchmarks.harness.dims import MOE_SHAPES  # noqa: E402
from benchmarks.harness.errors import rel_err  # noqa: E402
from benchmarks.harness.moe_cases import Env, bench_us, device_name, make_inputs, make_weights  # noqa: E402
from paddle_mla.models.fused_moe.kernels import MoEWorkspace, fused_moe  # noqa: E402


def tp_slices(wts, ranks: int):
    """Each rank's (w_gate, w_up, w_down): every expert, 1/ranks of its intermediate width."""
    n = wts.N // ranks
    return [(wts.w_gate[:, r * n:(r + 1) * n].contiguous(), wts.w_up[:, r * n:(r + 1) * n].contiguous(),
             wts.w_down[:, :, r * n:(r + 1) * n].contiguous()) for r in range(ranks)]


def ep_slices(wts, ranks: int):
    """Each rank's (w_gate, w_up, w_down): 1/ranks of the experts, whole."""
    e = wts.w_gate.shape[0] // ranks
    return [(wts.w_gate[r * e:(r + 1) * e].contiguous(), wts.w_up[r * e:(r + 1) * e].contiguous(),
             wts.w_down[r * e:(r + 1) * e].contiguous()) for r in range(ranks)]


def run_point(shape, wts, tp, ep, ranks: int, M: int) -> dict:
    x, ids, w = make_inputs(shape, M)
    e_local = shape.E // ranks
    n_local = shape.N // ranks
    ws_tp = MoEWorkspace(M, shape.top_k, shape.E, n_local, shape.K, Env.dtype, Env.device)
    ws_ep = MoEWorkspace(M, shape.top_k, e_local, shape.N, shape.K, Env.dtype, Env.device)
    ws_full = MoEWorkspace(M, shape.top_k, shape.E, shape.N, shape.K, Env.dtype, Env.device)
    local_ids = [ids - r * e_local for r in range(ranks)]   # an id outside [0, e_local) is another rank's

    def tp_call(r):
        return fused_moe(x, *tp[r], ids, w, ws_tp)

    def ep_call(r):
        return fused_moe(x, *ep[r], local_ids[r], w, ws_ep, n_routed=shape.E)

    full = fused_moe(x, wts.w_gate, wts.w_up, wts.w_down, ids, w, ws_full)
    err_tp = rel_err(sum(tp_call(r).float() for r in range(ranks)), full)
    err_ep = rel_err(sum(ep_call(r).float() for r in range(ranks)), full)
    tp_us = [bench_us(lambda r=r: tp_call(r)) for r in range(ranks)]
    ep_us = [bench_us(lambda r=r: ep_call(r)) for r in range(ranks)]
    return dict(M=M, tp_us=tp_us, ep_us=ep_us, tp_layer_us=max(tp_us), ep_layer_us=max(ep_us),
                ratio=max(ep_us) / max(tp_us), rel_err_tp=err_tp, rel_err_ep=err_ep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="v2lite", choices=sorted(MOE_SHAPES))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--m", default="16,64,128,256,1024", help="tokens per call (the decode batch)")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shape")
    args = ap.parse_args()
    if args.smoke:
        Env.set_smoke()
        args.shape, args.m = "tiny", "4"
    shape = MOE_SHAPES[args.shape]
    if shape.E % args.ranks or shape.N % args.ranks:
        raise SystemExit(f"{shape.name}: {shape.E} experts of width {shape.N} do not split over {args.ranks} ranks")
    wts = make_weights(shape, fp8=False)
    tp, ep = tp_slices(wts, args.ranks), ep_slices(wts, args.ranks)
    dtype = str(Env.dtype).replace("torch.", "")
    print(f"# MoE layer, one rank's work: {shape.name} (E={shape.E}, top-{shape.top_k}, N={shape.N}, "
          f"K={shape.K}), {args.ranks} ranks, {dtype}, {device_name()}\n")
    print("| M | TP-sliced layer µs (per rank) | EP layer µs (per rank) | EP / TP | rel err TP, EP vs unsplit |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for M in map(int, args.m.split(",")):
        r = run_point(shape, wts, tp, ep, args.ranks, M)
        rows.append(r)
        per = lambda us: " / ".join(f"{u:.1f}" for u in us)  # noqa: E731
        print(f"| {M} | {r['tp_layer_us']:.1f} ({per(r['tp_us'])}) | {r['ep_layer_us']:.1f} ({per(r['ep_us'])}) "
              f"| {r['ratio']:.2f}x | {r['rel_err_tp']:.1e}, {r['rel_err_ep']:.1e} |", flush=True)
    big = [r for r in rows if r["M"] >= 64]
    if big and not args.smoke:
        worst = max(r["ratio"] for r in big)
        print(f"\ntarget: EP MoE layer <= 0.9x TP-sliced at M >= 64: worst {worst:.2f}x "
              f"({'met' if worst <= 0.9 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=shape.name, ranks=args.ranks, device=device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
