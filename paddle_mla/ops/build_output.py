"""Where a custom-op build's output goes: the compiler's chatter into build.log, the framework's INFO
lines nowhere, so a user sees two short lines on failure and nothing on success."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def output_to(log: Path | None):
    """Send this process's stdout/stderr (fd level: compiler subprocesses too) to ``log``."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def logging_off():
    """Paddle logs an INFO line per loaded library through its own handlers."""
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.INFO))
    try:
        yield
    finally:
        logging.disable(previous)
