"""The benchmarks package (repo root, not installed) on a CPU: every script answers ``--help`` through
``python -m benchmarks.<group>.<name>``, every shared module imports once a runtime is selected, and
the import rules that keep it free of cycles hold (no sys.path edits; a script imports the harness and
its own helper module, never another script; the harness imports no script)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
GROUPS = ("kernels", "e2e", "profile")
# a script's helper module (not a script itself: no __main__), imported by that script only
HELPERS = {"benchmarks.e2e.chunked_itl_profile": "benchmarks.e2e.chunked_itl",
           "benchmarks.e2e.tp_profile": "benchmarks.e2e.tensor_parallel"}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _modules() -> list[str]:
    return sorted(_module(p) for p in BENCH.rglob("*.py") if p.name != "__init__.py")


def _is_script(module: str) -> bool:
    return "__name__ == \"__main__\"" in (ROOT / Path(*module.split("."))).with_suffix(".py").read_text()


SCRIPTS = [m for m in _modules() if _is_script(m)]
LIBRARIES = [m for m in _modules() if not _is_script(m)]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def _benchmark_imports(module: str) -> set[str]:
    """Every benchmarks.* module ``module`` imports, at any depth of its code."""
    tree = ast.parse((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("benchmarks.") and m in _modules()}


def test_every_group_has_scripts_and_the_layout_is_complete():
    for group in GROUPS:
        assert any(m.startswith(f"benchmarks.{group}.") for m in SCRIPTS), group
    assert "benchmarks.harness.timing" in LIBRARIES and "benchmarks.harness.dims" in LIBRARIES
    assert set(LIBRARIES) - set(HELPERS) == {m for m in LIBRARIES if m.startswith("benchmarks.harness.")}


@pytest.mark.parametrize("module", SCRIPTS)
def test_script_help_runs_on_cpu(module):
    done = _run(["-m", module, "--help"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]


def test_shared_modules_import_once_a_runtime_is_selected():
    code = ("from paddle_mla.platform import runtime\nruntime.select('torch')\nimport importlib\n"
            + "".join(f"importlib.import_module({m!r})\n" for m in LIBRARIES) + "print('imported', flush=True)\n")
    done = _run(["-c", code])
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


def test_no_sys_path_edits_and_no_script_imports_another_script():
    for module in _modules():
        source = (ROOT / Path(*module.split("."))).with_suffix(".py").read_text()
        assert "sys.path" not in source.replace("sys.path is untouched", ""), module
        imported = _benchmark_imports(module)
        if module.startswith("benchmarks.harness."):
            assert all(m.startswith("benchmarks.harness.") for m in imported), (module, imported)
        else:
            others = {m for m in imported if not m.startswith("benchmarks.harness.")}
            assert all(HELPERS.get(m) == module for m in others), (module, others)


def test_kernel_profile_categories_and_phase_split():
    """The profile tables' arithmetic (what ``benchmarks.e2e.determinism --profile`` prints): kernel
    names fall in their categories, and one decode step is (whole run - prefill) / decode steps."""
    code = ("from paddle_mla.platform import runtime\nruntime.select('torch')\n"
            "from benchmarks.harness.kernel_profile import categorize, phase_split\n"
            "assert categorize('void paddle_mla::attn::decode_mma_kernel<__nv_bfloat16, 128, 2>"
            "(paddle_mla::AppendAttentionArgs, int, int, float*, float*)') == 'attn: GQA append_attention'\n"
            "assert categorize('_decode_stage1') == 'attn: MLA decode (split-KV)'\n"
            "assert categorize('grouped_gemm_kernel') == 'MoE: grouped GEMM'\n"
            "s = phase_split({'a': 10.0, 'b': 1.0}, {'a': 40.0, 'b': 1.0, 'c': 6.0}, 3)\n"
            "assert s['prefill'] == {'a': 10.0, 'b': 1.0}\n"
            "assert s['decode_step'] == {'a': 10.0, 'b': 0.0, 'c': 2.0}, s\n"
            "print('ok', flush=True)\n")
    done = _run(["-c", code])
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
