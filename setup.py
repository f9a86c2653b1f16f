"""Package setup. The custom-op build lives in paddle_mla/ops/build.py and runs on first use into a
cache folder. Installing with a runtime visible (``pip install -e . --no-build-isolation``) also
prebuilds the ops here, once per importable runtime, so that the cache is warm; under pip's build
isolation no runtime is importable and this step is skipped silently. A failed prebuild never fails
the install: like any failed build it is remembered in the cache folder and the reference runs
(PADDLE_MLA_OPS_REBUILD=1 retries; see paddle_mla/ops/build.py).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PREBUILD = "import sys; from paddle_mla.ops.build import main; sys.exit(main())"


def prebuild_ops() -> None:
    if os.environ.get("PADDLE_MLA_DISABLE_CUSTOM_OPS", "0") not in ("", "0"):
        return
    for rt in ("paddle", "torch"):
        if importlib.util.find_spec(rt) is None:
            continue
        env = dict(os.environ, PADDLE_MLA_RUNTIME=rt, PYTHONPATH=os.pathsep.join(filter(None, [
            str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            done = subprocess.run([sys.executable, "-c", PREBUILD], check=False, env=env, cwd=ROOT, timeout=1800,
                                  capture_output=True, text=True)
            lines = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()
            print(lines[-1])
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"paddle_mla: skipped prebuilding the {rt} custom ops: {exc}")


class BuildPyWithOps(build_py):
    """Also ships custom_ops/ inside the package (for non-editable installs) and prebuilds the ops."""

    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "paddle_mla" / "_custom_ops"
            shutil.copytree(ROOT / "custom_ops", target, dirs_exist_ok=True)
        prebuild_ops()


setup(cmdclass={"build_py": BuildPyWithOps})
