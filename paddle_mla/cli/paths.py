"""Checks of the files a command will write, run before any model loads (fail before work)."""

from __future__ import annotations

import os
from pathlib import Path


def output_file_problem(path: str, option: str) -> str | None:
    """Why ``path`` cannot be written as a file, in one line (naming ``option``); None when it can."""
    p = Path(path).expanduser()
    if p.is_dir():
        return f"{option} {path} is a directory; give a file path"
    parent = p.parent
    if not parent.exists():
        return f"{option} {path}: the folder {parent} does not exist (create it first)"
    if not parent.is_dir():
        return f"{option} {path}: {parent} is not a folder"
    if p.exists():
        if not os.access(p, os.W_OK):
            return f"{option} {path} exists and is not writable"
    elif not os.access(parent, os.W_OK | os.X_OK):
        return f"{option} {path}: the folder {parent} is not writable"
    return None


def existing_output_problem(path: str, resume: bool, overwrite: bool) -> str | None:
    """An existing non-empty --output is kept unless --resume (append) or --overwrite says otherwise."""
    p = Path(path).expanduser()
    if resume or overwrite or not p.is_file():
        return None
    size = p.stat().st_size
    if size == 0:
        return None
    return (f"--output {path} already exists ({size} bytes); pass --resume to continue it, or --overwrite to "
            "replace it")
