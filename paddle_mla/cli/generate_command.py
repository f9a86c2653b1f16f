"""The body of ``paddle-mla generate`` (app.py declares the options and calls ``run``).

Order (fail before work): arguments and every path to be written are checked, the config
loaded, the model folder checked and ``--resume`` prepared before the runtime is even selected;
then the resolved run is described on the first stderr line, and only then the model loads.
SIGINT at any point exits 130 with ``INTERRUPTED`` (``INTERRUPTED_STDOUT`` for ``-o -``, which
--resume cannot continue) and still writes the summary ("interrupted": true; before the model has
loaded its counts are zero).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddle_mla.batch.io import (
    OutputWriteError,
    OutputWriter,
    ResumeError,
    count_input_lines,
    iter_input,
    os_error_text,
    prepare_resume,
)
from paddle_mla.batch.run import BatchSummary, run_batch
from paddle_mla.cli import interrupts
from paddle_mla.cli.paths import existing_output_problem, input_problem, is_regular_file, output_file_problem
from paddle_mla.config.schema import ConfigError, load_config
from paddle_mla.engine.run_info import ModelPathError, model_problem

EXIT_OK, EXIT_INTERNAL, EXIT_LINE_ERRORS, EXIT_INTERRUPTED = 0, 1, 3, 130
INTERRUPTED = "interrupted: the output so far is intact; rerun with --resume"
# --resume appends to --output FILE; lines that went to stdout cannot be continued by it
INTERRUPTED_STDOUT = ("interrupted: the lines answered so far went to stdout; a run written to stdout cannot be "
                      "resumed (give -o FILE for a run that can be)")
STDIN_HINT = ("reading prompts from stdin (Ctrl-D to end); use -i FILE to read a file, "
              "see paddle-mla generate --help")


class GenerateUsageError(ValueError):
    """Bad arguments, paths, model or resolved config: printed as one line, exit 2."""


@dataclass
class GenerateArgs:
    config_path: str | None
    input_path: str
    output_path: str
    overrides: tuple[str, ...]
    resume: bool
    overwrite: bool
    summary_path: str | None
    progress: bool


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def check_paths(args: GenerateArgs) -> None:
    to_stdout = args.output_path == "-"
    if args.resume and args.overwrite:
        raise GenerateUsageError("--resume and --overwrite exclude each other")
    if args.resume and to_stdout:
        raise GenerateUsageError("--resume needs --output FILE (it appends to that file)")
    problem = input_problem(args.input_path) if args.input_path != "-" else None
    if problem:
        raise GenerateUsageError(problem)
    problems = []
    if not to_stdout:
        if args.input_path != "-" and Path(args.output_path).resolve() == Path(args.input_path).resolve():
            raise GenerateUsageError("--output must not be the input file")
        problems += [output_file_problem(args.output_path, "--output"),
                     existing_output_problem(args.output_path, args.resume, args.overwrite)]
    if args.summary_path:
        if not to_stdout and Path(args.summary_path).resolve() == Path(args.output_path).resolve():
            raise GenerateUsageError("--summary must not be the --output file")
        problems.append(output_file_problem(args.summary_path, "--summary"))
    problems = [p for p in problems if p]
    if problems:
        raise GenerateUsageError("; ".join(problems))


@dataclass
class _RunState:
    """What the summary reports, filled in as start-up and the run go on, so an interrupt at any
    point still writes a summary of what was known by then."""
    summary: BatchSummary = field(default_factory=BatchSummary)
    prior_errors: int = 0                       # error lines kept from a previous run (--resume)
    run_desc: dict[str, Any] = field(default_factory=dict)   # runtime, device, backend, model, ...
    failure: str | None = None


def run(args: GenerateArgs, select_runtime: Callable[[Any], str], build_llm: Callable[[Any], Any],
        request_cls: Callable[[], type], echo: Callable[[str], None]) -> int:
    """Returns the exit code; raises ConfigError / GenerateUsageError (exit 2)."""
    state = _RunState()
    try:
        interrupts.arm()
        return _run(args, state, select_runtime, build_llm, request_cls, echo)
    except BaseException as exc:  # noqa: BLE001  (re-raised unless a SIGINT caused it)
        # Interrupted during start-up (imports, config, model load), or an exception that a
        # SIGINT caused: an interrupted import surfaces as ImportError, a half-imported module
        # as AttributeError, or as the error exit of the code that met it.
        if not (isinstance(exc, KeyboardInterrupt) or interrupts.received()):
            raise
    state.summary.interrupted = True
    problem = _write_summary(args, state)
    if problem:
        echo(f"error: {problem}")
    echo(interrupted_message(args))
    return EXIT_INTERRUPTED


def interrupted_message(args: GenerateArgs) -> str:
    """The line an interrupted run ends with: how to go on from what was written."""
    return INTERRUPTED_STDOUT if args.output_path == "-" else INTERRUPTED


def _write_summary(args: GenerateArgs, state: _RunState) -> str | None:
    """Write --summary; why it could not be written (one line), or None."""
    if not args.summary_path:
        return None
    data = state.summary.to_dict()
    data.update(config=args.config_path, output=None if args.output_path == "-" else args.output_path,
                errors_before_resume=state.prior_errors, **state.run_desc)
    if state.failure:
        data["failure"] = state.failure
    try:
        Path(args.summary_path).write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        return f"cannot write --summary {args.summary_path}: {os_error_text(exc)}"
    return None


def _run(args: GenerateArgs, state: _RunState, select_runtime, build_llm, request_cls, echo) -> int:
    from paddle_mla.integrations.data_parallel import DataParallelError

    interrupts.pause_point("config")
    check_paths(args)
    to_stdout = args.output_path == "-"
    cfg = load_config(args.config_path, args.overrides)
    problem = model_problem(cfg.model)
    if problem:
        raise GenerateUsageError(problem)
    done: set[str] = set()
    notes = []
    if args.resume:
        try:
            resumed = prepare_resume(args.output_path)
        except ResumeError as exc:
            raise GenerateUsageError(str(exc)) from None
        done, state.prior_errors = resumed.done, resumed.errors
        if resumed.dropped_bytes:
            notes.append(f"resume: cut {resumed.dropped_bytes} bytes of a torn or damaged tail off {args.output_path}")
        notes.append(f"resume: {resumed.lines} lines already done in {args.output_path}")
    select_runtime(cfg)
    from paddle_mla.engine.run_info import describe_run

    try:
        info, _ = describe_run(cfg)
    except (ModelPathError, RuntimeError) as exc:
        raise GenerateUsageError(str(exc)) from None
    state.run_desc = info.to_dict()
    echo(info.line())                    # the first line: what runs
    for note in notes:
        echo(note)
    if args.input_path == "-" and stdin_is_terminal():
        echo(STDIN_HINT)
    # a pipe is read once, so its lines are not counted ahead (the bar counts up, as for stdin)
    counted = args.progress and args.input_path != "-" and is_regular_file(args.input_path)
    total = count_input_lines(args.input_path) if counted else None
    if not args.progress:
        os.environ["TQDM_DISABLE"] = "1"    # also the weight-loading bar, which the engine draws
    interrupts.pause_point("load")
    t0 = time.perf_counter()
    llm = build_llm(cfg)
    if hasattr(llm, "describe"):
        state.run_desc = llm.describe()
    summary = state.summary
    summary.load_s = time.perf_counter() - t0
    llm.reset_stats()
    writer = None
    source = nullcontext(sys.stdin.buffer) if args.input_path == "-" else open(args.input_path, "rb")  # noqa: SIM115
    try:
        with source as stream:
            writer = OutputWriter(None if to_stdout else args.output_path, append=args.resume)
            run_batch(llm, iter_input(stream), writer, request_cls=request_cls(), done=done, total=total,
                      progress=args.progress, summary=summary)
    except KeyboardInterrupt:
        summary.interrupted = True
    # a replica died, or the output cannot take more (a full disk): what was written stays, and
    # --resume completes it
    except (DataParallelError, OutputWriteError) as exc:
        state.failure = str(exc)
    finally:
        if writer is not None:
            writer.close()
        if hasattr(llm, "close"):
            llm.close()                  # data-parallel replicas stop here, not at interpreter exit
    echo(summary.text())
    failures = [state.failure, _write_summary(args, state)]
    if any(failures):
        for failure in filter(None, failures):
            echo(f"error: {failure}")
        return EXIT_INTERNAL
    if summary.interrupted:
        echo(interrupted_message(args))
        return EXIT_INTERRUPTED
    return EXIT_LINE_ERRORS if summary.errors or state.prior_errors else EXIT_OK


__all__ = ["ConfigError", "GenerateArgs", "GenerateUsageError", "INTERRUPTED", "INTERRUPTED_STDOUT", "run"]
