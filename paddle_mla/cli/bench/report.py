"""Bench output: a markdown table (ratios to the first config), the JSON document, a PNG plot."""

from __future__ import annotations

import datetime as _dt
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from paddle_mla.cli.bench.runner import ConfigResult
from paddle_mla.cli.bench.workloads import Workload

SCHEMA_VERSION = 1


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _with_ratio(res: ConfigResult, key: str, first: bool, digits: int = 1) -> str:
    text = _fmt(res.summary[key], digits)
    return text if first else f"{text} ({_fmt(res.ratio_to_first.get(key, float('nan')), 2)}x)"


def markdown_table(results: list[ConfigResult]) -> str:
    head = ["config", "req/s", "out tok/s", "total tok/s", "TTFT p50 ms", "TPOT p50 ms",
            "ITL p50/p90/p99 ms", "prefix hit", "peak blocks", "preempt", "errors"]
    rows = []
    for i, r in enumerate(results):
        s = r.summary
        rows.append([
            r.spec.name,
            _with_ratio(r, "requests_per_s", i == 0, 2),
            _with_ratio(r, "output_tokens_per_s", i == 0),
            _with_ratio(r, "total_tokens_per_s", i == 0),
            _with_ratio(r, "ttft_ms_p50", i == 0, 2),
            _with_ratio(r, "tpot_ms_p50", i == 0, 2),
            "/".join(_fmt(s[f"itl_ms_p{q}"], 2) for q in (50, 90, 99)),
            f"{100 * s['prefix_cache_hit_rate']:.1f}%",
            f"{int(s['peak_blocks_used'])}/{int(s['num_blocks'])}",
            _fmt(s["num_preemptions_mean"], 1),
            str(int(s["errors"])),
        ])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def bench_document(results: list[ConfigResult], workload: Workload, *, repeats: int, warmup_requests: int,
                   engines: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``runs``: per config, what ran (run_info.RunInfo.to_dict: runtime, version, device, dtype,
    resolved backend, model and its folder)."""
    from paddle_mla import __version__

    def clean(d: dict[str, Any]) -> dict[str, Any]:   # NaN is not JSON
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    return {
        "schema_version": SCHEMA_VERSION,
        "paddle_mla_version": __version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "runtime": runs[0]["runtime"],
        "runtime_version": runs[0]["runtime_version"],
        "device": runs[0]["device"],
        "device_name": runs[0]["device_name"],
        "workload": workload.to_dict(),
        "repeats": repeats,
        "warmup_requests": warmup_requests,
        "engines": engines,
        "configs": [
            {
                "name": r.spec.name,
                "path": r.spec.path,
                "config": r.spec.config.to_dict(),
                "run": run,
                "summary": clean(r.summary),
                "ratio_to_first": clean(r.ratio_to_first),
                "runs": [run.public() for run in r.runs],
            }
            for r, run in zip(results, runs)
        ],
    }


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def check_matplotlib() -> None:
    """Raise ImportError with an install hint when matplotlib is missing (checked before running)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'paddle-mla[plot]' "
                          "(or pip install matplotlib)") from None


def plot_title(text: str, width: int) -> str:
    """``text`` in lines of at most ``width`` characters, broken at spaces and after commas, never
    inside a word: a workload spec (``kind:k=v,k=v,...``) is one long comma-joined token, which
    textwrap would otherwise cut mid-word. A single word longer than ``width`` stays whole."""
    return textwrap.fill(text.replace(",", ", "), width, break_long_words=False, break_on_hyphens=False)


def _title_width(fig_width_in: float, fontsize: float) -> int:
    """Characters that fit across the figure: 72 points an inch, about 0.6 em a character."""
    return max(20, int(fig_width_in * 72 / (0.6 * fontsize)) - 4)


def write_plot(results: list[ConfigResult], title: str, path: str | Path) -> None:
    check_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.spec.name for r in results]
    x = range(len(results))
    fig_width = max(8, 2.2 * len(results) + 4)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(fig_width, 4.2))
    tput = [r.summary["output_tokens_per_s"] for r in results]
    err = [r.summary["output_tokens_per_s_std"] for r in results]
    bars = ax1.bar(x, tput, yerr=err, capsize=4, color="#4C72B0")
    for b, r in zip(bars, results):
        ax1.annotate(f"{r.ratio_to_first['output_tokens_per_s']:.2f}x",
                     (b.get_x() + b.get_width() / 2, b.get_height() / 2), ha="center", va="center", fontsize=9,
                     color="white", fontweight="bold")
    ax1.set_xticks(list(x), names, rotation=20, ha="right")
    ax1.set_ylabel("output tokens/s (mean ± std over repeats)")
    ax1.set_title("throughput")
    metrics = [("ttft_ms_p50", "TTFT p50"), ("tpot_ms_p50", "TPOT p50"), ("itl_ms_p50", "ITL p50"),
               ("itl_ms_p99", "ITL p99")]
    width = 0.8 / len(metrics)
    for j, (key, label) in enumerate(metrics):
        vals = [r.summary[key] if not math.isnan(r.summary[key]) else 0.0 for r in results]
        ax2.bar([i + (j - (len(metrics) - 1) / 2) * width for i in x], vals, width, label=label)
    ax2.set_xticks(list(x), names, rotation=20, ha="right")
    ax2.set_ylabel("ms")
    ax2.set_title("latency")
    ax2.legend(fontsize=8)
    fig.suptitle(plot_title(title, _title_width(fig_width, 8)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
