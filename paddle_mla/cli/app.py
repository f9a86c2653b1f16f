"""``paddle-mla``: generate | bench | validate | make-tiny-model.

Every command loads the config first (exit 2 with every error listed), then selects the runtime,
and only then imports tensor code. This module never imports a tensor library itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from paddle_mla.cli import interrupts
from paddle_mla.cli.entry import entry  # noqa: F401  (paddle_mla.cli.app:entry stays a working entry point)
from paddle_mla.config.schema import ConfigError, EngineConfig, load_config

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_LINE_ERRORS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

_EXIT_CODES = """\b
Exit codes:
  0    every line succeeded
  1    internal error, or --output / --summary cannot be written (e.g. a full disk); the output so
       far is intact: rerun with --resume
  2    bad arguments or configuration (each error is printed)
  3    some lines were answered with an error line
  130  interrupted by SIGINT, also during start-up (with -o FILE, rerun with --resume; --summary is
       still written)"""

SET_OPTION = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a config key, e.g. --set scheduler.max_num_seqs=8 (repeatable).")


def _interrupt_if_signalled() -> None:
    """An error met after a SIGINT is the interrupt's doing (an import cut short): report the
    interrupt, not the error."""
    if interrupts.received():
        raise KeyboardInterrupt


def _fail(message: str) -> None:
    _interrupt_if_signalled()
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def _print_config_errors(exc: ConfigError) -> None:
    _interrupt_if_signalled()
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
    from paddle_mla.platform import runtime

    try:
        return runtime.select(None if cfg.runtime == "auto" else cfg.runtime)
    except (RuntimeError, ValueError) as exc:
        _fail(str(exc))
        raise  # unreachable


def build_llm(cfg: EngineConfig) -> Any:
    """Select the runtime, then import the engine and build the LLM (load errors exit 2)."""
    select_runtime(cfg)
    from paddle_mla.engine.llm import LLM
    from paddle_mla.engine.run_info import ModelPathError

    try:
        if cfg.parallel.data_parallel_size > 1:
            from paddle_mla.integrations.data_parallel import DataParallelLLM

            return DataParallelLLM(cfg)
        return LLM(cfg)
    except ConfigError as exc:
        _print_config_errors(exc)
    except ModelPathError as exc:
        _fail(str(exc))
    except (FileNotFoundError, ValueError, RuntimeError, KeyError) as exc:
        _fail(f"cannot load the model of this config: {exc}")


class _Group(click.Group):
    """SIGINT anywhere (imports, model load, a command's own work) exits 130 with one line, not
    click's "Aborted!" and exit 1; ``generate`` handles its own SIGINT to write the summary first.
    After a SIGINT, whatever exception follows is the interrupt (an interrupted import may surface
    as ImportError, or as an error exit of the code that met the half-imported module)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SystemExit as exc:
            if exc.code in (EXIT_OK, EXIT_INTERRUPTED) or not interrupts.received():
                raise
        except BaseException as exc:  # noqa: BLE001  (re-raised unless a SIGINT caused it)
            if not (isinstance(exc, KeyboardInterrupt) or interrupts.received()):
                raise
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)


def request_class() -> type:
    from paddle_mla.sched.request import GenerationRequest

    return GenerationRequest


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="""\b
Exit codes (each command's --help lists its own):
  0    success
  2    bad arguments or configuration (each error is printed)
  130  interrupted by SIGINT (Ctrl-C)""")
@click.version_option(package_name="paddle-mla")
def main() -> None:
    """Offline batch inference for Multi-head Latent Attention models (PaddlePaddle or PyTorch).

    Runs local checkpoint folders only: nothing is ever downloaded.

    \b
    Examples:
      paddle-mla generate --input prompts.jsonl --output out.jsonl
      python -m paddle_mla generate --model ./DeepSeek-V2-Lite --max-tokens 32 -i in.jsonl -o out.jsonl
      paddle-mla generate --config configs/triton_mla.yaml -i in.jsonl -o out.jsonl --resume
      paddle-mla bench --config configs/bench/baseline.yaml --config configs/bench/prefix.yaml \\
          --workload shared-prefix:num_prompts=32,prefix_len=256
      paddle-mla validate configs/prefix_caching.yaml --set cache.block_size=32
      paddle-mla make-tiny-model /tmp/tiny --arch deepseek_v3
    """


@main.command(epilog=_EXIT_CODES, short_help="Generate completions for a JSONL file of prompts.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Engine config YAML (default: the built-in tiny model config).")
@click.option("-i", "--input", "input_path", default="-", show_default=True, metavar="FILE",
              help="Input JSONL file or pipe (e.g. <(zcat in.jsonl.gz)), '-' for stdin.")
@click.option("-o", "--output", "output_path", default="-", show_default=True, metavar="FILE",
              help="Output JSONL file, '-' for stdout. An existing non-empty file needs --resume or --overwrite.")
@click.option("--model", "model", default=None, metavar="PATH",
              help="Local checkpoint folder (shortcut for --set model=PATH; nothing is ever downloaded).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Shortcut for --set sampling.max_tokens=N.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="Shortcut for --set sampling.temperature=T.")
@click.option("--top-p", type=float, default=None, help="Shortcut for --set sampling.top_p=P.")
@click.option("--top-k", type=int, default=None, help="Shortcut for --set sampling.top_k=K.")
@SET_OPTION
@click.option("--resume", is_flag=True,
              help="Keep the finished lines of --output, cut a torn last line, and append the rest.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output instead of refusing to.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), default=None,
              help="Write the run summary (what ran, throughput, tokens, cache hit rate, errors) as JSON here, "
                   "also when interrupted.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def generate(config_path: str | None, input_path: str, output_path: str, model: str | None, max_tokens: int | None,
             temperature: float | None, top_p: float | None, top_k: int | None, overrides: tuple[str, ...],
             resume: bool, overwrite: bool, summary_path: str | None, progress: bool) -> None:
    """Generate completions for a JSONL file of prompts: one output line per input line, in order.

    The first stderr line says what runs: runtime, device, dtype, attention backend and model.

    \b
    Input lines (one JSON object each; exactly one of prompt / messages / prompt_token_ids):
      {"id": "q1", "prompt": "The capital of France is", "max_tokens": 16}
      {"id": "q2", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "seed": 1}
      {"id": "q3", "prompt_token_ids": [1, 2, 3], "stop": ["\\n"], "n": 2, "logprobs": 5}
      {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "..."}}
      {"custom_id": "r2", "method": "POST", "url": "/v1/chat/completions",
       "body": {"messages": [...], "logprobs": true, "top_logprobs": 2}}
    Sampling fields: max_tokens temperature top_p top_k seed stop stop_token_ids ignore_eos
    min_tokens n presence_penalty frequency_penalty repetition_penalty logprobs top_logprobs
    (defaults from the config's sampling section). logprobs: true, or an integer k = true with k
    alternatives per token (0..20); top_logprobs: k beside logprobs: true. OpenAI bodies spell
    them as OpenAI does (chat: logprobs true + top_logprobs, max_tokens or max_completion_tokens;
    completions: logprobs k); model and user are not used, stream must be false, custom_id is
    required. A message's content is a string or a list of text parts ({"type": "text", "text":
    ...}, joined by newlines; other parts are refused); a /v1/completions prompt may be a list
    holding one prompt (one string, or token ids).

    \b
    Output lines:
      {"id": "q1", "text": "...", "token_ids": [...], "finish_reason": "stop"|"length",
       "usage": {"prompt_tokens": 6, "completion_tokens": 16, "cached_tokens": 0}, "seed": 123}
      + "logprobs" when asked: OpenAI's completion shape {"tokens", "token_logprobs",
        "top_logprobs": [{tok: lp}], "text_offset"} for prompt lines, its chat shape {"content":
        [{"token", "logprob", "bytes", "top_logprobs", "token_id"}]} for messages lines
      + "choices": [{"index", "text", "token_ids", "finish_reason", "seed", "logprobs"}] when n > 1
        (text/token_ids/finish_reason/logprobs above are choice 0; usage counts all)
      + "warnings": ["..."] when the line was changed, e.g. max_tokens cut at max_model_len
      {"id": "q9", "error": {"type": "invalid_request", "message": "..."}, "line": 9}
    OpenAI batch lines come back in OpenAI's batch output format:
      {"id": "batch_req_...", "custom_id": "r1", "response": {"status_code": 200,
       "request_id": "...", "body": {text_completion or chat.completion object}}, "error": null}
      {"id": "batch_req_...", "custom_id": "r9", "response": null, "error": {"code", "message"}}
    A bad line gets an error line and the run goes on. Error types: invalid_json, invalid_request,
    unknown_field, duplicate_id, prompt_too_long, invalid_sampling, no_chat_template,
    no_tokenizer, token_out_of_range, engine_error. Blank lines (nothing but spaces, tabs,
    carriage returns or form feeds) are skipped: they get no output line and no count in the
    progress bar or summary, but line numbers ("line": N) count them, as an editor does. A prompt
    of max_model_len tokens or more is an error; a longer max_tokens is cut to fit, with a warning.
    Without a seed, a line gets one derived from the config seed and its line number. A model
    folder without tokenizer.json runs prompt_token_ids lines (text is null); lines that need
    text (prompt, messages, stop strings) get a no_tokenizer error.

    \b
    Resume: records are keyed by id (or custom_id); lines without an id, and repeated ids, are
    keyed by line number ("line": N in the record), so do not edit the input between runs.
    Output is flushed per line and fsynced every 2 s and at the end.

    \b
    Examples:
      paddle-mla generate -i prompts.jsonl -o out.jsonl --summary run.json
      paddle-mla generate --model ./DeepSeek-V2-Lite --max-tokens 32 --temperature 0.7 -i in.jsonl
      cat prompts.jsonl | paddle-mla generate --set sampling.max_tokens=32 > out.jsonl
      paddle-mla generate --config configs/prefix_caching.yaml -i big.jsonl -o out.jsonl --resume
    """
    from paddle_mla.cli.generate_command import GenerateArgs, GenerateUsageError, run
    from paddle_mla.parallel.launcher import TensorParallelError

    shortcuts = [f"model={json.dumps(model)}"] if model is not None else []
    for key, value in (("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                       ("top_k", top_k)):
        if value is not None:
            shortcuts.append(f"sampling.{key}={value!r}")
    args = GenerateArgs(config_path, input_path, output_path, (*overrides, *shortcuts), resume, overwrite,
                        summary_path, progress)
    try:
        code = run(args, select_runtime, lambda cfg: build_llm(cfg), request_class,
                   echo=lambda m: click.echo(m, err=True))
    except ConfigError as exc:
        _print_config_errors(exc)
    except GenerateUsageError as exc:
        _fail(str(exc))
    except TensorParallelError as exc:     # a worker died: one clear error, exit 1 (rerun with --resume)
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INTERNAL)
    sys.exit(code)


@main.command(short_help="Check config and workload files; print them resolved.", epilog="""\b
Exit codes:
  0    every file is valid
  2    some file has errors, or bad arguments (each error is printed, naming the file and key)
  130  interrupted by SIGINT""")
@click.argument("configs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@SET_OPTION
def validate(configs: tuple[str, ...], overrides: tuple[str, ...]) -> None:
    """Check config files and print each one fully resolved (defaults filled in) as YAML, with
    its run plan in comments after it: what the engine would build (runtime, device, dtype, quantization, attention
    backend, KV layout, memory budget, CUDA-graph sizes, max_model_len).

    A bench workload file (one workload with `kind`, or name: workload entries, such as
    configs/bench/workloads.yaml) is recognised and checked as workloads; --set does not apply to
    it. A config loads no weights: the model path is checked (a local folder whose config.json names
    a supported model, or tiny, built on first use), the runtime selected, and the plan resolved
    from the config and the checkpoint's config.json, with backend/feature combinations checked
    against the backend capability table. A config that names device: gpu is planned for a GPU on
    any machine; device auto is planned for this machine's device. A plan that does not resolve (a
    bench config's stand-in model, a device auto combination this machine cannot run) is noted, not
    an error: the checkpoint and the device are checked again at start-up.

    \b
    Examples:
      paddle-mla validate configs/tiny.yaml
      paddle-mla validate configs/*.yaml configs/bench/*.yaml
      paddle-mla validate configs/triton_mla.yaml --set cache.enable_prefix_caching=true
    """
    interrupts.arm()
    from paddle_mla.cli.validate_files import validate_files

    sys.exit(EXIT_USAGE if validate_files(configs, overrides) else EXIT_OK)


@main.command("make-tiny-model", short_help="Write a tiny random checkpoint to try things on CPU.", epilog="""\b
Exit codes:
  0    written (the folder is printed)
  2    bad arguments, OUT_DIR is not empty (without --force), or the runtime is not installed
  130  interrupted by SIGINT""")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Write into OUT_DIR even if it is not empty (its files of the same "
              "names are replaced, others stay).")
@click.option("--arch", type=click.Choice(["deepseek_v3", "deepseek_v2", "deepseek_v32"]), default="deepseek_v3",
              show_default=True,
              help="Model family of the tiny checkpoint.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
def make_tiny_model_cmd(out_dir: str, force: bool, arch: str, seed: int) -> None:
    """Write a tiny random checkpoint (config.json, safetensors, tokenizer) to OUT_DIR.

    It runs on CPU in seconds and is what the tests and the default config (model: tiny) use.
    Uses the runtime named by PADDLE_MLA_RUNTIME (default: auto). An OUT_DIR that already holds
    files is refused unless --force is given.

    \b
    Examples:
      paddle-mla make-tiny-model /tmp/tiny-v3
      paddle-mla make-tiny-model /tmp/tiny-v2 --arch deepseek_v2 --seed 1
      paddle-mla generate --set model=/tmp/tiny-v2 -i prompts.jsonl
    """
    interrupts.arm()
    from paddle_mla.cli.paths import nonempty_folder_problem
    from paddle_mla.platform import runtime

    problem = nonempty_folder_problem(out_dir, force)
    if problem:
        _fail(problem)
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
  0    done
  2    bad arguments, configuration or workload (each error is printed)
  130  interrupted by SIGINT""", short_help="Compare configs on a synthetic workload.")
@click.option("--config", "config_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A config to compare (repeatable; the first is the baseline of the ratios). "
                   "Default: the built-in tiny config.")
@click.option("--workload", "workload_spec", required=True,
              help="KIND:key=value,... (e.g. random:num_prompts=64) or FILE.yaml[#NAME]; kinds and "
                   "parameters below.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs per config, interleaved A B A B.")
@click.option("--warmup", "warmup_requests", type=click.IntRange(min=0), default=8, show_default=True,
              help="Requests of a warm-up run before timing each engine.")
@click.option("--engines", type=click.Choice(["auto", "keep", "rebuild"]), default="auto", show_default=True,
              help="keep: build each engine once and keep all; rebuild: build one per run and drop it "
                   "(auto: keep on CPU, rebuild on GPU where each engine sizes its cache from free memory, and "
                   "wherever two configs use tensor parallelism: a process holds one tensor-parallel group at a "
                   "time).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write all results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG plot here (needs matplotlib: pip install 'paddle-mla[plot]').")
@click.option("--check-determinism", is_flag=True,
              help="Instead of timing: run the workload through one config at batch 1 (the reference), batch "
                   "256, chunked prefill, prefix caching, a pool small enough to preempt and DP=2, and count "
                   "the requests whose tokens (or logprob bits) differ from batch 1's. With --set "
                   "deterministic=true every count should be 0.")
@SET_OPTION
def bench(config_paths: tuple[str, ...], workload_spec: str, repeats: int, warmup_requests: int, engines: str,
          json_path: str | None, plot_path: str | None, check_determinism: bool, overrides: tuple[str, ...]) -> None:
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
      paddle-mla bench --check-determinism --config configs/triton_mla.yaml --set deterministic=true \\
          --workload random:num_prompts=64,input_len=256,output_len=32
    """
    interrupts.arm()
    from paddle_mla.cli.bench.command import BenchArgs, BenchUsageError, run

    args = BenchArgs(config_paths, workload_spec, repeats, warmup_requests, engines, json_path, plot_path, overrides,
                     check_determinism)
    try:
        run(args, select_runtime, lambda cfg: build_llm(cfg), echo=lambda m: click.echo(m, err=True), out=click.echo)
    except ConfigError as exc:
        _print_config_errors(exc)
    except BenchUsageError as exc:
        _fail(str(exc))


if __name__ == "__main__":
    entry()
