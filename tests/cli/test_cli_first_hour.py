"""What a new user meets in the first hour: every help says its exit codes and its examples run
as written, every attention backend has a config and every YAML under configs/ validates, the
progress bar states its rate once, and the bench plot title breaks between words."""

import io
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from helpers.cli_harness import ROOT, invoke

from paddle_mla.cli.bench.report import plot_title
from paddle_mla.cli.bench.workloads import is_workload_file, parse_workload
from paddle_mla.config.backends import BACKEND_CAPS
from paddle_mla.config.schema import load_config

COMMANDS = [[], ["generate"], ["bench"], ["validate"], ["make-tiny-model"]]
ALL_YAML = sorted((ROOT / "configs").rglob("*.yaml"))


def _help(cmd: list[str]) -> str:
    res = invoke([*cmd, "--help"])
    assert res.exit_code == 0
    return res.stdout


def _examples(text: str) -> list[str]:
    """The example command lines of a help text (continuation lines joined)."""
    lines, out = text.split("Examples:", 1)[1].splitlines()[1:], []
    for line in lines:
        line = line.strip()
        if not line:
            break
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    assert out, text
    return out


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0] if c else "main")
def test_every_help_lists_its_exit_codes(cmd):
    text = _help(cmd)
    codes = text.split("Exit codes", 1)[-1]
    assert all(re.search(rf"^\s+{code}\s+\w", codes, re.M) for code in (0, 2, 130)), text
    assert re.search(r"^\s+2\s.*bad arguments", codes, re.M), text


def test_every_path_and_workload_named_in_an_example_exists():
    """Examples name shipped files (configs/...) and workload specs: those must exist and parse."""
    for cmd in COMMANDS:
        for example in _examples(_help(cmd)):
            words = shlex.split(example)
            for word in words:
                path = word.split("#")[0]
                if path.startswith("configs/") and "*" not in path:
                    assert (ROOT / path).is_file(), example
            for flag, value in zip(words, words[1:]):
                if flag == "--workload":
                    parse_workload(str(ROOT / value) if value.startswith("configs/") else value)


def test_the_validate_example_runs_as_written():
    (example,) = [e for e in _examples(_help(["validate"])) if "configs/bench/*.yaml" in e]
    assert example == "paddle-mla validate configs/*.yaml configs/bench/*.yaml"
    command = example.replace("paddle-mla", f"{shlex.quote(sys.executable)} -m paddle_mla", 1)
    res = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    docs = list(yaml.safe_load_all(res.stdout))
    assert len(docs) == (len(list((ROOT / "configs").glob("*.yaml")))
                         + len(list((ROOT / "configs/bench").glob("*.yaml"))))
    assert "# configs/bench/workloads.yaml (bench workloads)" in res.stdout
    workloads = docs[-1]                 # workloads.yaml sorts last in configs/bench
    assert workloads["smoke"] == {"kind": "shared-prefix", **parse_workload(
        f"{ROOT}/configs/bench/workloads.yaml#smoke").params}


def test_every_yaml_under_configs_validates():
    res = invoke(["validate", *map(str, ALL_YAML)])
    assert res.exit_code == 0, res.stderr
    assert len(list(yaml.safe_load_all(res.stdout))) == len(ALL_YAML)


def test_every_attention_backend_has_a_config():
    backends = {load_config(p).attention.backend for p in (ROOT / "configs").glob("*.yaml")}
    assert set(BACKEND_CAPS) <= backends, f"no config for {sorted(set(BACKEND_CAPS) - backends)}"


def test_a_workload_file_is_told_from_a_config(tmp_path):
    assert is_workload_file(ROOT / "configs/bench/workloads.yaml")
    assert not any(is_workload_file(p) for p in ALL_YAML if p.name != "workloads.yaml")
    one = tmp_path / "one.yaml"
    one.write_text("kind: random\nnum_prompts: 3\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a:\n  kind: random\n  num_prompt: 3\nb:\n  kind: zipf\n")
    res = invoke(["validate", str(one)])
    assert res.exit_code == 0 and yaml.safe_load(res.stdout) == {"random": {"kind": "random", **parse_workload(
        "random:num_prompts=3").params}}
    res = invoke(["validate", str(bad), str(one)])
    assert res.exit_code == 2 and f"{bad}: 2 errors" in res.stderr
    assert "'num_prompt'" in res.stderr and "'zipf'" in res.stderr and "# " + str(one) in res.stdout
    # --set does not apply to a workload file: said, and its keys are still checked
    res = invoke(["validate", str(one), "--set", "scheduler.max_num_seq=4"])
    assert res.exit_code == 2 and "--set: 1 error" in res.stderr and "did you mean" in res.stderr
    assert f"--set applies to config files, not to the workload file {one}" in res.stderr


def test_the_generate_help_says_what_happens_to_blank_lines(tmp_path, monkeypatch):
    text = " ".join(_help(["generate"]).split())
    sentence = ("Blank lines (nothing but spaces, tabs, carriage returns or form feeds) are skipped: they get no "
                'output line and no count in the progress bar or summary, but line numbers ("line": N) count them, '
                "as an editor does.")
    assert sentence in text
    inp = tmp_path / "in.jsonl"    # and that is what happens
    inp.write_bytes(b'{"id": "a", "prompt": "x", "max_tokens": 1}\n\n \t\r\n{"prompt": "y", "max_tokens": 1}\n'
                    b"\x0c\n{\n")
    out, summary = tmp_path / "out.jsonl", tmp_path / "s.json"
    res = invoke(["generate", "-i", str(inp), "-o", str(out), "--summary", str(summary), "--no-progress"],
                 "fake", monkeypatch)
    assert res.exit_code == 3, res.stderr
    records = [yaml.safe_load(line) for line in out.read_text().splitlines()]
    assert [r.get("line") for r in records] == [None, 4, 6] and records[2]["error"]["type"] == "invalid_json"
    assert yaml.safe_load(summary.read_text())["requests"] == 3


@pytest.mark.parametrize("total", [None, 4])
def test_the_progress_bar_states_its_rate_once(total, monkeypatch):
    from paddle_mla.batch.run import BatchSummary, _Progress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = _Progress(total, 0, True)
    summary = BatchSummary()
    for _ in range(3):
        summary.requests += 1
        summary.completion_tokens += 4
        bar.update(summary)
    bar.close()
    last = err.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert last.count("req/s") == 1 and "s/req" not in last and last.count("out tok/s") == 1, last
    assert ("3/4" if total else "3 req") in last, last


def test_the_plot_title_breaks_between_words():
    spec = parse_workload("shared-prefix:num_prompts=64,prefix_len=256,suffix_len=32,output_len=32").describe()
    title = f"{spec} | torch cpu | 3 repeats"
    for width in (30, 50, 116):
        lines = plot_title(title, width).splitlines()
        assert all(len(line) <= width for line in lines), lines
        words = " ".join(lines).replace(", ", ",").split()
        assert words == title.split(), lines        # every word whole, in order
    assert len(plot_title(title, 50).splitlines()) > 1
