"""The body of ``paddle-mla bench`` (the click command in app.py parses options and calls ``run``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddle_mla.cli.bench.runner import ConfigSpec
from paddle_mla.config.schema import ConfigError, load_config


class BenchUsageError(ValueError):
    """Bad workload, configs that cannot share a process, missing matplotlib: exit 2."""


@dataclass
class BenchArgs:
    config_paths: tuple[str, ...]
    workload: str
    repeats: int
    warmup_requests: int
    engines: str                   # auto | keep | rebuild
    json_path: str | None
    plot_path: str | None
    overrides: tuple[str, ...]
    check_determinism: bool = False


def load_specs(paths: tuple[str, ...], overrides: tuple[str, ...]) -> list[ConfigSpec]:
    """One spec per config (named by file stem); raise ConfigError listing the errors of all."""
    specs: list[ConfigSpec] = []
    errors: list[str] = []
    for path in paths or (None,):
        try:
            cfg = load_config(path, overrides)
        except ConfigError as exc:
            errors.extend(exc.errors)
            continue
        stem = Path(path).stem if path else "default"
        same = sum(1 for s in specs if s.name.split("#")[0] == stem)
        specs.append(ConfigSpec(f"{stem}#{same + 1}" if same else stem, path, cfg))
    if errors:
        raise ConfigError(errors)
    first = specs[0].config
    for spec in specs[1:]:
        if (spec.config.runtime, spec.config.device) != (first.runtime, first.device):
            raise BenchUsageError(f"all configs must share runtime and device (they run in one process): "
                                  f"{specs[0].name} has {first.runtime}/{first.device}, {spec.name} has "
                                  f"{spec.config.runtime}/{spec.config.device}")
    return specs


def run(args: BenchArgs, select_runtime: Callable[[Any], str], build_llm: Callable[[Any], Any],
        echo: Callable[[str], None], out: Callable[[str], None]) -> None:
    from paddle_mla.cli.bench.report import bench_document, check_matplotlib, markdown_table, write_json, write_plot
    from paddle_mla.cli.bench.runner import run_bench
    from paddle_mla.cli.bench.workloads import WorkloadError, check_fits, parse_workload

    from paddle_mla.cli.paths import output_file_problem
    from paddle_mla.engine.run_info import ModelPathError, model_problem, plan_run, run_info

    try:
        workload = parse_workload(args.workload)
    except WorkloadError as exc:
        raise BenchUsageError(str(exc)) from None
    problems = [output_file_problem(p, opt) for p, opt in ((args.json_path, "--json"), (args.plot_path, "--plot")) if p]
    if args.json_path and args.plot_path and Path(args.json_path).resolve() == Path(args.plot_path).resolve():
        problems.append("--json and --plot name the same file")
    if args.plot_path:
        try:
            check_matplotlib()
        except ImportError as exc:
            problems.append(str(exc))
    if args.check_determinism:
        if len(args.config_paths) > 1:
            problems.append("--check-determinism checks one config; give at most one --config")
        if args.plot_path:
            problems.append("--check-determinism writes no plot; drop --plot")
    specs = load_specs(args.config_paths, args.overrides)
    problems += [f"config {s.name}: {p}" for s in specs for p in [model_problem(s.config.model)] if p]
    problems = [p for p in problems if p]
    if problems:
        raise BenchUsageError("; ".join(problems))
    rt = select_runtime(specs[0].config)
    try:
        plans = [plan_run(spec.config) for spec in specs]
    except (ModelPathError, RuntimeError) as exc:
        raise BenchUsageError(str(exc)) from None
    for spec, plan in zip(specs, plans):     # from the config and the checkpoint, before any engine is built
        try:
            check_fits(workload, plan.max_model_len, args.workload)
        except WorkloadError as exc:
            raise BenchUsageError(f"{exc}{f' (config {spec.name})' if len(specs) > 1 else ''}") from None
    infos = [run_info(plan) for plan in plans]
    for spec, info in zip(specs, infos):      # the first line says what runs (the baseline)
        echo(info.line() + (f" [config {spec.name}]" if len(specs) > 1 else ""))
    if args.check_determinism:
        _check_determinism(args, workload, build_llm, echo, out)
        return
    device = infos[0].device
    # one tensor-parallel group per process (torch.distributed's default group): two TP engines
    # cannot be alive at once
    tp_configs = [s.name for s in specs if s.config.parallel.tensor_parallel_size > 1]
    if args.engines == "keep" and len(tp_configs) > 1:
        raise BenchUsageError(f"--engines keep: configs {', '.join(tp_configs)} use tensor parallelism, and a "
                              "process holds one tensor-parallel group at a time; use --engines rebuild (or auto)")
    keep = args.engines == "keep" or (args.engines == "auto" and device == "cpu" and len(tp_configs) < 2)
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    echo(f"bench: {len(specs)} configs x {args.repeats} repeats, workload {workload.describe()}, "
         f"runtime {rt}, device {device}, engines {'keep' if keep else 'rebuild'}")
    try:
        results = run_bench(specs, workload, args.repeats, args.warmup_requests, keep, build_llm, GenerationRequest,
                            SamplingParams, log=echo)
    except WorkloadError as exc:
        raise BenchUsageError(str(exc)) from None
    out(markdown_table(results))
    doc = bench_document(results, workload, repeats=args.repeats, warmup_requests=args.warmup_requests,
                         engines="keep" if keep else "rebuild", runs=[info.to_dict() for info in infos])
    if args.json_path:
        write_json(doc, args.json_path)
        echo(f"wrote {args.json_path}")
    if args.plot_path:
        write_plot(results, f"{workload.describe()} | {rt} {device} | {args.repeats} repeats", args.plot_path)
        echo(f"wrote {args.plot_path}")


def _check_determinism(args: BenchArgs, workload: Any, build_llm: Callable[[Any], Any], echo: Callable[[str], None],
                       out: Callable[[str], None]) -> None:
    """``--check-determinism``: the workload through each configuration of cli.bench.determinism."""
    import json

    from paddle_mla.cli.bench.determinism import check_determinism, markdown
    from paddle_mla.cli.bench.workloads import WorkloadError, build_requests
    from paddle_mla.platform import runtime
    from paddle_mla.sched.request import GenerationRequest, SamplingParams

    def requests_for(llm: Any) -> list:
        return build_requests(workload, llm.tokenizer, GenerationRequest, SamplingParams, llm.max_model_len)

    path = args.config_paths[0] if args.config_paths else None
    echo(f"check-determinism: workload {workload.describe()}, configurations batch1 (the reference), batch256, "
         f"chunked, prefix, preempt, dp2")
    try:
        rows = check_determinism(path, args.overrides, requests_for, build_llm, runtime.gpu_count(), echo)
    except WorkloadError as exc:
        raise BenchUsageError(str(exc)) from None
    out(markdown(rows))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"workload": workload.describe(), "rows": rows}, indent=1) + "\n")
        echo(f"wrote {args.json_path}")
