"""``benchmarks.e2e.tensor_parallel --profile``: where every microsecond of the TP decode step goes, per rank.

After the timed steps, each engine records ``--profile-steps`` decode steps under ``torch.profiler``
(CPU + CUDA activity: CUPTI also records the kernels of CUDA-graph replays) on rank 0, and on every
other rank through the worker's ``ProfileControl`` messages (each rank writes its Chrome trace; rank
0 reads them back). ``--profile-eager`` also records the same steps with the graphs set aside on
every rank (launch costs and the host's share become visible). Per rank: device time per kernel
category (``kernel_profile.categorize``, grouped by ``CATEGORIES``), count and share of the step; the GPU's
idle time (rank 0: before the step's first kernel, between kernels, after the last one; each rank
0 step ends in the host read of its tokens, so kernels fall inside their step's window); the NCCL
kernels (their time includes waiting for the peer); under TP the time between consecutive
collectives (attention block, MLP / MoE block of each layer); and the costliest kernels.

On a CPU (``--smoke``) there are no kernels: the top-level CPU ops of each thread stand in for them,
so the same tables (and the collectives of gloo) come out. The analysis below imports no tensor
library (unit-testable on fake traces); ``profile_engine`` is the part that runs the engine.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks.harness.kernel_profile import COLLECTIVE, DEVICE_CATS, OTHER, load_trace
from benchmarks.harness.kernel_profile import categorize as kernel_category

STEP_MARK = "tp_profile_step_"
# the TP view groups the kernel categories of ``benchmarks.harness.kernel_profile`` (its names
# include the CPU ops of the --smoke path): (group, the categories it takes)
CATEGORIES = [
    (COLLECTIVE, (COLLECTIVE,)),
    ("attention decode (+ plan, cache write)", ("attn: GQA append_attention", "attn: MLA decode (split-KV)",
                                               "attn: split merge", "attn: extend/prefill",
                                               "attn: latent interleave/cache write/gather")),
    ("MoE grouped GEMM", ("MoE: grouped GEMM",)),
    ("MoE routing / align / top-k sum", ("MoE: align/sum", "routing: topk/sort/softmax")),
    ("sampling (argmax) / logits", ("sampling: argmax/logits",)),
    ("dense GEMM / linear (incl. lm_head, router)", ("dense GEMM (cuBLAS)", "FP8 GEMM + quant")),
    ("norm / rope / elementwise / copies", ("norm (RMSNorm) / rope", "copies", "elementwise/reduce")),
]
GROUP = {fine: group for group, fines in CATEGORIES for fine in fines}


def categorize(name: str) -> str:
    return GROUP.get(kernel_category(name), OTHER)


def _complete(ev: dict) -> bool:
    return ev.get("ph") == "X" and "ts" in ev and "dur" in ev


def device_events(events: list[dict]) -> tuple[list[tuple[float, float, str]], str]:
    """(start µs, duration µs, name) of every kernel / device copy, in start order, and 'gpu'; with
    none (a CPU run), the top-level CPU ops of each thread instead, and 'cpu'."""
    dev = [(float(e["ts"]), float(e["dur"]), e["name"]) for e in events if _complete(e) and e.get("cat") in DEVICE_CATS]
    if dev:
        return sorted(dev), "gpu"
    ops: dict = {}
    for e in events:
        if _complete(e) and e.get("cat") == "cpu_op":
            ops.setdefault((e.get("pid"), e.get("tid")), []).append((float(e["ts"]), float(e["dur"]), e["name"]))
    top = []
    for evs in ops.values():
        end = float("-inf")
        for ts, dur, name in sorted(evs, key=lambda t: (t[0], -t[1])):
            if ts >= end:           # not inside the op before it: a top-level op
                top.append((ts, dur, name))
                end = ts + dur
    return sorted(top), "cpu"


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) µs of each ``record_function(STEP_MARK + i)`` on the host (rank 0's steps)."""
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                  if _complete(e) and e.get("cat") == "user_annotation" and e["name"].startswith(STEP_MARK))


def union_us(evs) -> float:
    """Time covered by at least one of the (start, duration, ...) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for ts, dur, *_ in sorted(evs):
        if cur_e is None or ts > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = ts, ts + dur
        else:
            cur_e = max(cur_e, ts + dur)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


def _blocks(evs, steps: int, layers: int) -> dict | None:
    """Under TP, the device time between consecutive collectives (end of one to start of the next: the
    kernels and the idle gaps of that block). A step's collectives: the embedding all-reduce, two per
    layer (attention o_proj, MLP / MoE) and the logits all-gather: the blocks in between are each
    layer's attention and MLP, then the final norm + lm_head. None when the count does not match."""
    per = 2 * layers + 2
    coll = [i for i, e in enumerate(evs) if categorize(e[2]) == COLLECTIVE]
    if not coll or len(coll) != steps * per:
        return None
    attn, mlp0, moe, head = [], [], [], []
    for s in range(steps):
        idx = coll[s * per:(s + 1) * per]
        for j in range(per - 1):
            a, b = evs[idx[j]], evs[idx[j + 1]]
            gap = b[0] - (a[0] + a[1])
            (head if j == per - 2 else attn if j % 2 == 0 else mlp0 if j == 1 else moe).append(gap)

    def mean(v):
        return sum(v) / len(v) if v else 0.0
    return {"attention_us_per_layer": mean(attn), "mlp_layer0_us": mean(mlp0), "moe_us_per_layer": mean(moe),
            "final_norm_lm_head_us": mean(head)}


def summarize(events: list[dict], steps: int, layers: int, step_us: float | None = None) -> dict:
    """One rank's trace of ``steps`` steps: per category / kernel µs and count per step, busy and idle
    time, the collectives, the blocks between them; ``step_us``: the step the shares are of (default:
    this trace's own step windows, else its device span per step)."""
    evs, kind = device_events(events)
    wins = step_windows(events)
    if wins:                                 # rank 0: only what its steps launched
        evs = [e for e in evs if any(a <= e[0] <= b for a, b in wins)]
    steps = max(steps, 1)
    out: dict = {"kind": kind, "steps": steps, "events": len(evs)}
    span = (max(e[0] + e[1] for e in evs) - evs[0][0]) if evs else 0.0
    busy = union_us(evs)
    out["kernel_sum_us"] = sum(e[1] for e in evs) / steps
    out["busy_us"] = busy / steps
    if wins:
        lead = tail = gaps = 0.0
        for a, b in wins:
            inside = [e for e in evs if a <= e[0] <= b]
            if not inside:
                lead += b - a
                continue
            first, last = inside[0][0], max(e[0] + e[1] for e in inside)
            lead, tail = lead + first - a, tail + max(b - last, 0.0)
            gaps += (last - first) - union_us(inside)
        out["wall_us"] = sum(b - a for a, b in wins) / len(wins)
        out.update(idle_before_first_us=lead / len(wins), idle_between_us=gaps / len(wins),
                   idle_after_last_us=tail / len(wins))
    else:
        out["wall_us"] = span / steps
        out.update(idle_before_first_us=None, idle_between_us=(span - busy) / steps, idle_after_last_us=None)
    denom = step_us or out["wall_us"] or 1.0
    kernels: dict = {}
    for ts, dur, name in evs:
        k = kernels.setdefault(name, [0.0, 0, float("inf"), 0.0])
        k[0], k[1], k[2], k[3] = k[0] + dur, k[1] + 1, min(k[2], dur), max(k[3], dur)
    out["kernels"] = sorted(({"name": n, "category": categorize(n), "us": v[0] / steps, "count": v[1] / steps,
                              "mean_us": v[0] / v[1], "min_us": v[2], "max_us": v[3]} for n, v in kernels.items()),
                            key=lambda k: -k["us"])
    cats: dict = {}
    for k in out["kernels"]:
        c = cats.setdefault(k["category"], {"us": 0.0, "count": 0.0})
        c["us"], c["count"] = c["us"] + k["us"], c["count"] + k["count"]
    for c in cats.values():
        c["share"] = c["us"] / denom
    out["categories"] = dict(sorted(cats.items(), key=lambda kv: -kv[1]["us"]))
    coll = [e[1] for e in evs if categorize(e[2]) == COLLECTIVE]
    if coll:
        firsts = [next((e[1] for e in evs if a <= e[0] <= b and categorize(e[2]) == COLLECTIVE), 0.0) for a, b in wins]
        out["collectives"] = {"count": len(coll) / steps, "us": sum(coll) / steps, "min_us": min(coll),
                              "median_us": statistics.median(coll), "max_us": max(coll),
                              "excess_over_min_us": (sum(coll) - len(coll) * min(coll)) / steps,
                              "first_of_step_us": sum(firsts) / len(firsts) if firsts else None}
        out["blocks"] = _blocks(evs, steps, layers)
    if wins:                                 # one step in launch order (the middle one): offsets from its start
        a, b = wins[len(wins) // 2]
        out["sequence"] = [[n[:120], round(ts - a, 2), round(d, 2)] for ts, d, n in evs if a <= ts <= b]
    return out


def _f(v, fmt=".0f") -> str:
    return "-" if v is None else format(v, fmt)


def format_run(run: dict, top: int = 15) -> list[str]:
    """Markdown tables of one profiled (TP size, mode): categories per rank, idle, collectives, blocks, top kernels."""
    ranks = run["ranks"]
    r0 = ranks[0]
    lines = [f"\n### Profile: TP={run['tp']}, {run['mode']}, {run['steps']} steps ({r0['kind']}); step "
             f"{run['step_ms']:.2f} ms timed, {r0['wall_us'] / 1e3:.2f} ms under the profiler (rank 0 wall)",
             "| category | " + " | ".join(f"rank {i} µs/step | count | share" for i in range(len(ranks))) + " |",
             "| --- |" + " ---: | ---: | ---: |" * len(ranks)]
    cats = list(dict.fromkeys(c for r in ranks for c in r["categories"]))
    for c in cats:
        cells = []
        for r in ranks:
            v = r["categories"].get(c)
            cells.append(f"{v['us']:.0f} | {v['count']:.0f} | {v['share']:.1%}" if v else "- | - | -")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    rows = [("kernels, summed", "kernel_sum_us"), ("GPU busy (union of kernels)", "busy_us"),
            ("idle: step start -> first kernel (host: inputs, send to workers, launch)", "idle_before_first_us"),
            ("idle: between kernels (rank 1: incl. waiting for rank 0's next step)", "idle_between_us"),
            ("idle: last kernel -> step end (host read, sampling)", "idle_after_last_us")]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(f"{_f(r[key])} | | {_f(r[key] and r[key] / r0['wall_us'], '.1%')}"
                                                  for r in ranks) + " |")
    if r0["kind"] == "gpu" and r0["events"] < 10 * run.get("layers", 1) * run["steps"]:
        lines.append(f"- WARNING: rank 0 recorded {r0['events'] / run['steps']:.0f} kernels a step: the profiler "
                     "missed the CUDA graphs' kernels? (compare the eager run: --profile-eager)")
    for i, r in enumerate(ranks):
        c = r.get("collectives")
        if c:
            lines.append(f"- rank {i} collectives: {c['count']:.0f}/step, {c['us']:.0f} µs/step; each min "
                         f"{c['min_us']:.1f} / median {c['median_us']:.1f} / max {c['max_us']:.1f} µs; over "
                         f"count x min (waiting for the peer, protocol): {c['excess_over_min_us']:.0f} µs/step; "
                         f"first of the step (embedding all-reduce): {_f(c['first_of_step_us'], '.1f')} µs")
        b = r.get("blocks")
        if b:
            lines.append(f"- rank {i} between collectives (kernels + gaps): attention "
                         f"{b['attention_us_per_layer']:.1f} µs/layer, MoE {b['moe_us_per_layer']:.1f} µs/layer, "
                         f"layer-0 dense MLP {b['mlp_layer0_us']:.1f}, final norm + lm_head "
                         f"{b['final_norm_lm_head_us']:.1f} µs")
    lines += [f"\nTop {top} kernels, rank 0:", "| µs/step | count/step | mean µs | category | kernel |",
              "| ---: | ---: | ---: | --- | --- |"]
    lines += [f"| {k['us']:.0f} | {k['count']:.0f} | {k['mean_us']:.1f} | {k['category']} | `{k['name'][:90]}` |"
              for k in r0["kernels"][:top]]
    return lines


def comparison(runs: list[dict]) -> list[str]:
    """Rank 0's µs/step per category side by side; for TP=k > 1 of the same mode, what exceeds TP=1 / k
    (the time that did not shrink with the ranks)."""
    if not runs:
        return []
    keys = [(r["tp"], r["mode"]) for r in runs]
    base = {r["mode"]: r for r in runs if r["tp"] == 1}
    extra = [r for r in runs if r["tp"] > 1 and r["mode"] in base]
    lines = ["\n### Rank 0 µs/step by category" + (" (TP=k - TP=1/k: did not shrink)" if extra else ""),
             "| category | " + " | ".join(f"TP={t} {m}" for t, m in keys)
             + "".join(f" | TP={r['tp']} {r['mode']} - TP=1/{r['tp']}" for r in extra) + " |",
             "| --- |" + " ---: |" * (len(keys) + len(extra))]
    cats = list(dict.fromkeys(c for r in runs for c in r["ranks"][0]["categories"]))

    def us(r, c):
        v = r["ranks"][0]["categories"].get(c)
        return v["us"] if v else 0.0
    for c in cats:
        lines.append(f"| {c} | " + " | ".join(f"{us(r, c):.0f}" for r in runs)
                     + "".join(f" | {us(r, c) - us(base[r['mode']], c) / r['tp']:+.0f}" for r in extra) + " |")
    for label, key in (("GPU busy", "busy_us"), ("GPU idle", None), ("step wall (profiled)", "wall_us")):
        def val(r):
            r0 = r["ranks"][0]
            return r0["wall_us"] - r0["busy_us"] if key is None else r0[key]
        lines.append(f"| {label} | " + " | ".join(f"{val(r):.0f}" for r in runs)
                     + "".join(f" | {val(r) - val(base[r['mode']]) / r['tp']:+.0f}" for r in extra) + " |")
    return lines


# -- the engine side (torch) ---------------------------------------------------------------------
def _wait_for(path: Path, driver, timeout_s: float = 300.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        failure = driver.failure()      # a dead worker, with its traceback
        if failure or time.monotonic() > deadline:
            raise RuntimeError(failure or f"no profile trace {path} from the workers (timed out)")
        time.sleep(0.1)
    return path


def profile_engine(llm, batch, tp: int, mode: str, steps: int, layers: int, trace_dir: Path, step_ms: float,
                   warmup: int = 2) -> dict:
    """``steps`` greedy decode steps of ``batch`` under torch.profiler on every rank; ``mode`` 'graphs'
    (the engine's CUDA graphs) or 'eager' (the graphs set aside on every rank for these steps)."""
    from torch.profiler import record_function

    from benchmarks.harness.models import greedy_step
    from paddle_mla.parallel.worker import ProfileControl, RankProfile
    from paddle_mla.platform import runtime

    runner = llm.runner
    driver = runner.tp_driver
    local = RankProfile(0)      # rank 0 takes the same messages as the workers, in the same order

    def ctl(action: str, out: str = "") -> None:
        msg = ProfileControl(action, out)
        if driver is not None:
            driver.send(msg)
        local.handle(msg, runner)
    step = greedy_step(runner, batch)
    if mode == "eager":
        ctl("eager")
    path = str(trace_dir / f"trace_tp{tp}_{mode}_rank{{rank}}.json.gz")
    try:
        for _ in range(warmup):
            step()
        runtime.synchronize()
        for n, out in ((1, ""), (steps, path)):    # a one-step cycle first, not kept: the profiler's start-up
            ctl("start")
            for i in range(n):
                with record_function(f"{STEP_MARK}{i}"):
                    step()
            ctl("stop", out)
    finally:
        if mode == "eager":
            ctl("graphs")
    paths = [Path(path.format(rank=0))] + [_wait_for(Path(path.format(rank=r)), driver) for r in range(1, tp)]
    r0 = summarize(load_trace(paths[0]), steps, layers)
    ranks = [r0] + [summarize(load_trace(p), steps, layers, r0["wall_us"]) for p in paths[1:]]
    return {"tp": tp, "mode": mode, "steps": steps, "layers": layers, "step_ms": step_ms,
            "traces": [str(p) for p in paths], "ranks": ranks}
