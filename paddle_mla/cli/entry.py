"""The program's entry point (the ``paddle-mla`` script and ``python -m paddle_mla``).

It takes over SIGINT before importing anything else (the click app, yaml, the config schema), so
a Ctrl-C at any moment of start-up reaches the command as an interrupt (``interrupts``), never as
a traceback from half an import.
"""

from __future__ import annotations

import os
import sys

from paddle_mla.cli import interrupts

EXIT_INTERRUPTED = 130


def entry(prog_name: str | None = None) -> None:
    """Run the CLI. An interrupted run leaves at once with 130 once its output and summary are
    written: the interpreter's own teardown (joining the loader's worker threads, finalisers) can
    meet the same SIGINT again and end the process by the signal (-2) instead of the documented
    code. A run that finished keeps its own exit code if a SIGINT lands in that teardown."""
    interrupts.install()
    interrupts.install_import_pause()
    try:
        from paddle_mla.cli.app import main

        main(prog_name=prog_name)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        if isinstance(exc.code, int):
            interrupts.exit_on_sigint(exc.code)
            interrupts.pause_point("exit")
        raise
