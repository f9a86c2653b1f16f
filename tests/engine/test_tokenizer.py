"""Tokenizer: byte-level round trip, specials, chat template (pure Python, no tensors)."""

import json

import pytest

from paddle_mla.models.tiny import BOS, EOS, make_tiny_model
from paddle_mla.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_tok"))


@pytest.mark.parametrize("text", ["Hello, world!", "  leading spaces\nand\ttabs", "unicode: héllo 世界 🚀",
                                  "", "The quick brown fox jumps over the lazy dog."])
def test_round_trip(tiny_dir, text):
    tok = Tokenizer.from_dir(tiny_dir)
    ids = tok.encode(text, add_bos=False)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_bos_eos_and_vocab(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert tok.vocab_size == cfg["vocab_size"]
    assert tok.bos_token_id == cfg["bos_token_id"]
    assert cfg["eos_token_id"] in tok.eos_token_ids
    ids = tok.encode("hi")
    assert ids[0] == tok.bos_token_id
    assert tok.encode("hi", add_bos=False) == ids[1:]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == BOS + "hi"


def test_common_words_are_merged(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    assert len(tok.encode("the quick brown fox", add_bos=False)) < len("the quick brown fox")


def test_chat_template(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    text = tok.render_chat(msgs)
    assert text == BOS + "Be brief.\n\nUser: Hi\n\nAssistant: Hello" + EOS + "User: Bye\n\nAssistant:"
    ids = tok.apply_chat_template(msgs)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_ids[0] in ids               # special tokens in the text map to their ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_no_chat_template_is_a_clear_error(tiny_dir, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    tok = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
