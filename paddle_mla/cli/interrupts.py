"""SIGINT from the first instant of a CLI run to its end: exit 130, no traceback, and ``generate``
still writes its ``--summary``.

Two facts shape this module (standard library only, so the entry point installs it before any
other import):

- Until a command has parsed its options it does not know where its summary goes, so a SIGINT
  that early is *deferred*: recorded, and raised as KeyboardInterrupt when the command calls
  ``arm()`` (a fraction of a second later, before any slow work). Once armed, SIGINT raises at
  once, as Python's own handler does, so a long model load stops promptly.
- A KeyboardInterrupt raised inside an import does not always arrive as one: the importing
  library may turn it into an ImportError, or a later import meets a partially-initialised
  module. ``received()`` lets a command treat whatever exception follows a SIGINT as the
  interrupt it is.

Test hook: ``PADDLE_MLA_TEST_PAUSE_AT=POINT`` makes the run sleep at the named start-up point
(``pause_point``), and ``PADDLE_MLA_TEST_PAUSE_AT=import:MODULE`` inside the import of MODULE, so
a test can send SIGINT exactly there. Unset, it costs one environment lookup per point.
"""

from __future__ import annotations

import os
import signal
import sys
import time

PAUSE_ENV = "PADDLE_MLA_TEST_PAUSE_AT"
PAUSE_ANNOUNCEMENT = "paddle-mla test hook: paused at "
_PAUSE_S = 120.0


class _SigintState:
    # a plain class: this module is imported before anything else, so it imports as little as it can
    __slots__ = ("installed", "armed", "received")

    def __init__(self) -> None:
        self.installed = False
        self.armed = False         # raise at once: the command knows where its summary goes
        self.received = False


_state = _SigintState()


def _on_sigint(signum: int, frame: object) -> None:
    _state.received = True
    if _state.armed:
        raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT (the entry point calls this first). A SIGINT that is ignored stays ignored:
    a run started in the background (``cmd &``) must not die with the terminal's Ctrl-C."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, _on_sigint)
    _state.installed = True


def arm() -> None:
    """From now on SIGINT raises KeyboardInterrupt at once; one deferred until now raises here."""
    _state.armed = True
    if _state.received:
        raise KeyboardInterrupt


def exit_on_sigint(code: int) -> None:
    """The command has finished and written its output: a SIGINT during the interpreter's teardown
    ends the process at once with the command's own exit code, not by the signal (-2)."""
    if not _state.installed:
        return

    def leave(signum: int, frame: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    signal.signal(signal.SIGINT, leave)


def received() -> bool:
    """Whether a SIGINT reached this process through the installed handler."""
    return _state.received


def _pause(where: str) -> None:
    sys.stderr.write(PAUSE_ANNOUNCEMENT + where + "\n")
    sys.stderr.flush()
    deadline = time.monotonic() + _PAUSE_S
    while time.monotonic() < deadline and not _state.received:   # a deferred SIGINT ends the pause too
        time.sleep(0.02)


def pause_point(point: str) -> None:
    """Test hook: sleep here when PADDLE_MLA_TEST_PAUSE_AT names ``point``."""
    if os.environ.get(PAUSE_ENV) == point:
        _pause(point)


class _PauseInImport:
    """A meta-path finder that sleeps once when ``module`` is imported, then lets the ordinary
    finders import it: a SIGINT then lands inside that import, as a real Ctrl-C during
    ``import triton`` does."""

    def __init__(self, module: str):
        self.module = module
        self.paused = False      # stays on sys.meta_path: the import system is iterating over it

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.module and not self.paused:
            self.paused = True
            _pause("import:" + fullname)
        return None


def install_import_pause() -> None:
    """Test hook: PADDLE_MLA_TEST_PAUSE_AT=import:MODULE pauses inside the import of MODULE."""
    spec = os.environ.get(PAUSE_ENV, "")
    if spec.startswith("import:"):
        sys.meta_path.insert(0, _PauseInImport(spec[len("import:"):]))
