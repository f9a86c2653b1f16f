"""Run GPU test files as N pytest processes side by side, for one time-limited device call.

The GQA GPU tests spend most of their time in the C++ op's CPU side of each comparison (single-threaded),
so one process runs far longer than a device call allows; the GPU machine has 16 cores. The collected test
ids are grouped (the tensor-core decode cases that share one cached C++ answer stay in one process), the
heavy groups spread first, and each shard runs under its own time limit. Prints each shard's summary line
and the totals; the full logs go to --log. Exit status 1 if any shard failed, errored or ran out of time.

    python3 scripts/pytest_shards.py -n 14 --timeout 200 --log $OUT/tests_full.txt -- -m gpu tests/test_a.py ...
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time

# Tensor-core decode variants of one case share the C++ op's answer (cached per process): one group.
VARIANT = re.compile(r"-(tc|mma3|wmma|tc32|cudacore)\]$")


def cost(test_id: str) -> float:
    """A rough weight: the production-shape comparisons and the engine tests are the slow ones."""
    if "h32x8d128" in test_id:
        return 12.0 if ("decode" in test_id or "long_prefill" in test_id) else 3.0
    if "engine" in test_id or "oracle" in test_id or "native" in test_id:
        return 6.0
    return 4.0 if ("h12x4d80" in test_id and "float32" not in test_id) else 2.0


def shards(ids: list[str], n: int) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for i in ids:
        groups.setdefault(VARIANT.sub("]", i), []).append(i)
    load, out = [0.0] * n, [[] for _ in range(n)]
    for key in sorted(groups, key=cost, reverse=True):
        j = load.index(min(load))
        load[j] += cost(key) + 0.3 * len(groups[key])
        out[j] += groups[key]
    return [s for s in out if s]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=14)
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds per shard")
    ap.add_argument("--log", default=None, help="file for every shard's full output")
    ap.add_argument("pytest_args", nargs="+", help="after --: marker options and test files")
    args = ap.parse_args()
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    listing = subprocess.run(base + ["--collect-only", "-q", *args.pytest_args], capture_output=True, text=True)
    ids = [line.strip() for line in listing.stdout.splitlines() if "::" in line]
    parts = shards(ids, args.n)
    print(f"{len(ids)} tests in {len(parts)} shards, {args.timeout:.0f} s each", flush=True)
    opts = [a for a in args.pytest_args if not (a.endswith(".py") or "::" in a)]   # options (-m gpu), not files
    logs, procs, start = [], [], time.time()
    for part in parts:
        log = tempfile.TemporaryFile(mode="w+")
        procs.append(subprocess.Popen(base + ["-q", "-rfE", *opts, *part], stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    bad = 0
    for j, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, args.timeout - (time.time() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        logs[j].seek(0)
        text = logs[j].read()
        summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
        failed = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))]
        status = "timed out" if p.returncode in (-9, -15) else f"rc {p.returncode}"
        bad += p.returncode != 0
        print(f"shard {j} ({len(parts[j])} tests, {status}): {summary[-1] if summary else 'no summary'}", flush=True)
        for line in failed:
            print("   ", line)
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"##### shard {j}\n{text}\n")
    print(f"all shards done in {time.time() - start:.0f} s; {bad} shard(s) not green")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
