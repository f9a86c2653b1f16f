"""``paddle-mla bench --check-determinism``: do a request's tokens depend on how it was batched?

One config and one workload, run by engines that differ only in how the requests meet:
  batch1    scheduler.max_num_seqs 1: every request alone (the reference)
  batch256  scheduler.max_num_seqs 256
  chunked   chunked prefill with a small step budget (a quarter of the longest prompt, at least 16)
  prefix    prefix caching on
  preempt   a pool of 16-token blocks holding two prompts and one block more: requests preempt one
            another as they grow and are recomputed from their tokens
  dp2       parallel.data_parallel_size 2 (two GPUs, or two processes on a CPU; skipped on one GPU)
Per configuration: the requests whose tokens differ from batch1's, the earliest token where one does,
and the requests whose tokens or logprob bits differ. With ``deterministic: true`` every count should
be 0 (README, "Reproducibility"); in the default mode batch composition may change bf16 tokens.

``benchmarks.e2e.determinism`` shares the configurations and the comparison, and adds model dims,
both modes side by side and timing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from paddle_mla.config.schema import ConfigError, load_config

VARIANTS = ("batch1", "batch256", "chunked", "prefix", "preempt", "dp2")
PREEMPT_BLOCK = 16   # the preempt configuration's block size: small, so decode crosses block edges


def variant_config(name: str, chunk: int, prompt: int = 256, output: int = 32) -> dict:
    """One configuration's overrides. ``preempt``: a pool of two prompts' blocks (each with room for
    its first output token, which admission reserves) and one more, so requests that grow past a
    block edge preempt one another (recomputed from their tokens), and never less than one whole
    request needs, so one alone always finishes."""
    pool = max(2 * -(-(prompt + 1) // PREEMPT_BLOCK) + 1, -(-(prompt + output) // PREEMPT_BLOCK) + 1)
    return {
        "batch1": {"scheduler": {"max_num_seqs": 1}},
        "batch256": {"scheduler": {"max_num_seqs": 256}},
        "chunked": {"scheduler": {"max_num_seqs": 256, "enable_chunked_prefill": True,
                                  "max_num_batched_tokens": chunk}},
        "prefix": {"scheduler": {"max_num_seqs": 256}, "cache": {"enable_prefix_caching": True}},
        "preempt": {"scheduler": {"max_num_seqs": 256}, "cache": {"block_size": PREEMPT_BLOCK, "num_blocks": pool}},
        "dp2": {"scheduler": {"max_num_seqs": 256}, "parallel": {"data_parallel_size": 2}},
    }[name]


def as_overrides(tree: dict, prefix: str = "") -> list[str]:
    """A nested override dict as ``--set`` texts (``{"a": {"b": 1}}`` -> ``["a.b=1"]``)."""
    out: list[str] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += as_overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(ref: list, got: list) -> dict:
    """Per-request (tokens, logprobs) pairs against the reference's: how many requests differ in
    tokens, how many in tokens or logprob bits, and the earliest differing token."""
    firsts = [first_difference(a[0], b[0]) for a, b in zip(ref, got)]
    diff = [f for f in firsts if f is not None]
    bits = sum(a != b for a, b in zip(ref, got))
    return {"differ": len(diff), "bits_differ": bits, "of": len(ref), "first_at": min(diff) if diff else None}


def outputs(llm: Any, requests: list) -> list[tuple[list[int], list[float]]]:
    """Per request, in id order: its tokens and their logprobs (whose bits show a difference that has
    not flipped a token yet). A failed request raises."""
    outs = llm.generate(requests, use_tqdm=False)
    failed = [o for o in outs if o.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(outs)} requests failed, e.g. {failed[0].error}")
    return [(list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs or []])
            for o in sorted(outs, key=lambda o: o.id)]


def check_determinism(path: str | None, overrides: tuple[str, ...], requests_for: Callable[[Any], list],
                      build_llm: Callable[[Any], Any], gpu_count: int, echo: Callable[[str], None]) -> dict:
    """Run every configuration of VARIANTS on the config at ``path`` (with ``overrides``) and compare
    each with batch1. ``requests_for(llm)`` builds the workload's requests from an engine (its
    tokenizer and length limit). Returns {variant: row}: compare()'s counts, {"error": ...} for a
    combination the config layer rejects, or {"skipped": why}."""
    base = load_config(path, overrides)
    rows: dict[str, dict] = {}
    ref: list | None = None
    requests: list | None = None
    for name in VARIANTS:
        if name == "dp2" and base.device == "gpu" and gpu_count < 2:
            rows[name] = {"skipped": "needs 2 GPUs"}
            continue
        # batch1 comes first and builds the requests; the pool and chunk sizes follow them
        prompt = max(len(r.prompt_token_ids) for r in requests) if requests else 0
        output = max(r.params.max_tokens for r in requests) if requests else 0
        tree = variant_config(name, max(16, prompt // 4), prompt, output)
        try:
            cfg = load_config(path, tuple(overrides) + tuple(as_overrides(tree)))
        except ConfigError as exc:
            rows[name] = {"error": "; ".join(exc.errors)}
            continue
        llm = build_llm(cfg)
        try:
            if requests is None:
                requests = [dataclasses.replace(r, params=dataclasses.replace(r.params, logprobs=True))
                            for r in requests_for(llm)]
            got = outputs(llm, requests)
            preemptions = llm.stats().num_preemptions if name == "preempt" else None
        finally:
            if hasattr(llm, "close"):
                llm.close()          # data-parallel replicas stop here; the deterministic switch is cleared
        if ref is None:
            ref = got
            rows[name] = {"reference": True, "of": len(got)}
        else:
            rows[name] = compare(ref, got)
            if preemptions is not None:
                rows[name]["preemptions"] = preemptions
        echo(f"check-determinism: {name}: {rows[name]}")
    return rows


def row_text(r: dict) -> str:
    """A compared row in words: requests differing in tokens, the first differing token, preemptions."""
    first = "" if r["first_at"] is None else f" (first at token {r['first_at']})"
    pre = f", {r['preemptions']} preemptions" if "preemptions" in r else ""
    if r.get("preemptions") == 0:   # the pool is small, but requests only ask for blocks at block edges
        pre += f" (none: a longer output_len crosses more {PREEMPT_BLOCK}-token block edges)"
    return f"{r['differ']}/{r['of']}{first}{pre}"


def markdown(rows: dict) -> str:
    lines = ["| configuration | requests whose tokens differ from batch1 | tokens or logprob bits differ |",
             "| --- | --- | --- |"]
    for name, r in rows.items():
        if "reference" in r:
            cells = [f"reference ({r['of']} requests)", "-"]
        elif "skipped" in r:
            cells = [f"skipped: {r['skipped']}", "-"]
        elif "error" in r:
            cells = [f"rejected: {r['error']}", "-"]
        else:
            cells = [row_text(r), f"{r['bits_differ']}/{r['of']}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
