"""scripts/test.sh (the README's test command): a test file that fails to import is reported as an
error, the other files of that runtime still run, both runtimes always run, and the run ends with
one result line per runtime and a non-zero exit. Runs once, in the torch pass."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from paddle_mla.platform import runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(runtime.name() != "torch", reason="runs once, in the torch pass")
def test_a_collection_error_hides_no_results(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_broken.py").write_text("import module_that_does_not_exist_anywhere\n")
    (suite / "test_fine.py").write_text("def test_fine():\n    assert sum([1, 2]) == 3\n")
    env = dict(os.environ, PADDLE_MLA_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), str(suite)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    assert len(re.findall(r"ERROR collecting \S*test_broken\.py", out)) == 2, out[-3000:]
    summary = out.split("=== summary\n", 1)[1].splitlines()
    assert [ln.split()[0] for ln in summary] == ["torch", "paddle"], out[-3000:]
    for line in summary:
        assert "FAILED (pytest exit 1)" in line and "1 passed, 1 error" in line, line
