"""Package setup. The custom-op build lives in paddle_mla/ops/build.py (owned there) and is
invoked here when a runtime is importable (pip install --no-build-isolation); otherwise the ops
are compiled on first use into a cache folder."""

from setuptools import setup

setup()
