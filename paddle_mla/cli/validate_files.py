"""What ``paddle-mla validate`` prints for a file that fails, and for a bench workload file."""

from __future__ import annotations

import click


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
