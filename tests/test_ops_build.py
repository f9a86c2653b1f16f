"""The install path yields compiled ops, and a missing build degrades to the reference with one
warning (ARCHITECTURE section 3).

The README's path is ``pip install -e .`` (ops build on first use into the cache; with
``--no-build-isolation`` setup.py prebuilds them). The first test proves it for the current
runtime: a fresh process with an empty cache folder gets compiled ops from ``load_ops()``, and a
second process loads them from that cache without compiling. It costs one build (~15 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from paddle_mla import runtime
from paddle_mla.ops import build, metadata, reference
from paddle_mla.tensor_api import torch

PROBE = """
import json, time
start = time.perf_counter()
from paddle_mla.ops.build import load_ops
from paddle_mla.tensor_api import torch
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


def test_broken_compiler_falls_back_in_a_fresh_process(tmp_path):
    """A real failing build (the compiler exits 1): one warning, reference results, exit code 0."""
    result = run_probe(tmp_path / "broken-cache", CC="/bin/false", CXX="/bin/false")
    assert not result["compiled"] and result["positions"] is None
    assert result["stderr"].count("paddle_mla custom ops unavailable") == 1, result["stderr"][-3000:]
    assert "build.log" in result["stderr"]


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


def test_disabled_by_env_warns_once_and_uses_reference(fresh_loader):
    fresh_loader.setenv("PADDLE_MLA_DISABLE_CUSTOM_OPS", "1")
    fresh_loader.setattr(build, "_build_and_load", lambda: pytest.fail("built although disabled"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pos, slots = _exercise_ops()
        assert metadata.implementation() == "reference"
    msgs = _fallback_warnings(record)
    assert len(msgs) == 1 and "PADDLE_MLA_DISABLE_CUSTOM_OPS" in msgs[0]
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
    assert len(msgs) == 1 and "no input files" in msgs[0] and "reference" in msgs[0]
    assert len(calls) == 1, "a failed build must not be retried on every call"
    expected = reference.get_position_ids(*(torch.tensor(v, dtype=torch.int32) for v in ([3, 2], [1, 2], [1, 2])), 8)
    np.testing.assert_array_equal(pos.numpy(), expected.numpy())


def test_cache_key_follows_sources_and_cuda(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("PADDLE_MLA_CACHE", str(tmp_path / "cache"))
    cpu = build.build_dir(runtime.name(), False, [])
    assert cpu.parent == tmp_path / "cache" and cpu == build.build_dir(runtime.name(), False, [])
    assert build.build_dir(runtime.name(), True, []) != cpu
    edited = tmp_path / "custom_ops"
    shutil.copytree(build.sources_dir(), edited)
    with open(edited / "metadata_cpu.h", "a") as f:
        f.write("// edited\n")
    monkeypatch.setattr(build, "sources_dir", lambda: edited)
    assert build.build_dir(runtime.name(), False, []) != cpu
