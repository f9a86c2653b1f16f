"""The Python sources keep to the project's size rules: no line over 120 characters (pyproject's
``[tool.ruff] line-length``) and no file over 400 lines (CONTRIBUTING.md). Pure Python, no ruff and no
tensor runtime, so it runs under both runtimes. A failure lists every ``path:line (length)`` to fix."""

from __future__ import annotations

import functools
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("paddle_mla", "benchmarks", "tests", "scripts", "examples")
MAX_LINE_CHARS = 120
MAX_FILE_LINES = 400
# fetched or generated trees, not the project's own code (hidden folders such as .ab_base and
# .cache are skipped too)
SKIP_DIRS = {"third_party", "build", "dist", "__pycache__"}


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in SKIP_DIRS or name.endswith(".egg-info")


@functools.cache   # one walk for the three tests
def _sources() -> tuple[Path, ...]:
    files = []
    for top in SOURCE_DIRS:
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = sorted(d for d in dirs if not _skipped(d))
            files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    return tuple(files)


def _lines(path: Path) -> list[str]:
    # universal newlines: a line's length never counts its "\n" or "\r\n"
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def test_the_walk_finds_the_sources():
    found = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"paddle_mla/__init__.py", "tests/unit/test_source_lines.py"} <= found


def test_no_line_over_the_limit():
    long = [f"{p.relative_to(ROOT).as_posix()}:{i} ({len(line)})"
            for p in _sources() for i, line in enumerate(_lines(p), 1) if len(line) > MAX_LINE_CHARS]
    assert not long, (f"{len(long)} line(s) over {MAX_LINE_CHARS} characters; wrap them inside their brackets "
                      "or split the string/comment:\n  " + "\n  ".join(long))


def test_no_file_over_the_limit():
    big = [f"{p.relative_to(ROOT).as_posix()} ({n} lines)"
           for p in _sources() if (n := len(_lines(p))) > MAX_FILE_LINES]
    assert not big, (f"{len(big)} file(s) over {MAX_FILE_LINES} lines; split them by what they do:\n  "
                     + "\n  ".join(big))
