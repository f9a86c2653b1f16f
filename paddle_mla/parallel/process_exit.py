"""How a child process ended, in words, and what a user does next: shared by the tensor-parallel
launcher (workers) and the data-parallel parent (replicas). No tensor library is imported here."""

from __future__ import annotations

import signal

RESUME_HINT = "the output written so far is intact: rerun with --resume"


def describe_exit(exitcode: int | None) -> str:
    """``multiprocessing``'s exit code as a phrase: None (still running) means its pipe closed."""
    if exitcode is None:
        return "closed its pipe"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
