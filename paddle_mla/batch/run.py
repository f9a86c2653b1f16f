"""The ``generate`` loop: input lines -> engine -> one output record per line, in input order.

Lines are parsed lazily inside the generator that ``LLM.stream`` consumes, so memory stays bounded
by the engine's lookahead. Lines that fail validation are held in the same FIFO as running
requests and written when everything before them is written; with nothing in flight they are
written at once.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from paddle_mla.batch.io import OutputWriter, input_key
from paddle_mla.batch.parse import Context, LineError, LineFormat, build_request, id_key, line_format, split_line
from paddle_mla.batch.records import TokenText, error_record, ok_record


@dataclass
class Item:
    line_no: int
    id_field: str
    id: Any
    request: Any = None            # GenerationRequest, or None when the line failed validation
    error: tuple[str, str] | None = None
    fmt: LineFormat | None = None  # output shape (set when the line validated)


@dataclass
class BatchSummary:
    requests: int = 0              # lines answered in this run (ok + errors)
    ok: int = 0
    errors: int = 0
    skipped: int = 0               # lines already answered by a previous run (--resume)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    warnings: int = 0              # lines whose output carries warnings (e.g. max_tokens cut)
    num_preemptions: int = 0
    peak_blocks_used: int = 0
    num_blocks: int = 0
    load_s: float = 0.0
    elapsed_s: float = 0.0
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    errors_by_type: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False      # stopped by SIGINT (the counts cover what was written)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.errors_by_type.items()))
        return (f"{self.requests} lines in {self.elapsed_s:.1f}s ({self.ok} ok, {self.errors} errors"
                f"{': ' + kinds if kinds else ''}; {self.skipped} already done) | "
                f"{f'{self.warnings} with warnings; ' if self.warnings else ''}"
                f"{self.requests_per_s:.2f} req/s, {self.output_tokens_per_s:.1f} output tok/s | "
                f"prompt {self.prompt_tokens} tok, completion {self.completion_tokens} tok, "
                f"prefix-cache hit {100 * self.prefix_cache_hit_rate:.1f}%, preemptions {self.num_preemptions}")


# tqdm's own rate is left out: it flips between s/req and req/s and would repeat the postfix's
# req/s, which is the run's mean rate (the number the summary reports).
_BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
_COUNTER_FORMAT = "{desc}: {n_fmt} req [{elapsed}{postfix}]"     # stdin: no total known


class _Progress:
    def __init__(self, total: int | None, initial: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="req", file=sys.stderr, dynamic_ncols=True,
                            smoothing=0.1, desc="generate",
                            bar_format=_COUNTER_FORMAT if total is None else _BAR_FORMAT)
        self.start = time.perf_counter()

    def update(self, summary: BatchSummary) -> None:
        if self.bar is None:
            return
        dt = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{summary.requests / dt:.2f} req/s, {summary.completion_tokens / dt:.1f} out tok/s",
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _items(lines: Iterable[tuple[int, bytes]], ctx: Context, done: set[str], summary: BatchSummary):
    """Parse lines into Items, skipping those already done; duplicate ids are checked across all."""
    seen: set[str] = set()
    for line_no, raw in lines:
        try:
            parsed = split_line(raw)
        except LineError as err:
            if input_key(None, line_no, True) in done:
                summary.skipped += 1
                continue
            yield Item(line_no, "id", None, error=(err.kind, err.message))
            continue
        duplicate = False
        if parsed.id is not None:
            k = id_key(parsed.id)
            duplicate = k in seen
            seen.add(k)
        if input_key(parsed.id, line_no, duplicate) in done:
            summary.skipped += 1
            continue
        item = Item(line_no, parsed.id_field, parsed.id)
        if duplicate:
            item.error = ("duplicate_id", f"{parsed.id_field} {id_key(parsed.id)} was already used by an earlier line")
        else:
            try:
                item.request = build_request(parsed, line_no, ctx)
                item.fmt = line_format(parsed)
            except LineError as err:
                item.error = (err.kind, err.message)
            except Exception as exc:  # noqa: BLE001  (a tokenizer failure on one odd line must not end the batch)
                item.error = ("invalid_request", f"{type(exc).__name__}: {exc}")
        yield item


def run_batch(llm: Any, lines: Iterable[tuple[int, bytes]], writer: OutputWriter, *, request_cls: type,
              done: set[str] = frozenset(), total: int | None = None, progress: bool = True,
              summary: BatchSummary | None = None) -> BatchSummary:
    """Answer every line; ``summary`` (created if not given) is filled in as lines are written and
    finished even when the run is interrupted, so the caller can report a partial run."""
    summary = summary if summary is not None else BatchSummary()
    errors: Counter[str] = Counter()
    ctx = Context(tokenizer=llm.tokenizer, max_model_len=llm.max_model_len, default_params=llm.default_params(),
                  request_cls=request_cls, base_seed=llm.config.seed)
    tokens = TokenText(llm.tokenizer)
    model = str(llm.config.model)
    bar = _Progress(total, len(done), progress)
    pending: deque[Item] = deque()

    def emit(item: Item, out: Any = None) -> None:
        if out is not None and out.finish_reason == "error":
            item.error = ("engine_error", out.error or "the engine could not run this request")
        if item.error is not None:
            kind, message = item.error
            writer.write(error_record(item.id_field, item.id, item.line_no, kind, message))
            summary.errors += 1
            errors[kind] += 1
        else:
            record = ok_record(item.id_field, item.id, item.line_no, out, item.fmt, tokens, model)
            writer.write(record)
            summary.ok += 1
            summary.warnings += bool(out.warnings)
            summary.prompt_tokens += len(out.prompt_token_ids)
            summary.completion_tokens += sum(len(c.token_ids) for c in out.outputs)
            summary.cached_tokens += out.metrics.num_cached_tokens
        summary.requests += 1
        bar.update(summary)

    def drain_errors() -> None:
        while pending and pending[0].request is None:
            emit(pending.popleft())

    def feed():
        for item in _items(lines, ctx, done, summary):
            if item.request is None and not pending:
                emit(item)
                continue
            pending.append(item)
            if item.request is not None:
                yield item.request

    start = time.perf_counter()
    try:
        for out in llm.stream(feed()):
            drain_errors()
            item = pending.popleft()
            if out.id != item.request.id:
                raise RuntimeError(f"engine returned request {out.id!r} out of order (expected {item.request.id!r})")
            emit(item, out)
            drain_errors()
        drain_errors()
    except KeyboardInterrupt:
        summary.interrupted = True
        raise
    finally:
        bar.close()
        writer.sync()
        _finish(summary, llm, errors, time.perf_counter() - start)
    return summary


def _finish(summary: BatchSummary, llm: Any, errors: Counter, elapsed_s: float) -> None:
    summary.elapsed_s = elapsed_s
    stats = llm.stats()
    summary.num_preemptions = stats.num_preemptions
    summary.peak_blocks_used = stats.peak_blocks_used
    summary.num_blocks = stats.num_blocks
    summary.requests_per_s = summary.requests / max(summary.elapsed_s, 1e-9)
    summary.output_tokens_per_s = summary.completion_tokens / max(summary.elapsed_s, 1e-9)
    summary.prefix_cache_hit_rate = summary.cached_tokens / summary.prompt_tokens if summary.prompt_tokens else 0.0
    summary.errors_by_type = dict(errors)
