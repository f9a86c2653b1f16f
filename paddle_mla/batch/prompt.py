"""The prompt of a line: ``prompt`` / ``messages`` / ``prompt_token_ids`` -> token ids, or the
LineError that says what is wrong with it (``parse`` checks the rest of the line).

Text must be valid Unicode: JSON can spell a lone surrogate (``"\\ud800"``), which no tokenizer
encodes. ``messages`` content is a string or OpenAI's list of parts, of which text parts are read
(joined by newlines, as vLLM joins them for a text-only model) and any other part is refused. An
OpenAI completions ``prompt`` may be a list holding one prompt.
"""

from __future__ import annotations

import json
from typing import Any

from paddle_mla.engine.tokenizer import NoTokenizerError

PROMPT_FIELDS = ("prompt", "messages", "prompt_token_ids")
MESSAGE_ROLES = ("system", "user", "assistant", "tool", "developer")


class LineError(Exception):
    """A line that cannot run; ``kind`` is the error type written to the output."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(is_int(t) for t in v)


def check_unicode(text: str, where: str) -> str:
    """``text``, refused (naming ``where``) if it holds a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LineError("invalid_request", f"{where} is not valid Unicode: lone surrogate "
                        f"\\u{ord(text[exc.start]):04x} at character {exc.start + 1}") from None
    return text


def chat_message(i: int, msg: Any) -> dict[str, Any]:
    """``messages[i]`` checked, with its content as one string. Content given as OpenAI's list of
    parts is its text parts joined by newlines (as vLLM joins them for a text-only model); other
    parts (images, audio, files) are refused: the models here read text only."""
    if not isinstance(msg, dict) or msg.get("role") not in MESSAGE_ROLES or \
            not isinstance(msg.get("content"), (str, list)):
        raise LineError("invalid_request", f"messages[{i}] must be an object with 'role' (one of "
                        f"{', '.join(MESSAGE_ROLES)}) and a 'content' string or list of text parts, "
                        f"got {json.dumps(msg)[:200]}")
    content = msg["content"]
    if isinstance(content, list):
        if not content:
            raise LineError("invalid_request", f"messages[{i}].content is an empty list")
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(check_unicode(part["text"], f"messages[{i}].content[{j}].text"))
            elif isinstance(kind, str) and kind != "text":
                raise LineError("invalid_request", f"messages[{i}].content[{j}] is a part of type {kind!r}; this "
                                "engine reads text only (parts of type 'text')")
            else:
                raise LineError("invalid_request", f"messages[{i}].content[{j}] must be "
                                f'{{"type": "text", "text": "..."}}, got {json.dumps(part)[:200]}')
        return {**msg, "content": "\n".join(texts)}
    check_unicode(content, f"messages[{i}].content")
    return msg


def prompt_ids(fields: dict[str, Any], tokenizer: Any) -> tuple[list[int], str | None]:
    """The token ids of the one prompt field of ``fields``, and its text for a ``prompt``."""
    given = [f for f in PROMPT_FIELDS if fields.get(f) is not None]
    if not given:
        raise LineError("invalid_request", "missing prompt: give one of 'prompt', 'messages', 'prompt_token_ids'")
    if len(given) > 1:
        raise LineError("invalid_request", f"give only one of {', '.join(PROMPT_FIELDS)}; got {' and '.join(given)}")
    field = given[0]
    value = fields[field]
    vocab = tokenizer.vocab_size
    if field == "prompt":
        if not isinstance(value, str):
            raise LineError("invalid_request", f"'prompt' must be a string, got {type(value).__name__}"
                            " (token ids go in 'prompt_token_ids')")
        if not value:
            raise LineError("invalid_request", "'prompt' is empty")
        check_unicode(value, "'prompt'")
        try:
            ids = list(tokenizer.encode(value))
        except NoTokenizerError as exc:
            raise LineError("no_tokenizer", str(exc)) from None
        if not ids:
            raise LineError("invalid_request", "'prompt' encodes to no tokens")
        return ids, value
    if field == "messages":
        if not isinstance(value, list) or not value:
            raise LineError("invalid_request", "'messages' must be a non-empty list of {role, content} objects")
        messages = [chat_message(i, msg) for i, msg in enumerate(value)]
        try:
            ids = list(tokenizer.apply_chat_template(messages))
        except NoTokenizerError as exc:
            raise LineError("no_tokenizer", str(exc)) from None
        except ValueError as exc:
            raise LineError("no_chat_template", f"cannot use 'messages': {exc}; send 'prompt' instead") from None
        return ids, None
    if not is_token_ids(value) or not value:
        raise LineError("invalid_request", "'prompt_token_ids' must be a non-empty list of integers")
    bad = next((t for t in value if not 0 <= t < vocab), None)
    if bad is not None:
        raise LineError("token_out_of_range", f"'prompt_token_ids' holds {bad}, outside the vocabulary [0, {vocab})")
    return list(value), None


def one_prompt(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI completions body whose ``prompt`` is a list, as OpenAI allows, with that prompt as
    this parser takes it: a list of one string is that string, a list of token ids (or a list of
    one such list) is ``prompt_token_ids``. Several prompts are refused: a line gets one answer. With
    ``prompt_token_ids`` given too, the body is left for ``prompt_ids``' one-field check."""
    if body.get("prompt_token_ids") is not None:
        return body
    prompt = body["prompt"]
    if not prompt:
        raise LineError("invalid_request", "'prompt' is an empty list")
    if is_token_ids(prompt):
        ids = prompt
    elif len(prompt) == 1 and isinstance(prompt[0], str):
        return {**body, "prompt": prompt[0]}
    elif len(prompt) == 1 and is_token_ids(prompt[0]) and prompt[0]:
        ids = prompt[0]
    elif all(isinstance(p, str) or is_token_ids(p) for p in prompt):
        raise LineError("invalid_request", f"'prompt' holds {len(prompt)} prompts; give one prompt per line "
                        "(each line is answered by one completion object)")
    else:
        raise LineError("invalid_request", "'prompt' must be a string, a list of one string, or a list of "
                        "token ids")
    return {**body, "prompt": None, "prompt_token_ids": ids}
