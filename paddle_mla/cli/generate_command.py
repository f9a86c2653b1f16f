"""The body of ``paddle-mla generate`` (cli.py declares the options and calls ``run``).

Order (fail before work): arguments and every path to be written are checked, the config
loaded, the model folder checked and ``--resume`` prepared before the runtime is even selected;
then the resolved run is described on the first stderr line, and only then the model loads.
SIGINT at any point exits 130 with ``INTERRUPTED``; during the run the summary is still written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddle_mla.config.schema import ConfigError, load_config
from paddle_mla.cli.paths import existing_output_problem, output_file_problem
from paddle_mla.engine.run_info import ModelPathError, model_problem

EXIT_OK, EXIT_INTERNAL, EXIT_LINE_ERRORS, EXIT_INTERRUPTED = 0, 1, 3, 130
INTERRUPTED = "interrupted: the output so far is intact; rerun with --resume"
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
    if args.input_path != "-" and not Path(args.input_path).is_file():
        raise GenerateUsageError(f"--input {args.input_path} is not a file")
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


def run(args: GenerateArgs, select_runtime: Callable[[Any], str], build_llm: Callable[[Any], Any],
        request_cls: Callable[[], type], echo: Callable[[str], None]) -> int:
    """Returns the exit code; raises ConfigError / GenerateUsageError (exit 2)."""
    try:
        return _run(args, select_runtime, build_llm, request_cls, echo)
    except KeyboardInterrupt:            # during start-up (imports, model load): nothing written
        echo(INTERRUPTED)
        return EXIT_INTERRUPTED


def _run(args: GenerateArgs, select_runtime, build_llm, request_cls, echo) -> int:
    from paddle_mla.batch.io import OutputWriter, ResumeError, count_input_lines, iter_input, prepare_resume
    from paddle_mla.batch.run import BatchSummary, run_batch
    from paddle_mla.integrations.data_parallel import DataParallelError

    check_paths(args)
    to_stdout = args.output_path == "-"
    cfg = load_config(args.config_path, args.overrides)
    problem = model_problem(cfg.model)
    if problem:
        raise GenerateUsageError(problem)
    done: set[str] = set()
    prior_errors = 0
    notes = []
    if args.resume:
        try:
            state = prepare_resume(args.output_path)
        except ResumeError as exc:
            raise GenerateUsageError(str(exc)) from None
        done, prior_errors = state.done, state.errors
        if state.dropped_bytes:
            notes.append(f"resume: cut {state.dropped_bytes} bytes of a torn or damaged tail off {args.output_path}")
        notes.append(f"resume: {state.lines} lines already done in {args.output_path}")
    select_runtime(cfg)
    from paddle_mla.engine.run_info import describe_run

    try:
        info, _ = describe_run(cfg)
    except (ModelPathError, RuntimeError) as exc:
        raise GenerateUsageError(str(exc)) from None
    echo(info.line())                    # the first line: what runs
    for note in notes:
        echo(note)
    if args.input_path == "-" and stdin_is_terminal():
        echo(STDIN_HINT)
    total = count_input_lines(args.input_path) if args.progress and args.input_path != "-" else None
    if not args.progress:
        os.environ["TQDM_DISABLE"] = "1"    # also the weight-loading bar, which the engine draws
    t0 = time.perf_counter()
    llm = build_llm(cfg)
    run_desc = llm.describe() if hasattr(llm, "describe") else info.to_dict()
    summary = BatchSummary(load_s=time.perf_counter() - t0)
    llm.reset_stats()
    writer = OutputWriter(None if to_stdout else args.output_path, append=args.resume)
    source = nullcontext(sys.stdin.buffer) if args.input_path == "-" else open(args.input_path, "rb")  # noqa: SIM115
    failure = None
    try:
        with source as stream:
            run_batch(llm, iter_input(stream), writer, request_cls=request_cls(), done=done, total=total,
                      progress=args.progress, summary=summary)
    except KeyboardInterrupt:
        summary.interrupted = True
    except DataParallelError as exc:     # a replica died: what was written stays; --resume completes it
        failure = str(exc)
    finally:
        writer.close()
        if hasattr(llm, "close"):
            llm.close()                  # data-parallel replicas stop here, not at interpreter exit
    echo(summary.text())
    if args.summary_path:
        data = summary.to_dict()
        data.update(config=args.config_path, output=None if to_stdout else args.output_path,
                    errors_before_resume=prior_errors, **run_desc)
        if failure:
            data["failure"] = failure
        Path(args.summary_path).write_text(json.dumps(data, indent=2) + "\n")
    if failure:
        echo(f"error: {failure}")
        return EXIT_INTERNAL
    if summary.interrupted:
        echo(INTERRUPTED)
        return EXIT_INTERRUPTED
    return EXIT_LINE_ERRORS if summary.errors or prior_errors else EXIT_OK


__all__ = ["ConfigError", "GenerateArgs", "GenerateUsageError", "INTERRUPTED", "run"]
