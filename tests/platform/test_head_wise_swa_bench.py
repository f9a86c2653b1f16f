"""The head-wise SWA benchmark's arithmetic and its run records, on a CPU: the seed's KV budget in
blocks, and a tiny two-mode run whose per-run figures agree with each other and whose --report
joins files written by separate calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.dims import ERNIE45_21B_A3B
from benchmarks.harness.swa_modes import SEED_KV_GB, blocks_for_kv_bytes

ROOT = Path(__file__).resolve().parents[2]


def test_the_seed_kv_budget_holds_twelve_32k_rows_of_ernie():
    # bf16 K and V of one token: 28 layers x 4 KV heads x 2 x 128 dims x 2 bytes
    per_token = 28 * 4 * 2 * 128 * 2
    assert per_token == 57344
    blocks = blocks_for_kv_bytes(ERNIE45_21B_A3B, SEED_KV_GB * 1e9, 64)
    assert blocks == int(24e9 // (64 * per_token)) == 6539
    row = -(-(32768 + 128) // 64)          # blocks of one 32k prompt and its output, a head
    assert 12 * row <= blocks < 13 * row
    assert blocks_for_kv_bytes(ERNIE45_21B_A3B, 64 * per_token - 1, 64) == 0


def _bench(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.e2e.head_wise_swa", "--tiny", "--device", "cpu",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_tiny_run_records_agree_and_report_joins_separate_calls(tmp_path):
    common = ["--context", "256", "--window", "64", "--num-blocks", "16", "--requests", "5", "--output", "6",
              "--repeats", "1", "--dir", str(tmp_path / "models")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _bench(*common, "--modes", "uniform_mask", "--json", str(a))
    _bench(*common, "--modes", "headwise_recycle", "--json", str(b))
    for path, mode in ((a, "uniform_mask"), (b, "headwise_recycle")):
        run = json.loads(path.read_text())["rows"][mode]["runs"][0]
        assert abs(run["out_tok_s"] - 5 * 6 / run["seconds"]) < 1e-6 * run["out_tok_s"]
        hist = {int(k): v for k, v in run["decode_steps_by_rows"].items()}
        assert hist and max(hist) == run["peak_concurrent"]
        assert hist[run["peak_concurrent"]][0] == run["full_steps"]
        tokens, seconds = sum(r * n for r, (n, _) in hist.items()), sum(s for _, s in hist.values())
        assert abs(run["decode_tok_s"] - tokens / seconds) < 1e-6 * run["decode_tok_s"]
        assert 0 <= run["bound_decode_tok_s"]
    out = _bench("--report", str(a), str(b))
    assert "Moonshot, recycling on vs uniform_mask" in out
    assert "- uniform_mask: " in out and "- headwise_recycle: " in out
