"""Kill `paddle-mla generate` with SIGKILL at random moments, resume, repeat until it finishes:
every id must appear exactly once and the output must equal an uninterrupted run (greedy)."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers.cli_harness import ENGINES, ROOT, read_jsonl

from paddle_mla.platform import runtime

TESTS = ROOT / "tests"


def _command(engine, args):
    if engine == "fake":
        return [sys.executable, str(TESTS / "helpers" / "fake_llm.py"), *args]
    return [sys.executable, "-m", "paddle_mla.cli.app", *args]


def _input(path, n=40):
    lines = []
    for i in range(n):
        if i % 13 == 5:
            lines.append(json.dumps({"id": f"bad-{i}", "prompt": "x", "top_p": 9}))      # an error line
        elif i % 11 == 3:
            lines.append(json.dumps({"prompt": f"no id {i}"}))                  # keyed by line number
        else:
            lines.append(json.dumps({"id": f"r{i}", "prompt": f"Request number {i}: " + "abc " * (i % 7)}))
    path.write_text("\n".join(lines) + "\n")
    return lines


def _lines_in(path):
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_sigkill_and_resume_gives_every_id_once(engine, tmp_path):
    inp = tmp_path / "in.jsonl"
    lines = _input(inp)
    # PYTHONPATH: this checkout's paddle_mla, whatever an editable install points at
    env = dict(os.environ, PADDLE_MLA_RUNTIME=runtime.name(), FAKE_LLM_DELAY_S="0.004", PYTHONPATH=str(ROOT))
    # few sequences at a time, so requests finish in waves and kills land between and inside them
    base = ["generate", "-i", str(inp), "--no-progress", "--set", "sampling.max_tokens=4",
            "--set", "scheduler.max_num_seqs=4"]
    ref = tmp_path / "ref.jsonl"
    done = subprocess.run(_command(engine, [*base, "-o", str(ref)]), env=env, capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 3, done.stderr.decode()[-2000:]

    out = tmp_path / "out.jsonl"
    rng = random.Random(1234)
    kills = 0
    for attempt in range(12):
        proc = subprocess.Popen(_command(engine, [*base, "-o", str(out), "--resume"]), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if attempt < 5:          # kill after a random number of new lines, a random few ms later
            target = _lines_in(out) + rng.randint(1, 8)
            deadline = time.monotonic() + 60
            while proc.poll() is None and _lines_in(out) < target and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        _, err = proc.communicate(timeout=120)
        if proc.returncode in (0, 3):
            break
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    else:
        pytest.fail("generate never finished")
    assert kills >= 3
    got, want = read_jsonl(out), read_jsonl(ref)
    assert len(got) == len(lines)
    keys = [r.get("id") if r.get("id") is not None else ("line", r["line"]) for r in got]
    assert len(set(keys)) == len(keys)
    assert got == want
