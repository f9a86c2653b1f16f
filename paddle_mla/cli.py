"""``paddle-mla``: generate | bench | validate | make-tiny-model.

Every command loads the config first (exit 2 with every error listed), then selects the runtime,
and only then imports tensor code. This module never imports a tensor library itself.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from paddle_mla.config import ConfigError, EngineConfig, load_config

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_LINE_ERRORS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

_EXIT_CODES = """\b
Exit codes:
  0    every line succeeded
  1    internal error (the output so far is intact: rerun with --resume)
  2    bad arguments or configuration (each error is printed)
  3    some lines were answered with an error line
  130  interrupted (rerun with --resume)"""

SET_OPTION = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a config key, e.g. --set scheduler.max_num_seqs=8 (repeatable).")


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def _print_config_errors(exc: ConfigError) -> None:
    click.echo(f"invalid configuration ({len(exc.errors)} error{'s' * (len(exc.errors) > 1)}):", err=True)
    for err in exc.errors:
        click.echo(f"  - {err}", err=True)
    sys.exit(EXIT_USAGE)


def load_or_exit(path: str | None, overrides: tuple[str, ...]) -> EngineConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        _print_config_errors(exc)


def select_runtime(cfg: EngineConfig) -> str:
    """Select the runtime named by the config; ``auto`` defers to PADDLE_MLA_RUNTIME, then detection."""
    from paddle_mla import runtime

    try:
        return runtime.select(None if cfg.runtime == "auto" else cfg.runtime)
    except (RuntimeError, ValueError) as exc:
        _fail(str(exc))
        raise  # unreachable


def build_llm(cfg: EngineConfig) -> Any:
    """Select the runtime, then import the engine and build the LLM (load errors exit 2)."""
    select_runtime(cfg)
    from paddle_mla.engine.llm import LLM

    try:
        return LLM(cfg)
    except (ConfigError, FileNotFoundError, ValueError, RuntimeError) as exc:
        _fail(f"cannot load the model of this config: {exc}")


def request_class() -> type:
    from paddle_mla.engine.request import GenerationRequest

    return GenerationRequest


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="paddle-mla")
def main() -> None:
    """Offline batch inference for Multi-head Latent Attention models (PaddlePaddle or PyTorch).

    \b
    Examples:
      paddle-mla generate --input prompts.jsonl --output out.jsonl
      paddle-mla generate --config configs/triton_mla.yaml -i in.jsonl -o out.jsonl --resume
      paddle-mla bench --config configs/bench/baseline.yaml --config configs/bench/prefix.yaml \\
          --workload shared-prefix:num_prompts=32,prefix_len=256
      paddle-mla validate configs/prefix_caching.yaml --set cache.block_size=32
      paddle-mla make-tiny-model /tmp/tiny --arch deepseek_v3
    """


@main.command(epilog=_EXIT_CODES)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Engine config YAML (default: the built-in tiny model config).")
@click.option("-i", "--input", "input_path", default="-", show_default=True,
              help="Input JSONL file, '-' for stdin.")
@click.option("-o", "--output", "output_path", default="-", show_default=True,
              help="Output JSONL file, '-' for stdout.")
@SET_OPTION
@click.option("--resume", is_flag=True,
              help="Keep the finished lines of --output, cut a torn last line, and append the rest.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), default=None,
              help="Write the run summary (throughput, tokens, cache hit rate, errors) as JSON here.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def generate(config_path: str | None, input_path: str, output_path: str, overrides: tuple[str, ...],
             resume: bool, summary_path: str | None, progress: bool) -> None:
    """Generate completions for a JSONL file of prompts: one output line per input line, in order.

    \b
    Input lines (one JSON object each; exactly one of prompt / messages / prompt_token_ids):
      {"id": "q1", "prompt": "The capital of France is", "max_tokens": 16}
      {"id": "q2", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "seed": 1}
      {"id": "q3", "prompt_token_ids": [1, 2, 3], "stop": ["\\n"], "ignore_eos": false}
      {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "..."}}
    Sampling fields: max_tokens temperature top_p top_k seed stop stop_token_ids ignore_eos
    min_tokens (defaults from the config's sampling section).

    \b
    Output lines:
      {"id": "q1", "text": "...", "token_ids": [...], "finish_reason": "stop"|"length",
       "usage": {"prompt_tokens": 6, "completion_tokens": 16, "cached_tokens": 0}, "seed": 123}
      {"id": "q9", "error": {"type": "invalid_request", "message": "..."}, "line": 9}
    A bad line gets an error line and the run goes on. Error types: invalid_json, invalid_request,
    unknown_field, duplicate_id, prompt_too_long, invalid_sampling, no_chat_template,
    token_out_of_range, engine_error. Blank lines are skipped. A prompt of max_model_len tokens or
    more is an error; otherwise max_tokens is capped at max_model_len minus the prompt length.
    Without a seed, a line gets one derived from the config seed and its line number.

    \b
    Resume: records are keyed by id (or custom_id); lines without an id, and repeated ids, are
    keyed by line number ("line": N in the record), so do not edit the input between runs.
    Output is flushed per line and fsynced every 2 s and at the end.

    \b
    Examples:
      paddle-mla generate -i prompts.jsonl -o out.jsonl --summary run.json
      cat prompts.jsonl | paddle-mla generate --set sampling.max_tokens=32 > out.jsonl
      paddle-mla generate --config configs/prefix_caching.yaml -i big.jsonl -o out.jsonl --resume
    """
    from paddle_mla.batch_io import OutputWriter, ResumeError, count_input_lines, iter_input, prepare_resume
    from paddle_mla.batch_run import run_batch

    to_stdout = output_path == "-"
    if resume and to_stdout:
        raise click.UsageError("--resume needs --output FILE (it appends to that file)")
    if input_path != "-" and not Path(input_path).is_file():
        raise click.BadParameter(f"{input_path} is not a file", param_hint="--input")
    if not to_stdout and Path(output_path).resolve() == Path(input_path).resolve():
        raise click.BadParameter("--output must not be the input file", param_hint="--output")
    cfg = load_or_exit(config_path, overrides)
    done: set[str] = set()
    prior_errors = 0
    if resume:
        try:
            state = prepare_resume(output_path)
        except ResumeError as exc:
            _fail(str(exc))
        done, prior_errors = state.done, state.errors
        if state.dropped_bytes:
            click.echo(f"resume: cut {state.dropped_bytes} bytes of a torn or damaged tail off {output_path}", err=True)
        click.echo(f"resume: {state.lines} lines already done in {output_path}", err=True)
    total = count_input_lines(input_path) if progress and input_path != "-" else None
    t0 = time.perf_counter()
    llm = build_llm(cfg)
    load_s = time.perf_counter() - t0
    llm.reset_stats()
    writer = OutputWriter(None if to_stdout else output_path, append=resume)
    source = nullcontext(sys.stdin.buffer) if input_path == "-" else open(input_path, "rb")  # noqa: SIM115
    try:
        with source as stream:
            summary = run_batch(llm, iter_input(stream), writer, request_cls=request_class(), done=done,
                                total=total, progress=progress)
    except KeyboardInterrupt:
        click.echo("interrupted: the output so far is intact; rerun with --resume", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        writer.close()
    summary.load_s = load_s
    click.echo(summary.text(), err=True)
    if summary_path:
        data = summary.to_dict()
        data.update(config=config_path, output=None if to_stdout else output_path, errors_before_resume=prior_errors)
        Path(summary_path).write_text(json.dumps(data, indent=2) + "\n")
    sys.exit(EXIT_LINE_ERRORS if summary.errors or prior_errors else EXIT_OK)


@main.command(epilog="""\b
Exit codes:
  0  every config is valid
  2  some config has errors (each one is printed, naming the file and key)""")
@click.argument("configs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@SET_OPTION
def validate(configs: tuple[str, ...], overrides: tuple[str, ...]) -> None:
    """Check config files and print each one fully resolved (defaults filled in) as YAML.

    Loads no model and no tensor library: backend/feature combinations are checked from the
    backend capability table.

    \b
    Examples:
      paddle-mla validate configs/tiny.yaml
      paddle-mla validate configs/*.yaml configs/bench/*.yaml
      paddle-mla validate configs/triton_mla.yaml --set cache.enable_prefix_caching=true
    """
    import yaml

    failed = 0
    for i, path in enumerate(configs):
        try:
            cfg = load_config(path, overrides)
        except ConfigError as exc:
            failed += 1
            click.echo(f"{path}: {len(exc.errors)} error{'s' * (len(exc.errors) > 1)}", err=True)
            for err in exc.errors:
                click.echo(f"  - {err}", err=True)
            continue
        if i:
            click.echo("---")
        click.echo(f"# {path}")
        click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
    sys.exit(EXIT_USAGE if failed else EXIT_OK)


@main.command("make-tiny-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--arch", type=click.Choice(["deepseek_v3", "deepseek_v2", "deepseek_v32"]), default="deepseek_v3", show_default=True,
              help="Model family of the tiny checkpoint.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
def make_tiny_model_cmd(out_dir: str, arch: str, seed: int) -> None:
    """Write a tiny random checkpoint (config.json, safetensors, tokenizer) to OUT_DIR.

    It runs on CPU in seconds and is what the tests and the default config (model: tiny) use.
    Uses the runtime named by PADDLE_MLA_RUNTIME (default: auto).

    \b
    Examples:
      paddle-mla make-tiny-model /tmp/tiny-v3
      paddle-mla make-tiny-model /tmp/tiny-v2 --arch deepseek_v2 --seed 1
      paddle-mla generate --set model=/tmp/tiny-v2 -i prompts.jsonl
    """
    from paddle_mla import runtime

    try:
        runtime.select()
    except (RuntimeError, ValueError) as exc:
        _fail(str(exc))
    from paddle_mla.models import make_tiny_model

    path = make_tiny_model(out_dir, arch, seed)
    click.echo(str(path or out_dir))


@main.command(epilog="""\b
Workload kinds and parameters (defaults):
  random         num_prompts=64 input_len=128 output_len=32 range_ratio=0.0 seed=0
  shared-prefix  num_prompts=64 prefix_len=256 suffix_len=32 output_len=32 shared_fraction=1.0
                 num_prefixes=1 seed=0
  long-context   num_prompts=4 input_len=4096 output_len=16 range_ratio=0.0 seed=0
Requests use greedy sampling with ignore_eos (fixed output lengths); token ids are drawn from
the vocabulary without special tokens.

\b
Exit codes:
  0  done
  2  bad arguments, configuration or workload (each error is printed)""")
@click.option("--config", "config_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A config to compare (repeatable; the first is the baseline of the ratios). "
                   "Default: the built-in tiny config.")
@click.option("--workload", "workload_spec", required=True,
              help="KIND:key=value,... (e.g. random:num_prompts=64,input_len=128,output_len=32) "
                   "or FILE.yaml[#NAME].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs per config, interleaved A B A B.")
@click.option("--warmup", "warmup_requests", type=click.IntRange(min=0), default=8, show_default=True,
              help="Requests of a warm-up run before timing each engine.")
@click.option("--engines", type=click.Choice(["auto", "keep", "rebuild"]), default="auto", show_default=True,
              help="keep: build each engine once and keep all; rebuild: build one per run and drop it "
                   "(auto: keep on CPU, rebuild on GPU where each engine sizes its cache from free memory).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write all results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG plot here (needs matplotlib: pip install 'paddle-mla[plot]').")
@SET_OPTION
def bench(config_paths: tuple[str, ...], workload_spec: str, repeats: int, warmup_requests: int, engines: str,
          json_path: str | None, plot_path: str | None, overrides: tuple[str, ...]) -> None:
    """Compare configs on one seeded synthetic workload: throughput, TTFT, TPOT, ITL, cache use.

    Prints a markdown table with each config's ratio to the first. All configs must name the same
    runtime and device (they run in one process). --set applies to every config.

    \b
    Examples:
      paddle-mla bench --workload random:num_prompts=32,input_len=64,output_len=16 --repeats 1
      paddle-mla bench --config configs/bench/baseline.yaml --config configs/bench/prefix.yaml \\
          --workload configs/bench/workloads.yaml#shared --json out.json --plot out.png
      paddle-mla bench --config configs/bench/baseline.yaml --config configs/bench/chunked.yaml \\
          --workload long-context:num_prompts=2,input_len=1024 --set device=cpu
    """
    from paddle_mla.bench.command import BenchArgs, BenchUsageError, run

    args = BenchArgs(config_paths, workload_spec, repeats, warmup_requests, engines, json_path, plot_path, overrides)
    try:
        run(args, select_runtime, lambda cfg: build_llm(cfg), echo=lambda m: click.echo(m, err=True), out=click.echo)
    except ConfigError as exc:
        _print_config_errors(exc)
    except BenchUsageError as exc:
        _fail(str(exc))


if __name__ == "__main__":
    main()
