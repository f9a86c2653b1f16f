"""Ray Data integration: one paddle-mla engine per Ray actor, as Ray's own LLM batch processors do.

``LLMPredictor`` is a callable class for ``ray.data.Dataset.map_batches``::

    import ray
    from paddle_mla.integrations.ray_data import LLMPredictor

    ds = ray.data.from_items([{"prompt": "The capital of France is", "sampling_params": {"max_tokens": 16}}])
    ds = ds.map_batches(LLMPredictor, fn_constructor_kwargs={"config": "configs/tiny.yaml"},
                        concurrency=4, num_gpus=1, batch_size=64)     # 4 actors, one engine (1 GPU) each
    ds.write_json("out/")

Ray places the actors (any host of the cluster) and gives each ``num_gpus`` GPUs; with
``parallel.tensor_parallel_size`` N in the config, give ``num_gpus=N``: the actor's engine starts its
own N-1 tensor-parallel workers on them. Data parallelism is Ray's ``concurrency`` (the config's
``data_parallel_size`` must stay 1 here).

Input columns, one request per row (the same fields as a ``generate`` input line, checked by the same
code): either ``json``, a whole JSONL input line (str or bytes), or the columns ``prompt`` (text) |
``prompt_token_ids`` | ``messages``, with optional ``id`` and ``sampling_params`` (a dict of the
sampling fields: max_tokens, temperature, seed, stop, n, logprobs, ...). An optional integer ``line``
column numbers the rows as input lines (the key of id-less rows, and the seed of unseeded sampled rows,
as in ``generate``); without it a row is numbered by its position in its batch, so give sampled rows a
``seed`` (or a ``line``) for reproducible outputs. Greedy rows do not depend on it.

Output columns, added to the input columns: ``generated_text``, ``generated_token_ids``,
``finish_reason`` ("stop" | "length" | "error"), ``num_input_tokens``, ``num_generated_tokens``,
``num_cached_tokens``, ``error`` (None or "type: message"), and ``record``: the JSON output line that
``paddle-mla generate`` writes for this row (plain or OpenAI batch format). Each batch runs as one
``generate`` run (a repeated id is flagged only within its batch).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from paddle_mla.config.schema import EngineConfig, load_config

REQUEST_COLUMNS = ("id", "prompt", "prompt_token_ids", "messages")


def _plain(value: Any) -> Any:
    """numpy / Arrow scalars and arrays in a row -> plain Python (JSON-serialisable) values."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def row_line(batch: dict[str, Any], i: int) -> bytes:
    """Row ``i`` of a batch as a ``generate`` input line."""
    if "json" in batch:
        raw = batch["json"][i]
        return raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
    obj: dict[str, Any] = {}
    for col in REQUEST_COLUMNS:
        if col in batch:
            value = _plain(batch[col][i])
            if value is not None and not (isinstance(value, float) and value != value):   # Arrow null / NaN
                obj[col] = value
    params = _plain(batch["sampling_params"][i]) if "sampling_params" in batch else None
    if params:
        obj.update(params)
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


class _Collect:
    """The OutputWriter of one batch: keeps the records in memory, in order."""

    def __init__(self):
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def sync(self) -> None:
        pass


class _Tap:
    """The engine, remembering each output by request id (the line number) as ``run_batch`` streams it."""

    def __init__(self, llm: Any):
        self._llm = llm
        self.outputs: dict[int, Any] = {}

    def stream(self, requests):
        for out in self._llm.stream(requests):
            self.outputs[out.id] = out
            yield out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


class LLMPredictor:
    """``map_batches`` callable class: builds one engine in the actor, answers each batch in order."""

    def __init__(self, config: str | EngineConfig | None = None, overrides: Sequence[str] = ()):
        cfg = config if isinstance(config, EngineConfig) else load_config(config, tuple(overrides))
        if cfg.parallel.data_parallel_size != 1:
            raise ValueError("under Ray Data, data parallelism is map_batches(concurrency=M): keep "
                             "parallel.data_parallel_size 1 in the actor's config")
        from paddle_mla.platform import runtime

        runtime.select(None if cfg.runtime == "auto" else cfg.runtime)
        from paddle_mla.engine.llm import LLM
        from paddle_mla.sched.request import GenerationRequest

        self.llm = LLM(cfg)
        self._request_cls = GenerationRequest

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from paddle_mla.batch.run import run_batch

        size = len(next(iter(batch.values()))) if batch else 0
        lines = [int(n) for n in batch["line"]] if "line" in batch else list(range(1, size + 1))
        if len(set(lines)) != len(lines):
            raise ValueError("the 'line' column must number the rows of a batch uniquely")
        tap, collect = _Tap(self.llm), _Collect()
        run_batch(tap, [(n, row_line(batch, i)) for i, n in enumerate(lines)], collect,
                  request_cls=self._request_cls, progress=False)
        if len(collect.records) != size:
            raise RuntimeError(f"{size} rows gave {len(collect.records)} records")
        cols: dict[str, list] = {k: [] for k in ("generated_text", "generated_token_ids", "finish_reason",
                                                 "num_input_tokens", "num_generated_tokens", "num_cached_tokens",
                                                 "error", "record")}
        for n, record in zip(lines, collect.records):
            out = tap.outputs.get(n)
            ok = out is not None and out.error is None
            error = record.get("error")
            cols["generated_text"].append(out.text if ok else None)
            cols["generated_token_ids"].append(np.asarray(out.token_ids if ok else [], dtype=np.int64))
            cols["finish_reason"].append(out.finish_reason if ok else "error")
            cols["num_input_tokens"].append(len(out.prompt_token_ids) if out is not None else 0)
            cols["num_generated_tokens"].append(sum(len(c.token_ids) for c in out.outputs) if ok else 0)
            cols["num_cached_tokens"].append(out.metrics.num_cached_tokens if ok else 0)
            cols["error"].append(None if not isinstance(error, dict) else
                                 f"{error.get('type', error.get('code'))}: {error.get('message')}")
            cols["record"].append(json.dumps(record, ensure_ascii=False))
        result = dict(batch)
        for k, values in cols.items():
            arr = np.empty(size, dtype=object)
            for i, v in enumerate(values):      # one by one: equal-length token arrays must not become 2-D
                arr[i] = v
            result[k] = arr if k in ("generated_text", "generated_token_ids", "error", "record") else np.asarray(values)
        return result
