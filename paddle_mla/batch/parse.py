"""One JSONL input line -> a validated engine request, or an error naming what is wrong.

Accepted forms (one JSON object per line)::

    {"id": "a", "prompt": "Hello", "max_tokens": 16, ...sampling fields}
    {"id": "b", "messages": [{"role": "user", "content": "Hi"}]}
    {"id": "c", "prompt_token_ids": [1, 2, 3]}
    {"custom_id": "d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "..", "model": ".."}}
    {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [..]}}

Exactly one of prompt / messages / prompt_token_ids (checked in ``prompt``: message content may be
OpenAI's list of text parts, an OpenAI completions prompt a list holding one prompt). Sampling
fields: see ``SAMPLING_FIELDS``; a JSON null means "use the config default". ``logprobs``: on plain
lines true/false or an integer k (logprobs with k alternatives, as OpenAI completions), with
``top_logprobs: k`` beside true; in an OpenAI body, as OpenAI has it: chat ``logprobs: true`` +
``top_logprobs: k``, completions ``logprobs: k``. An OpenAI line needs its ``custom_id``; chat
bodies may spell the limit ``max_completion_tokens`` (OpenAI's current name; not with
``max_tokens``); ``user`` is accepted and ignored, ``stream`` must be false (a batch answers whole
responses). A key repeated in one object is an error; its line keeps its id unless the id itself is
given twice with different values. Length policy (as vLLM): a prompt of max_model_len tokens or more
is an error; a longer max_tokens is cut by the engine, which says so in the output's warnings. A
request without a seed gets one derived from the config seed and its line number, so reruns and
resumed runs sample the same tokens. A model without a tokenizer runs only ``prompt_token_ids``
lines without stop strings (the others get a ``no_tokenizer`` error).

This module imports no tensor library: the caller passes the engine's tokenizer, the default
SamplingParams and the GenerationRequest class.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paddle_mla.batch.prompt import PROMPT_FIELDS, LineError, is_int, is_token_ids, one_prompt, prompt_ids

# field -> (type check, description used in messages)
_INT = (is_int, "an integer")
_NUM = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), "a finite number")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_STOP = (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
         "a string or a list of strings")
_IDS = (is_token_ids, "a list of integers")
_LOGPROBS = (lambda v: _BOOL[0](v) or _INT[0](v), "true, false or an integer (alternatives per token)")
SAMPLING_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_tokens": _INT, "temperature": _NUM, "top_p": _NUM, "top_k": _INT, "seed": _INT,
    "stop": _STOP, "stop_token_ids": _IDS, "ignore_eos": _BOOL, "min_tokens": _INT,
    "n": _INT, "presence_penalty": _NUM, "frequency_penalty": _NUM, "repetition_penalty": _NUM,
    "logprobs": _LOGPROBS, "top_logprobs": _INT,
}
PLAIN_FIELDS = ("id", *PROMPT_FIELDS, *SAMPLING_FIELDS)
OPENAI_FIELDS = ("custom_id", "method", "url", "body")
COMPLETIONS_URL, CHAT_URL = "/v1/completions", "/v1/chat/completions"
# OpenAI's own spelling per endpoint: completions take ``logprobs: k``, chat ``logprobs: bool`` + ``top_logprobs``
# and may name the limit ``max_completion_tokens``; ``user`` and ``stream`` are request metadata
BODY_FIELDS = {
    COMPLETIONS_URL: tuple(f for f in ("model", "user", "stream", *PROMPT_FIELDS, *SAMPLING_FIELDS)
                           if f not in ("messages", "top_logprobs")),
    CHAT_URL: tuple(f for f in ("model", "user", "stream", *PROMPT_FIELDS, *SAMPLING_FIELDS, "max_completion_tokens")
                    if f not in ("prompt", "prompt_token_ids")),
}
MAX_TOP_LOGPROBS = 20                 # as engine.request.MAX_TOP_LOGPROBS (this module imports no engine code)


@dataclass
class Context:
    """What validating a line needs from the engine (built once per run)."""

    tokenizer: Any                 # encode / apply_chat_template / vocab_size
    max_model_len: int
    default_params: Any            # SamplingParams from the config's sampling section
    request_cls: type              # GenerationRequest
    base_seed: int = 0


@dataclass
class LineFormat:
    """How a line's answer is written: plain or OpenAI batch, completion or chat shape."""

    openai: bool
    chat: bool                     # messages (chat.completion / chat logprobs) vs prompt (text_completion)
    model: str | None = None       # the OpenAI body's "model", echoed in its response


@dataclass
class Parsed:
    """A JSON object whose id is known and well-typed; the rest is checked by ``build_request``."""

    id_field: str                  # "id" or "custom_id": the key echoed in the output
    id: Any                        # None when the line has no id
    fields: dict[str, Any]         # the whole JSON object
    # a fault found while parsing that leaves the id known (a repeated key): ``build_request``
    # raises it, so the error line keeps its id and is keyed by it as every other error line is
    problem: LineError | None = None


def id_key(value: Any) -> str:
    """Canonical key of an id (1 and "1" differ, as they do in JSON)."""
    return json.dumps(value, sort_keys=True)


def derive_seed(base_seed: int, line_no: int) -> int:
    digest = hashlib.sha256(f"{base_seed}:{line_no}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _unknown(name: str, valid: tuple[str, ...], where: str) -> LineError:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid fields: {', '.join(valid)}"
    return LineError("unknown_field", f"unknown field '{name}'{where}{hint}")


class _RepeatedKeys:
    """``object_pairs_hook`` noting repeated keys: JSON parsers differ on a repeated key (the last
    wins in Python's), so a line that repeats one is refused rather than read one way silently.
    Objects complete inside out, so the last object built is the line's own: its repeated keys
    say whether the id is still known (one value, however often it is given) or not."""

    def __init__(self) -> None:
        self.first: str | None = None                  # the first repeated key of the line
        self.outer: dict[str, list[Any]] = {}          # repeated key -> its values, in the last object built

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        repeated: dict[str, list[Any]] = {}
        for key, value in pairs:
            if key in obj:
                self.first = self.first or key
                repeated.setdefault(key, [obj[key]]).append(value)
            else:
                obj[key] = value
        self.outer = repeated
        return obj


def split_line(raw: bytes) -> Parsed:
    """Decode and parse one line and pick out its id. Raises LineError (id unknown)."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")   # a byte-order mark (editors add one to a file)
    except UnicodeDecodeError as exc:
        raise LineError("invalid_json", f"line is not valid UTF-8: {exc}") from None
    repeats = _RepeatedKeys()
    try:
        obj = json.loads(text, object_pairs_hook=repeats)
    except json.JSONDecodeError as exc:
        raise LineError("invalid_json", f"line is not valid JSON: {exc}") from None
    except RecursionError:
        raise LineError("invalid_json", "line is not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise LineError("invalid_request", f"a line must be a JSON object, got {type(obj).__name__}")
    id_field = "custom_id" if "custom_id" in obj or "body" in obj else "id"
    ident = obj.get(id_field)
    problem = None
    if repeats.first is not None:
        problem = LineError("invalid_json", f"key '{repeats.first}' appears twice in one object")
        if len({id_key(v) for v in repeats.outer.get(id_field, [ident])}) > 1:
            ident = None                               # two different ids: the line is keyed by its number
    if ident is not None and not (isinstance(ident, str) or _INT[0](ident)):
        if problem is not None:
            raise problem
        raise LineError("invalid_request", f"'{id_field}' must be a string or an integer, got {json.dumps(ident)}")
    return Parsed(id_field, ident, obj, problem)


def _body(parsed: Parsed) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request fields of a line and the names valid there (OpenAI lines: checked envelope)."""
    if parsed.id_field == "id":
        return parsed.fields, PLAIN_FIELDS
    for name in parsed.fields:
        if name not in OPENAI_FIELDS:
            raise _unknown(str(name), OPENAI_FIELDS, " in an OpenAI batch line")
    if parsed.id is None:
        raise LineError("invalid_request", "an OpenAI batch line needs a 'custom_id' (a string) to match its answer")
    body = parsed.fields.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "'body' must be a JSON object holding the request")
    method = parsed.fields.get("method", "POST")
    if method != "POST":
        raise LineError("invalid_request", f"'method' must be \"POST\", got {json.dumps(method)}")
    url = parsed.fields.get("url")
    if url not in BODY_FIELDS:
        raise LineError("invalid_request", f"url {json.dumps(url)} is not supported; use {COMPLETIONS_URL!r} "
                        f"or {CHAT_URL!r}")
    if url == COMPLETIONS_URL and body.get("messages") is not None:
        raise LineError("invalid_request", f"'messages' go to {CHAT_URL!r}; {COMPLETIONS_URL!r} takes 'prompt'")
    if url == CHAT_URL and body.get("messages") is None and any(body.get(f) is not None for f in PROMPT_FIELDS):
        raise LineError("invalid_request", f"{CHAT_URL!r} takes 'messages'; prompts go to {COMPLETIONS_URL!r}")
    if url == COMPLETIONS_URL and isinstance(body.get("prompt"), list):
        body = one_prompt(body)
    if body.get("stream") not in (None, False):
        raise LineError("invalid_request", f"'stream' must be false in a batch (each answer is written whole), "
                        f"got {json.dumps(body['stream'])}")
    limit = body.get("max_completion_tokens") if url == CHAT_URL else None
    if limit is not None:
        if not _INT[0](limit):
            raise LineError("invalid_request", f"'max_completion_tokens' must be an integer, got {json.dumps(limit)}")
        if body.get("max_tokens") is not None:
            raise LineError("invalid_request", "give 'max_completion_tokens' or 'max_tokens', not both")
        body = {**{k: v for k, v in body.items() if k != "max_completion_tokens"}, "max_tokens": limit}
    return body, BODY_FIELDS[url]


def line_format(parsed: Parsed) -> LineFormat:
    """The output shape of a line that passed ``build_request``."""
    if parsed.id_field == "id":
        return LineFormat(openai=False, chat=parsed.fields.get("messages") is not None)
    body = parsed.fields["body"]
    model = body.get("model")
    return LineFormat(openai=True, chat=parsed.fields["url"] == CHAT_URL,
                      model=model if isinstance(model, str) else None)


def _logprob_params(fields: dict[str, Any], valid: tuple[str, ...]) -> dict[str, Any]:
    """``logprobs`` / ``top_logprobs`` -> SamplingParams(logprobs, top_logprobs) updates."""
    lp, top = fields.get("logprobs"), fields.get("top_logprobs")
    openai_chat = valid is BODY_FIELDS[CHAT_URL]
    openai_completions = valid is BODY_FIELDS[COMPLETIONS_URL]
    if lp is None:
        if top is not None:
            raise LineError("invalid_request", "'top_logprobs' needs 'logprobs': true")
        return {}
    if openai_chat and not _BOOL[0](lp):
        raise LineError("invalid_request", f"'logprobs' must be true or false on {CHAT_URL} "
                        f"(alternatives go in 'top_logprobs'), got {json.dumps(lp)}")
    if openai_completions and not _INT[0](lp):
        raise LineError("invalid_request", f"'logprobs' must be an integer on {COMPLETIONS_URL} "
                        f"(the number of alternatives per token, 0 for none), got {json.dumps(lp)}")
    if _INT[0](lp):
        if top is not None:
            raise LineError("invalid_request",
                            "give 'logprobs: k' or 'logprobs: true' with 'top_logprobs: k', not both")
        enabled, top = True, lp
    else:
        enabled, top = lp, top or 0
        if top and not enabled:
            raise LineError("invalid_request", "'top_logprobs' needs 'logprobs': true")
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise LineError("invalid_sampling", f"alternatives per token ('top_logprobs' / integer 'logprobs') must be "
                        f"in [0, {MAX_TOP_LOGPROBS}], got {top}")
    return {"logprobs": enabled, "top_logprobs": top if enabled else 0}


def build_request(parsed: Parsed, line_no: int, ctx: Context) -> Any:
    """Validate the request body of a line; return a GenerationRequest (id = line_no)."""
    if parsed.problem is not None:
        raise parsed.problem
    fields, valid = _body(parsed)
    for name in fields:
        if name not in valid:
            raise _unknown(str(name), valid, "")
    updates: dict[str, Any] = {}
    for name, (check, desc) in SAMPLING_FIELDS.items():
        value = fields.get(name)
        if value is None or name in ("logprobs", "top_logprobs"):
            continue
        if not check(value):
            raise LineError("invalid_request", f"'{name}' must be {desc}, got {json.dumps(value)}")
        updates[name] = [value] if name == "stop" and isinstance(value, str) else value
    for name in ("logprobs", "top_logprobs"):
        value = fields.get(name)
        check, desc = SAMPLING_FIELDS[name]
        if value is not None and not check(value):
            raise LineError("invalid_request", f"'{name}' must be {desc}, got {json.dumps(value)}")
    updates.update(_logprob_params(fields, valid))
    if updates.get("stop") and not getattr(ctx.tokenizer, "has_text", True):
        raise LineError("no_tokenizer", "'stop' strings need a tokenizer, and the model folder has no "
                        "tokenizer.json; use 'stop_token_ids'")
    ids, prompt = prompt_ids(fields, ctx.tokenizer)
    limit = ctx.max_model_len
    if len(ids) >= limit:
        raise LineError("prompt_too_long", f"the prompt has {len(ids)} tokens; max_model_len is {limit}, so a prompt "
                        f"may have at most {limit - 1} tokens")
    params = dataclasses.replace(ctx.default_params, **updates)
    if params.seed is None:
        params.seed = derive_seed(ctx.base_seed, line_no)
    try:
        params.validate()
    except ValueError as exc:
        raise LineError("invalid_sampling", str(exc)) from None
    # max_tokens beyond max_model_len - prompt is cut by the engine, which warns on the output
    return ctx.request_cls(id=line_no, prompt_token_ids=ids, params=params, prompt=prompt)
