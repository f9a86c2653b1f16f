"""Streaming JSONL input, crash-safe JSONL output, and resume.

Input is read line by line in binary (a bad UTF-8 line becomes an error line, not a crash); blank
lines are skipped and get no output line; line numbers count every physical line from 1.

Output is append-only, one ``write`` per line, flushed per line, fsynced every few seconds and at
the end. A record's *key* says which input line it answers, so ``--resume`` can skip finished
lines:

- a line with an id (``id`` or ``custom_id``; an OpenAI record's own ``id`` is its batch_req id,
  not the key) is keyed by that id;
- a line without an id, with an unreadable id, or whose id repeats an earlier one (the
  ``duplicate_id`` error) is keyed by its line number; its record carries ``"line": N``.

So id-less lines resume correctly only if the input file is not edited between runs.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from paddle_mla.batch.parse import id_key
from paddle_mla.batch.records import is_error_record, is_output_record, record_error_kind, record_ident

_BLANK = b" \t\r\n\f\v"


def iter_input(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for each non-blank line, read lazily."""
    for line_no, raw in enumerate(stream, 1):
        line = raw.strip(_BLANK)
        if line:
            yield line_no, line


def count_input_lines(path: str | Path) -> int:
    """Non-blank lines of a file, streaming once (for the progress bar total)."""
    with open(path, "rb") as f:
        return sum(1 for _ in iter_input(f))


def line_key(line_no: int) -> str:
    return f"line:{line_no}"


def input_key(ident: Any, line_no: int, duplicate: bool) -> str:
    return line_key(line_no) if ident is None or duplicate else "id:" + id_key(ident)


def record_key(record: dict[str, Any]) -> str | None:
    """The key of an output record (see the module doc); None when it has neither id nor line."""
    ident = record_ident(record)
    if ident is not None and record_error_kind(record) != "duplicate_id":
        return "id:" + id_key(ident)
    line = record.get("line")
    return line_key(line) if isinstance(line, int) else None


@dataclass
class ResumeState:
    done: set[str] = field(default_factory=set)
    lines: int = 0                 # complete records kept
    errors: int = 0                # of which error records
    dropped_bytes: int = 0         # torn or unreadable tail cut off


class ResumeError(ValueError):
    pass


def _parse_record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def prepare_resume(path: str | Path) -> ResumeState:
    """Read the finished records of an existing output and cut off a torn or unreadable tail, so
    that appending continues cleanly. A missing file resumes from nothing. Raises ResumeError for
    a file that is not our output, or that is damaged before its tail (nothing is cut then)."""
    state = ResumeState()
    p = Path(path)
    if not p.exists():
        return state
    good_end = 0
    bad_line = 0
    with open(p, "rb+") as f:
        for line_no, raw in enumerate(f, 1):
            record = _parse_record(raw) if raw.endswith(b"\n") else None
            if record is None:                     # torn (killed mid-write) or garbage
                bad_line = bad_line or line_no
                continue
            key = record_key(record)
            if key is None or not is_output_record(record):
                raise ResumeError(f"{p}:{line_no} is not a paddle-mla generate output record; "
                                  "refusing to append to it (check --output)")
            if bad_line:
                raise ResumeError(f"{p}: line {bad_line} is damaged but later lines are not; "
                                  "repair or remove it, then resume")
            state.done.add(key)
            state.lines += 1
            state.errors += is_error_record(record)
            good_end += len(raw)
        size = f.seek(0, os.SEEK_END)
        if size > good_end:
            state.dropped_bytes = size - good_end
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return state


def os_error_text(exc: OSError) -> str:
    """An OSError as its reason alone ("No space left on device (errno 28)"); the caller names the path."""
    return f"{exc.strerror} (errno {exc.errno})" if exc.strerror else str(exc)


class OutputWriteError(Exception):
    """The output cannot be written (a full disk, a closed pipe): one line naming where and why.
    What was written before stays (a torn last line at most, which ``--resume`` cuts)."""


class OutputWriter:
    """Append-only JSONL writer: one write per record, flushed at once, fsynced periodically.
    ``path`` None or '-' writes to stdout. An OSError of the output is an OutputWriteError."""

    def __init__(self, path: str | Path | None, append: bool, fsync_interval_s: float = 2.0):
        self._own = path is not None and str(path) != "-"
        self._where = f"the output file {path}" if self._own else "the output to stdout"
        # unbuffered: each record reaches the kernel in one write, so a kill leaves at most a torn last line
        try:
            self._file: IO[bytes] = (open(path, "ab" if append else "wb", buffering=0)  # noqa: SIM115 (see close())
                                     if self._own else sys.stdout.buffer)
        except OSError as exc:
            raise self._error(exc) from None
        self._interval = fsync_interval_s
        self._last_sync = time.monotonic()
        self.lines = 0

    def _error(self, exc: OSError) -> OutputWriteError:
        return OutputWriteError(f"cannot write {self._where}: {os_error_text(exc)}")

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", errors="replace")
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view):]
            self._file.flush()
        except OSError as exc:
            raise self._error(exc) from None
        self.lines += 1
        if time.monotonic() - self._last_sync >= self._interval:
            self.sync()

    def sync(self) -> None:
        self._last_sync = time.monotonic()
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass                                   # pipes, terminals and test captures cannot be fsynced

    def close(self) -> None:
        self.sync()
        if self._own:
            self._file.close()
