"""Tokenizer of a model folder: ``tokenizer.json`` (HF tokenizers) + ``tokenizer_config.json``.

Pure Python (no tensors), so it imports without a runtime. Chat prompts are rendered with the
folder's jinja2 ``chat_template`` in a sandbox, as transformers does. A folder without
``tokenizer.json`` gets a ``TokenIdsOnly`` stand-in (``load_tokenizer``): prompts must then be
token ids, and texts are None.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):       # {"content": "<s>", ...} in many HF configs
        return value.get("content")
    return value


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _eos_from_configs(path: Path) -> list[int]:
    eos: list[int] = []
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.exists():
            for e in _ids(json.loads(f.read_text()).get("eos_token_id")):
                if e not in eos:
                    eos.append(e)
    return eos


class NoTokenizerError(ValueError):
    """Raised for anything that needs text when the model folder has no tokenizer.json."""


class TokenIdsOnly:
    """Stands in for the tokenizer of a folder without ``tokenizer.json``: the vocabulary size and
    eos ids come from ``config.json``; ``decode`` returns None (outputs carry no text)."""

    has_text = False
    chat_template = None
    bos_token_id = None

    def __init__(self, path: str | Path, vocab_size: int, eos_token_ids: list[int]):
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids

    @classmethod
    def from_dir(cls, path: str | Path) -> TokenIdsOnly:
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        return cls(path, int(cfg["vocab_size"]), _eos_from_configs(path))

    def _missing(self, what: str) -> NoTokenizerError:
        return NoTokenizerError(f"{what} needs a tokenizer, and the model folder {self.path} has no tokenizer.json; "
                                "give 'prompt_token_ids' instead")

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        raise self._missing("a text prompt")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        raise self._missing("'messages'")

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        raise self._missing("'messages'")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> None:
        return None

    def token_text(self, token_id: int) -> None:
        return None


def load_tokenizer(path: str | Path) -> Tokenizer | TokenIdsOnly:
    """The folder's tokenizer, or a ``TokenIdsOnly`` stand-in when it has no tokenizer.json."""
    path = Path(path)
    if (path / "tokenizer.json").exists():
        return Tokenizer.from_dir(path)
    return TokenIdsOnly.from_dir(path)


class Tokenizer:
    has_text = True

    def __init__(self, tok: Any, config: dict, eos_token_ids: list[int] | None = None):
        self._tok = tok
        self.config = config
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token_id = tok.token_to_id(self.bos_token) if self.bos_token else None
        eos = list(eos_token_ids or [])
        eos_id = tok.token_to_id(self.eos_token) if self.eos_token else None
        if eos_id is not None and eos_id not in eos:
            eos.append(eos_id)
        self.eos_token_ids = eos
        self.add_bos_token = bool(config.get("add_bos_token", self.bos_token_id is not None))
        self.chat_template = config.get("chat_template")

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        tok = HFTokenizer.from_file(str(tok_file))
        cfg_file = path / "tokenizer_config.json"
        config = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        template_file = path / "chat_template.jinja"
        if not config.get("chat_template") and template_file.exists():
            config["chat_template"] = template_file.read_text()
        return cls(tok, config, _eos_from_configs(path))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            add_bos = self.add_bos_token
        if add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's text as it appears in the output (specials spelled out), for logprobs."""
        return self._tok.decode([int(token_id)], skip_special_tokens=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer_config.json has no 'chat_template'); "
                             "pass plain prompts instead of chat messages")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template error: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        template = env.from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (the template writes the BOS itself, so none is added)."""
        return self.encode(self.render_chat(messages, add_generation_prompt), add_bos=False)
