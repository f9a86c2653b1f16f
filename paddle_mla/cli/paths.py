"""Checks of the paths a command reads and writes, run before any model loads (fail before work)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from paddle_mla.batch.io import os_error_text


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


def input_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as --input, in one line; None when it can. A FIFO or a character
    device (``-i <(cmd)``, ``/dev/stdin``) is read as a stream, once, as stdin is."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return f"--input {path} does not exist"
    except OSError as exc:
        return f"--input {path} cannot be read: {os_error_text(exc)}"
    if stat.S_ISDIR(mode):
        return f"--input {path} is a directory; give a JSONL file"
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        return f"--input {path} is not a file, a pipe or a character device"
    return None


def is_regular_file(path: str) -> bool:
    """Whether ``path`` can be read twice (counted for the progress bar, then run): a pipe cannot."""
    return Path(path).is_file()


def nonempty_folder_problem(path: str, force: bool) -> str | None:
    """A folder that already holds files is not written into without ``--force`` (it may hold a
    checkpoint someone needs); None when it may be written."""
    p = Path(path).expanduser()
    if force or not p.is_dir() or next(p.iterdir(), None) is None:
        return None
    return f"{path} exists and is not empty; pass --force to write the tiny checkpoint into it anyway"
