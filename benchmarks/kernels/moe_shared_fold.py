"""A MoE layer's forward with the shared experts folded into the routed stacks (``moe.fold_shared_experts``)
against the same layer with them apart (a separate SwiGLU MLP and an add), one GPU, bf16, timed as
CUDA-graph replays (``triton.testing.do_bench_cudagraph``, median µs).

Each MoE layer is one rank's share under tensor parallelism (every intermediate width / TP), so
``--tp 2`` times a TP=2 rank's layer. The "folded" layer is the engine's: up to
``moe.FOLD_MAX_TOKENS`` tokens it runs the pieces in the grouped GEMMs, past it the shared MLP apart
over the stacks' rows, so its rows past that bound time the same work. ``rel diff`` is the two
outputs' relative difference (the apart form rounds the shared output and the routed sum to bf16
before adding them; the folded one rounds once), which stays at bf16 rounding.

    python -m benchmarks.kernels.moe_shared_fold [--dims v2lite,v3] [--tp 1,2] [--m 1,16,64,65,256,2048]
    python -m benchmarks.kernels.moe_shared_fold --smoke    (CPU, tiny dims, fp32 plain MoE: the code path only)
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs and triton.testing: the benchmark runs on PyTorch

import torch  # noqa: E402
import triton  # noqa: E402

from paddle_mla.models import moe as moe_mod  # noqa: E402
from paddle_mla.models.arch import MoESpec  # noqa: E402
from paddle_mla.models.deepseek import DenseMLP  # noqa: E402

# experts, top-k, intermediate, hidden, shared experts, routing (method, scoring, groups, groups kept)
DIMS = {"v2lite": (64, 6, 1408, 2048, 2, "greedy", "softmax", 1, 1),
        "v3": (256, 8, 2048, 7168, 1, "noaux_tc", "sigmoid", 8, 4),
        "tiny": (8, 2, 32, 64, 2, "greedy", "softmax", 1, 1)}


def layers(name: str, tp: int, max_tokens: int, dev: str = "cuda", dtype=torch.bfloat16) -> tuple[dict, MoESpec, int]:
    """{"apart": MoE, "folded": MoE} over the same random weights of ``name`` at TP=``tp``."""
    E, k, inter, hidden, shared, method, scoring, groups, kept = DIMS[name]
    spec = MoESpec(n_routed_experts=E, num_experts_per_tok=k, n_shared_experts=shared, first_k_dense_replace=0,
                   topk_method=method, scoring_func=scoring, n_group=groups, topk_group=kept,
                   norm_topk_prob=True, routed_scaling_factor=2.5, scale_after_norm=False)
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*s):
        return (torch.randn(*s, generator=g, device=dev) * 0.02).to(dtype)
    i, s = inter // tp, shared * inter // tp
    weights = {"m.gate.weight": torch.randn(E, hidden, device=dev, generator=g), "m.experts.gate": r(E, i, hidden),
               "m.experts.up": r(E, i, hidden), "m.experts.down": r(E, hidden, i),
               "m.shared_experts.gate_proj.weight": r(s, hidden), "m.shared_experts.up_proj.weight": r(s, hidden),
               "m.shared_experts.down_proj.weight": r(hidden, s)}
    if method == "noaux_tc":
        weights["m.gate.e_score_correction_bias"] = torch.zeros(E, device=dev)
    out, real_fold = {}, moe_mod.fold_shared_experts
    try:
        for mode in ("apart", "folded"):
            moe_mod.fold_shared_experts = real_fold if mode == "folded" else (lambda *a: None)
            exec_ = moe_mod.MoEExec(dev, dtype)
            layer = moe_mod.MoE(SimpleNamespace(moe=spec), dict(weights), "m.", exec_, DenseMLP)
            exec_.reserve(max_tokens, layer.pairs_per_token, layer.w_gate.shape[0], layer.inter_size, hidden)
            out[mode] = layer
    finally:
        moe_mod.fold_shared_experts = real_fold
    return out, spec, hidden


def wall_us(fn, iters: int = 3) -> float:
    """--smoke: mean wall µs (no CUDA graphs on CPU; the figure proves nothing about a GPU)."""
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters * 1e6


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="v2lite,v3", help=f"comma list of {', '.join(DIMS)}")
    ap.add_argument("--tp", default="1,2", help="tensor-parallel sizes: the layer is one rank's share")
    ap.add_argument("--m", default="1,16,64,65,256,2048", help="tokens in the call")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny dims, fp32: the code path only")
    args = ap.parse_args(argv)
    if args.smoke:
        args.dims, args.tp, args.m = "tiny", "1,2", "3,65"
    dev, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    ms = [int(m) for m in args.m.split(",")]
    where = "cpu" if args.smoke else torch.cuda.get_device_name()
    timing = "wall" if args.smoke else "graph replay"
    print(f"# {where}: MoE layer forward, shared experts folded vs apart ({timing}, µs)")
    print("| dims | TP | tokens | apart µs | folded µs | folded / apart | folded here | rel diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    rows = []
    for name in args.dims.split(","):
        for tp in (int(t) for t in args.tp.split(",")):
            pair, _, hidden = layers(name, tp, max(ms), dev, dtype)
            g = torch.Generator(device=dev).manual_seed(1)
            for m in ms:
                x = torch.randn(m, hidden, generator=g, device=dev).to(dtype)
                a, b = (pair[mode].forward(x).float() for mode in ("apart", "folded"))
                rel = float((a - b).norm() / a.norm())
                bench = wall_us if args.smoke else \
                    (lambda fn: triton.testing.do_bench_cudagraph(fn, rep=200) * 1000)
                t = {mode: bench(lambda layer=layer: layer.forward(x)) for mode, layer in pair.items()}
                folded = pair["folded"].folds_shared(m)
                rows.append(dict(dims=name, tp=tp, tokens=m, folds=folded, rel_diff=rel, apart_us=t["apart"],
                                 folded_us=t["folded"]))
                print(f"| {name} | {tp} | {m} | {t['apart']:.1f} | {t['folded']:.1f} | {t['folded'] / t['apart']:.3f} "
                      f"| {'yes' if folded else 'no'} | {rel:.1e} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
