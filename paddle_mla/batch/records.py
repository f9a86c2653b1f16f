"""Output records of ``generate``: plain lines, and OpenAI batch lines in OpenAI's batch output format.

Plain (one per input line)::

    {"id", ["line"], "text", "token_ids", "finish_reason", "usage": {"prompt_tokens",
     "completion_tokens", "cached_tokens"}, "seed", ["logprobs"], ["choices"], ["warnings"]}

``text``, ``token_ids``, ``finish_reason``, ``seed`` and ``logprobs`` are those of completion 0;
with ``n`` > 1, ``choices`` lists all n as {"index", "text", "token_ids", "finish_reason",
"seed", ["logprobs"]} and ``usage.completion_tokens`` counts them all. ``logprobs`` (when asked
for) has OpenAI's completion shape for prompt / prompt_token_ids lines and its chat shape for
messages lines; plain records add the token ids (``token_id`` in chat entries); without a
tokenizer, token strings, ``bytes`` and ``text_offset`` are null and completion-shape
``top_logprobs`` keys are ``"token_id:N"`` (vLLM's spelling).

OpenAI batch lines (``custom_id`` / ``body``) are answered as OpenAI's Batch API does::

    {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id",
     "body": <text_completion | chat.completion>}, "error": null}
    {"id": "batch_req_...", "custom_id", "response": null, "error": {"code", "message"}, "line"}

OpenAI bodies spell a token without a tokenizer as ``"token_id:N"`` everywhere (their
``text`` / ``content`` is then null).

Error records of plain lines: {"id", "error": {"type", "message"}, "line"}. ``warnings`` (e.g.
max_tokens cut at max_model_len) is added to either kind when the engine gave any.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from paddle_mla.batch.parse import LineFormat

TOKEN_ID_PREFIX = "token_id:"


def _hex(*parts: Any, n: int = 24) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:n]


class TokenText:
    """Token strings for logprobs (cached per id); None without a tokenizer."""

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer if getattr(tokenizer, "has_text", True) and hasattr(tokenizer, "token_text") else None
        self._cache: dict[int, str] = {}

    @property
    def available(self) -> bool:
        return self._tok is not None

    def __call__(self, token_id: int) -> str | None:
        if self._tok is None:
            return None
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tok.token_text(token_id)
        return text

    def key(self, token_id: int) -> str:
        """A token as a JSON object key: its text, or ``token_id:N`` without a tokenizer."""
        text = self(token_id)
        return f"{TOKEN_ID_PREFIX}{token_id}" if text is None else text


def completion_logprobs(lps: list[Any], tokens: TokenText, plain: bool) -> dict[str, Any]:
    """OpenAI completions ``logprobs``: tokens, token_logprobs, top_logprobs [{tok: lp}], text_offset."""
    texts = [tokens(lp.token_id) if plain else tokens.key(lp.token_id) for lp in lps]
    offsets = None
    if tokens.available:
        offsets, at = [], 0
        for t in texts:
            offsets.append(at)
            at += len(t)
    return {
        "tokens": texts,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{tokens.key(t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def _chat_entry(token_id: int, logprob: float, tokens: TokenText, plain: bool) -> dict[str, Any]:
    text = tokens(token_id) if plain else tokens.key(token_id)
    entry: dict[str, Any] = {"token": text, "logprob": logprob,
                             "bytes": list(text.encode("utf-8")) if text is not None else None}
    if plain:
        entry["token_id"] = token_id
    return entry


def chat_logprobs(lps: list[Any], tokens: TokenText, plain: bool) -> dict[str, Any]:
    """OpenAI chat ``logprobs``: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    content = []
    for lp in lps:
        entry = _chat_entry(lp.token_id, lp.logprob, tokens, plain)
        entry["top_logprobs"] = [_chat_entry(t, v, tokens, plain) for t, v in lp.top]
        content.append(entry)
    return {"content": content}


def _logprobs(choice: Any, fmt: LineFormat, tokens: TokenText, plain: bool) -> dict[str, Any] | None:
    if choice.logprobs is None:
        return None
    return (chat_logprobs if fmt.chat else completion_logprobs)(choice.logprobs, tokens, plain)


def _usage(out: Any) -> tuple[int, int, int]:
    completion = sum(len(c.token_ids) for c in out.outputs)
    return len(out.prompt_token_ids), completion, out.metrics.num_cached_tokens


def plain_record(id_field: str, ident: Any, line_no: int, out: Any, fmt: LineFormat, tokens: TokenText) -> dict:
    rec: dict[str, Any] = {id_field: ident}
    if ident is None:
        rec["line"] = line_no
    first = out.outputs[0]
    prompt, completion, cached = _usage(out)
    rec.update(text=first.text, token_ids=list(first.token_ids), finish_reason=first.finish_reason,
               usage={"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached},
               seed=out.seed)
    if first.logprobs is not None:
        rec["logprobs"] = _logprobs(first, fmt, tokens, plain=True)
    if len(out.outputs) > 1:
        rec["choices"] = []
        for c in out.outputs:
            choice = {"index": c.index, "text": c.text, "token_ids": list(c.token_ids),
                      "finish_reason": c.finish_reason, "seed": c.seed}
            if c.logprobs is not None:
                choice["logprobs"] = _logprobs(c, fmt, tokens, plain=True)
            rec["choices"].append(choice)
    if out.warnings:
        rec["warnings"] = list(out.warnings)
    return rec


def openai_body(out: Any, fmt: LineFormat, tokens: TokenText, model: str, key: str) -> dict[str, Any]:
    """A text_completion or chat.completion object (OpenAI's field names)."""
    choices = []
    for c in out.outputs:
        text = c.text
        choice: dict[str, Any] = {"index": c.index}
        if fmt.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = _logprobs(c, fmt, tokens, plain=False)
        choice["finish_reason"] = c.finish_reason
        choices.append(choice)
    prompt, completion, cached = _usage(out)
    return {
        "id": ("chatcmpl-" if fmt.chat else "cmpl-") + key,
        "object": "chat.completion" if fmt.chat else "text_completion",
        "created": int(time.time()),
        "model": fmt.model or model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }


def openai_record(custom_id: Any, line_no: int, out: Any, fmt: LineFormat, tokens: TokenText, model: str) -> dict:
    key = _hex(custom_id, line_no)
    rec: dict[str, Any] = {
        "id": f"batch_req_{key}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"req_{_hex('request', custom_id, line_no)}",
                     "body": openai_body(out, fmt, tokens, model, key)},
        "error": None,
    }
    if custom_id is None:
        rec["line"] = line_no
    if out.warnings:
        rec["warnings"] = list(out.warnings)
    return rec


def error_record(id_field: str, ident: Any, line_no: int, kind: str, message: str) -> dict[str, Any]:
    if id_field == "custom_id":
        return {"id": f"batch_req_{_hex(ident, line_no)}", "custom_id": ident, "response": None,
                "error": {"code": kind, "message": message}, "line": line_no}
    return {id_field: ident, "error": {"type": kind, "message": message}, "line": line_no}


def ok_record(id_field: str, ident: Any, line_no: int, out: Any, fmt: LineFormat | None = None,
              tokens: TokenText | None = None, model: str = "") -> dict[str, Any]:
    fmt = fmt or LineFormat(openai=id_field == "custom_id", chat=False)
    tokens = tokens or TokenText(None)
    if fmt.openai:
        return openai_record(ident, line_no, out, fmt, tokens, model)
    return plain_record(id_field, ident, line_no, out, fmt, tokens)


# -- reading records back (resume) -------------------------------------------------------------
def record_ident(record: dict[str, Any]) -> Any:
    """The input id a record answers: custom_id for OpenAI records (their "id" is the batch_req id)."""
    return record["custom_id"] if "custom_id" in record else record.get("id")


def record_error_kind(record: dict[str, Any]) -> str | None:
    error = record.get("error")
    if not isinstance(error, dict):
        return None
    return error.get("type", error.get("code"))


def is_output_record(record: dict[str, Any]) -> bool:
    """A finished record of ``generate`` (ok or error, plain or OpenAI)."""
    if "response" in record and "error" in record:
        return isinstance(record["response"], dict) or isinstance(record["error"], dict)
    return "error" in record or "finish_reason" in record


def is_error_record(record: dict[str, Any]) -> bool:
    return isinstance(record.get("error"), dict)
