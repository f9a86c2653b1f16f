"""The install path yields compiled ops, and a missing build degrades to the reference with one
warning (docs/architecture.md, "ops").

The README's path is ``pip install -e .`` (ops build on first use into the cache; with
``--no-build-isolation`` setup.py prebuilds them). The first test proves it for the current
runtime: a fresh process with an empty cache folder gets compiled ops from ``load_ops()``, and a
second process loads them from that cache without compiling. It costs one build (~15 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from paddle_mla.platform import runtime
from paddle_mla.ops import build, metadata, reference
from paddle_mla.platform.tensor_api import torch

PROBE = """
import json, time
start = time.perf_counter()
from paddle_mla.platform import runtime
runtime.select()                      # no import selects the runtime (PADDLE_MLA_RUNTIME names it)
from paddle_mla.ops.build import load_ops
from paddle_mla.platform.tensor_api import torch
ops = load_ops()
i32 = lambda v: torch.tensor(v, dtype=torch.int32)
out = None if ops is None else ops.get_position_ids(i32([3, 2]), i32([1, 2]), i32([1, 2]), 8).numpy().tolist()
print("PROBE" + json.dumps({"compiled": ops is not None, "build_seconds": ops and ops.build_seconds,
                            "build_dir": ops and ops.build_dir, "positions": out,
                            "wall": time.perf_counter() - start}))
"""


def run_probe(cache_dir, **env) -> dict:
    full_env = dict(os.environ, PADDLE_MLA_RUNTIME=runtime.name(), PADDLE_MLA_CACHE=str(cache_dir), **env)
    full_env.pop("PADDLE_MLA_DISABLE_CUSTOM_OPS", None)
    # cwd outside the checkout: paddle_mla must come from the installed package, as for a user
    done = subprocess.run([sys.executable, "-c", PROBE], check=False, env=full_env, cwd=cache_dir.parent,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE")][-1]
    return {**json.loads(line[5:]), "stderr": done.stderr}


@pytest.mark.slow
def test_fresh_cache_builds_compiled_ops_then_reuses_them(tmp_path):
    cache = tmp_path / "ops-cache"
    first = run_probe(cache)
    assert first["compiled"], f"load_ops() fell back to the reference in a fresh process:\n{first['stderr'][-3000:]}"
    assert first["positions"] == [1, 2, 3, 2, 3, 0, 0, 0]
    assert first["build_seconds"] > 0 and first["build_dir"].startswith(str(cache))
    assert os.path.basename(first["build_dir"]).startswith(f"{runtime.name()}-")
    print(f"{runtime.name()}: fresh build {first['build_seconds']:.1f} s")

    second = run_probe(cache)
    assert second["compiled"] and second["build_seconds"] == 0, "the second process rebuilt instead of loading"
    assert second["build_dir"] == first["build_dir"]
    assert "paddle_mla custom ops" not in second["stderr"]  # no fallback warning


def _warning_lines(stderr: str) -> list[str]:
    """The lines the fallback warning printed (its first line, and the one under it)."""
    lines = stderr.splitlines()
    at = [i for i, ln in enumerate(lines) if "paddle_mla custom ops" in ln]
    assert len(at) == 1, stderr[-3000:]
    return lines[at[0]: at[0] + 2]


def test_broken_compiler_falls_back_once_and_is_not_retried(tmp_path):
    """A real failing build (the compiler exits 1): a two-line warning naming the log, reference
    results, exit code 0. The next process remembers the failure instead of compiling again."""
    cache = tmp_path / "broken-cache"
    first = run_probe(cache, CC="/bin/false", CXX="/bin/false")
    assert not first["compiled"] and first["positions"] is None
    head, tail = _warning_lines(first["stderr"])
    logs = list(cache.glob("*/build.log"))
    assert len(logs) == 1 and f"log: {logs[0]}" in tail, first["stderr"][-3000:]
    assert "PADDLE_MLA_DISABLE_CUSTOM_OPS=1" in tail and "PADDLE_MLA_OPS_REBUILD=1" in tail
    assert len(head) < 140 and len(tail) < 100 + len(str(logs[0])), (head, tail)
    assert (logs[0].parent / "failed.json").is_file()
    log_after_first = logs[0].read_text()

    second = run_probe(cache, CC="/bin/false", CXX="/bin/false")
    assert not second["compiled"]
    head, tail = _warning_lines(second["stderr"])
    assert "earlier run" in head and f"log: {logs[0]}" in tail
    assert logs[0].read_text() == log_after_first, "the second process ran the compiler again"


@pytest.fixture
def fresh_loader(monkeypatch):
    """A loader that has not run yet in this process (the real state comes back afterwards)."""
    monkeypatch.setattr(build, "_state", build._State())
    return monkeypatch


def _exercise_ops():
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)
    for _ in range(3):
        pos = metadata.get_position_ids(i32([3, 2]), i32([1, 2]), i32([1, 2]), 8)
        _, _, ids = metadata.get_cu_seqlens(i32([3, 2]), i32([1, 2]), 8)
        slots = metadata.compute_slot_mapping(i32([[10, 20], [30, 40]]), ids, pos, 4)
    return pos, slots


def _fallback_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "paddle_mla custom ops" in str(w.message)]


def test_disabled_by_env_is_silent_and_uses_reference(fresh_loader):
    fresh_loader.setenv("PADDLE_MLA_DISABLE_CUSTOM_OPS", "1")
    fresh_loader.setattr(build, "_build_and_load", lambda: pytest.fail("built although disabled"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pos, slots = _exercise_ops()
        assert metadata.implementation() == "reference"
    assert _fallback_warnings(record) == [], "PADDLE_MLA_DISABLE_CUSTOM_OPS=1 must silence the warning"
    assert pos.numpy().tolist() == [1, 2, 3, 2, 3, 0, 0, 0]
    assert slots.numpy().tolist() == [41, 42, 43, 122, 123, -1, -1, -1]
    assert "disabled" in build.unavailable_reason()


def test_build_error_warns_once_and_uses_reference(fresh_loader):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("c++: fatal error: no input files")

    fresh_loader.setattr(build, "_build_and_load", broken)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pos, _ = _exercise_ops()
    msgs = _fallback_warnings(record)
    assert len(msgs) == 1 and "reference" in msgs[0]
    assert "no input files" in build.unavailable_reason()
    assert len(calls) == 1, "a failed build must not be retried on every call"
    expected = reference.get_position_ids(*(torch.tensor(v, dtype=torch.int32) for v in ([3, 2], [1, 2], [1, 2])), 8)
    np.testing.assert_array_equal(pos.numpy(), expected.numpy())


def test_cache_key_follows_sources_and_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_MLA_CACHE", str(tmp_path / "cache"))
    cpu = build.build_dir(runtime.name(), False, [])
    assert cpu.parent == tmp_path / "cache" and cpu == build.build_dir(runtime.name(), False, [])
    assert build.build_dir(runtime.name(), True, []) != cpu
    edited = tmp_path / "custom_ops"
    shutil.copytree(build.sources_dir(), edited)
    monkeypatch.setattr(build, "sources_dir", lambda: edited)
    before = cpu
    for name in build.kernel_sources(edited):   # every kernel source, each header included
        with open(edited / name, "a") as f:
            f.write("// edited\n")
        after = build.build_dir(runtime.name(), False, [])
        assert after != before, f"editing {name} leaves the cache key unchanged"
        before = after
    assert {"mla_decode_fp8.cuh", "mla_paged_keys.cuh", "mla_decode_kernels.cu"} <= set(build.kernel_sources(edited))


def _load_as_new_process(monkeypatch) -> tuple[object, list[warnings.WarningMessage]]:
    monkeypatch.setattr(build, "_state", build._State())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ops = build.load_ops()
    return ops, [w for w in record if "paddle_mla custom ops" in str(w.message)]


def test_failed_build_is_remembered_per_key_until_forced(fresh_loader, tmp_path):
    """The failure memo: later loads skip the compiler until PADDLE_MLA_OPS_REBUILD=1, another C++
    compiler, or another cache key (sources, runtime version, flags) asks for a retry."""
    fresh_loader.setenv("PADDLE_MLA_CACHE", str(tmp_path / "cache"))
    fresh_loader.delenv("PADDLE_MLA_OPS_REBUILD", raising=False)
    fresh_loader.delenv("PADDLE_MLA_DISABLE_CUSTOM_OPS", raising=False)
    compiles = []
    long_command = "c++ -MMD -MF binding.o.d " + " ".join(f"-I/usr/include/dir{i}" for i in range(60))

    def failing_compile(rt, with_cuda, arch, out):
        compiles.append(out)
        raise RuntimeError(f"Error building extension 'paddle_mla_ops': [1/2] {long_command}\nFAILED: binding.o")

    fresh_loader.setattr(build, "_compile", failing_compile)
    ops, warned = _load_as_new_process(fresh_loader)
    assert ops is None and len(compiles) == 1 and len(warned) == 1
    out = compiles[0]
    memo = json.loads((out / "failed.json").read_text())
    assert memo["compiler"] == build.compiler_id() and "Error building extension" in memo["error"]
    assert long_command in (out / "build.log").read_text(), "the full error belongs in the log"

    # The warning as Python prints it: two short lines, the log path, no compiler command.
    w = warned[0]
    shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line).rstrip("\n").splitlines()
    assert len(shown) == 2, shown
    assert f"log: {out / 'build.log'}" in shown[1] and "PADDLE_MLA_DISABLE_CUSTOM_OPS=1" in shown[1]
    assert "-MMD" not in "\n".join(shown) and len(shown[0]) < 140

    ops, warned = _load_as_new_process(fresh_loader)
    assert ops is None and len(compiles) == 1, "a remembered failure was compiled again"
    assert len(warned) == 1 and "earlier run" in str(warned[0].message)
    assert "Error building extension" in build.unavailable_reason()

    fresh_loader.setenv("PADDLE_MLA_OPS_REBUILD", "1")
    _load_as_new_process(fresh_loader)
    assert len(compiles) == 2
    fresh_loader.delenv("PADDLE_MLA_OPS_REBUILD")
    _load_as_new_process(fresh_loader)
    assert len(compiles) == 2

    fresh_loader.setenv("CXX", "/bin/true")  # another compiler is worth a retry
    _load_as_new_process(fresh_loader)
    assert len(compiles) == 3
    _load_as_new_process(fresh_loader)
    assert len(compiles) == 3

    edited = tmp_path / "custom_ops"  # edited sources: another cache key, so a fresh attempt
    shutil.copytree(build.sources_dir(), edited)
    with open(edited / "metadata_cpu.h", "a") as f:
        f.write("// edited\n")
    fresh_loader.setattr(build, "sources_dir", lambda: edited)
    _load_as_new_process(fresh_loader)
    assert len(compiles) == 4 and compiles[3] != out
