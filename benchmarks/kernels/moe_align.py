"""The fused MoE's align (``fused_moe/align.py``) in its two forms at a layer's pair counts: one program
for the whole call against the wide form (a fill, a zeroing and three kernels over programs), one GPU.

Each figure is one call's µs inside a CUDA graph of 32 calls back to back (the engine replays its
layers so), launch gaps included: at decode's pair counts the gaps between the wide form's five nodes
are most of its time. The pair counts are tokens x (top_k + shared pieces) of the model's layer; the
ids are random distinct experts per token, as routing gives. Where the one-program form stops winning
sets ``align.ONE_PROGRAM_MAX_WORK``; the "engine's" column is the form ``moe_align`` picks
(``align.picks_one_program``).

    python -m benchmarks.kernels.moe_align [--dims v2lite,v3] [--tokens 1,16,64,128,256,512,1024]
    TRITON_INTERPRET=1 python -m benchmarks.kernels.moe_align --smoke    (CPU, tiny dims: the code path only)
"""

from __future__ import annotations

import argparse
import functools

from paddle_mla.platform import runtime

runtime.select("torch")  # CUDA graphs: the benchmark runs on PyTorch

import torch  # noqa: E402

from paddle_mla.models.fused_moe.align import AlignBuffers, moe_align, picks_one_program  # noqa: E402

# experts + shared pieces (the columns routing writes), pairs a token, the BLOCK_M decode configs pick
DIMS = {"v2lite": (66, 8, 16), "v3": (257, 9, 16), "tiny": (10, 4, 16)}


def _ids(tokens: int, experts: int, per_token: int, dev: str):
    g = torch.Generator(device="cpu").manual_seed(tokens)
    return torch.argsort(torch.rand(tokens, experts, generator=g), 1)[:, :per_token].to(torch.int32).to(dev)


def _labels(plan, block_m: int, pairs: int) -> list[tuple[int, int]]:
    """(pair, its block's expert) of every pair that took a slot (padding slots hold ``pairs``)."""
    sorted_ids, expert_ids, total = plan
    tot = int(total.item())
    slot = torch.arange(tot, device=sorted_ids.device)
    real = sorted_ids[:tot] < pairs
    return sorted(zip(sorted_ids[:tot][real].tolist(), expert_ids[slot[real] // block_m].tolist()))


def _one_call_us(fn, calls: int = 32) -> float:
    if not torch.cuda.is_available():
        fn()
        return float("nan")
    from benchmarks.harness.timing import graph_replay_median_us

    return graph_replay_median_us([fn] * calls)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="v2lite,v3", help=f"comma list of {', '.join(DIMS)}")
    ap.add_argument("--tokens", default="1,16,64,128,256,512,1024", help="tokens in the call")
    ap.add_argument("--smoke", action="store_true", help="tiny dims (on CPU, run it under TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.dims, a.tokens = "tiny", "3,40"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print("| dims | tokens | pairs | one program µs | wide µs | one / wide | engine's | same plan |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    rows = []
    for name in a.dims.split(","):
        experts, per_token, block_m = DIMS[name]
        for tokens in (int(t) for t in a.tokens.split(",")):
            ids = _ids(tokens, experts, per_token, dev)
            bufs = [AlignBuffers(ids.numel(), experts, dev) for _ in range(2)]
            forms = {form: functools.partial(moe_align, ids, buf, block_m, one_program=form == "one")
                     for form, buf in zip(("one", "wide"), bufs)}
            us = {k: _one_call_us(f) for k, f in forms.items()}
            out = {k: f() for k, f in forms.items()}
            # slots inside an expert's run may differ in order: the plan is the total, the block labels
            # and each pair's block label
            same = all(torch.equal(out["one"][i], out["wide"][i]) for i in (1, 2)) and _labels(
                out["one"], block_m, ids.numel()) == _labels(out["wide"], block_m, ids.numel())
            picked = "one" if picks_one_program(ids.numel(), experts) else "wide"
            rows.append({"dims": name, "tokens": tokens, "pairs": ids.numel(), "one_us": us["one"],
                         "wide_us": us["wide"], "picked": picked, "same": same})
            print(f"| {name} | {tokens} | {ids.numel()} | {us['one']:.2f} | {us['wide']:.2f} | "
                  f"{us['one'] / us['wide']:.2f} | {picked} | {same} |")
    return rows


if __name__ == "__main__":
    main()
