"""``paddle-mla validate``: each file checked and printed resolved, a config with its run plan."""

from __future__ import annotations

import click

from paddle_mla.config.schema import ConfigError, EngineConfig, load_config


def echo_file_errors(path: str, errors: list[str]) -> None:
    click.echo(f"{path}: {len(errors)} error{'s' * (len(errors) > 1)}", err=True)
    for err in errors:
        click.echo(f"  - {err}", err=True)


def validate_workload_file(path: str, separator: bool) -> bool:
    """Check a bench workload file and print its workloads resolved (defaults filled in) as one
    YAML document; False when it has errors (each printed)."""
    import yaml

    from paddle_mla.cli.bench.workloads import WorkloadFileError, read_workload_file

    try:
        workloads = read_workload_file(path)
    except WorkloadFileError as exc:
        echo_file_errors(path, exc.errors)
        return False
    if separator:
        click.echo("---")
    click.echo(f"# {path} (bench workloads)")
    resolved = {w.name or w.kind: {"kind": w.kind, **w.params} for w in workloads}
    click.echo(yaml.safe_dump(resolved, sort_keys=False).rstrip())
    return True


def validate_files(configs: tuple[str, ...], overrides: tuple[str, ...]) -> int:
    """Print every file resolved (a config with its plan as comments); the number that failed."""
    import yaml

    from paddle_mla.cli.bench.workloads import is_workload_file
    from paddle_mla.engine.run_info import TINY, ModelPathError, checkpoint_arch, model_problem

    failed = 0
    workloads = [p for p in configs if is_workload_file(p)]
    if overrides and len(workloads) == len(configs):
        # no config file takes them: still check the --set keys and values, so a typo shows
        try:
            load_config(None, overrides)
        except ConfigError as exc:
            failed += 1
            echo_file_errors("--set", exc.errors)
    for i, path in enumerate(configs):
        if path in workloads:
            if overrides:
                click.echo(f"note: --set applies to config files, not to the workload file {path}", err=True)
            failed += not validate_workload_file(path, separator=i > 0)
            continue
        try:
            cfg = load_config(path, overrides)
            problem = model_problem(cfg.model)
            if problem is None and cfg.model != TINY:
                # a checkpoint whose config.json cannot be read is an error of this file, as a
                # missing folder is (generate and bench refuse it too), not a plan that does not resolve
                try:
                    checkpoint_arch(cfg.model)
                except ModelPathError as exc:
                    problem = str(exc)
            if problem:
                raise ConfigError([f"'model': {problem}"])
        except ConfigError as exc:
            failed += 1
            echo_file_errors(path, exc.errors)
            continue
        if i:
            click.echo("---")
        click.echo(f"# {path}")
        click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
        plan = plan_or_note(cfg)
        # as comments, so the printed document stays a config that loads as it is
        text = f"plan: {plan}" if isinstance(plan, str) else yaml.safe_dump({"plan": plan.to_dict()}, sort_keys=False)
        click.echo("\n".join("# " + line for line in text.rstrip().splitlines()))
    return failed


def plan_or_note(cfg: EngineConfig):
    """The config's ``RunPlan``, or why it does not resolve here. Not a config error: the plan
    depends on the checkpoint (bench configs name ``tiny`` as a stand-in for the ``--model`` they
    are run with) and, under device auto, on this machine, which ``generate`` checks at start-up."""
    from paddle_mla.engine.run_info import plan_run
    from paddle_mla.platform import runtime

    try:
        runtime.select(None if cfg.runtime == "auto" else cfg.runtime)
        return plan_run(cfg, device_kind=None if cfg.device == "auto" else cfg.device)
    except (RuntimeError, ValueError) as exc:      # ConfigError is a ValueError
        reasons = exc.errors if isinstance(exc, ConfigError) else [str(exc)]
        return "not resolved with this checkpoint on this machine: " + "; ".join(reasons)
