"""Stop strings through the bounded-window matcher stop where the full decode stopped, with the same text.

The reference is the old rule: after each token, decode the whole output and stop at the first
token whose text holds a stop string, cutting the text at its first occurrence. Tokenizers: a
byte-level BPE (multi-byte characters split across tokens) and a Metaspace BPE (SentencePiece-style
leading spaces), over random token streams (invalid UTF-8 and special tokens included) and over
real text, with stop strings cut from the text so that they span tokens.
"""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from paddle_mla.engine.stop_strings import MAX_PENDING_TOKENS, StopStringMatcher
from paddle_mla.engine.tokenizer import Tokenizer

CORPUS = ("Le café coûte 3 €. 中文字符很难切分。 Emoji 🤖🎨 paint the sea at night; naïve façade, "
          "Ωμέγα and ünïcödé. The robot learns, paints, and stops.\n") * 8


def _train(kind: str) -> Tokenizer:
    tok = HFTokenizer(models.BPE())
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=alphabet, min_frequency=1)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    return Tokenizer(tok, {"bos_token": "<s>", "eos_token": "</s>"})


TOKENIZERS = {kind: _train(kind) for kind in ("bytelevel", "metaspace")}


def reference_stop(tok, out: list[int], stops: list[str]):
    """The old rule: (number of tokens at the stop, cut text) or None."""
    for n in range(1, len(out) + 1):
        text = tok.decode(out[:n])
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            return n, text[:cut]
    return None


def matcher_stop(tok, out: list[int], stops: list[str], min_tokens: int = 0):
    """What LLM._stopped does now: the window detector, confirmed by one full decode."""
    matcher = StopStringMatcher(tok, stops)
    for n in range(1, len(out) + 1):
        if n < min_tokens:
            continue
        if matcher.found(out[:n]):
            text = tok.decode(out[:n])
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                return n, text[:cut]
    return None


def _stops_from(text: str, rng: random.Random, count: int) -> list[str]:
    stops = []
    for _ in range(count):
        if len(text) < 2:
            break
        start = rng.randrange(len(text) - 1)
        piece = text[start:start + rng.randrange(1, 7)]
        if piece and "\ufffd" not in piece:
            stops.append(piece)
    return stops or ["\n\n\n"]


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_real_text_stops_at_the_same_token_with_the_same_text(kind):
    tok = TOKENIZERS[kind]
    ids = tok.encode(CORPUS[:400], add_bos=False)
    rng = random.Random(0)
    spanning = 0
    for trial in range(60):
        start = rng.randrange(len(ids) - 60)
        out = ids[start:start + 60]
        stops = _stops_from(tok.decode(out), rng, rng.randrange(1, 4))
        want = reference_stop(tok, out, stops)
        assert matcher_stop(tok, out, stops) == want, (trial, stops)
        if want is not None and want[0] >= 2:
            k = want[0]
            last = tok.decode(out[:k])[len(tok.decode(out[:k - 1])):]
            spanning += not any(s in last for s in stops)    # the stop string reaches back past the last token
    assert spanning >= 5, "the trials must include stop strings that span tokens"


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_random_token_streams_match_the_full_decode(kind):
    tok = TOKENIZERS[kind]
    vocab = tok.vocab_size
    rng = random.Random(1)
    for trial in range(80):
        out = [rng.randrange(vocab) for _ in range(rng.randrange(1, 50))]
        stops = _stops_from(tok.decode(out), rng, rng.randrange(1, 3))
        min_tokens = rng.choice([0, 0, 5])
        want = reference_stop(tok, out[:], stops)
        got = matcher_stop(tok, out, stops, min_tokens)
        if want is not None and want[0] < min_tokens:
            # before min_tokens no stop string is checked; the old rule then stopped at min_tokens
            # if the text (cut at the first occurrence) held one, which the reference reproduces here
            want = None
            for n in range(max(min_tokens, 1), len(out) + 1):
                text = tok.decode(out[:n])
                cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    want = (n, text[:cut])
                    break
        assert got == want, (trial, out, stops)


def test_multibyte_character_split_across_tokens():
    tok = TOKENIZERS["bytelevel"]
    ids = tok.encode("x 🤖 y", add_bos=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the emoji must span byte tokens for this test"
    assert matcher_stop(tok, ids, ["🤖"]) == reference_stop(tok, ids, ["🤖"])
    assert matcher_stop(tok, ids, ["🤖"])[1] == "x "


class CountingTokenizer:
    def __init__(self, tok):
        self.tok = tok
        self.longest = 0

    def decode(self, ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_window_stays_bounded_on_a_long_output(kind):
    counting = CountingTokenizer(TOKENIZERS[kind])
    out = TOKENIZERS[kind].encode(CORPUS * 3, add_bos=False)
    assert len(out) > 500
    matcher = StopStringMatcher(counting, ["no such stop string"])
    for n in range(1, len(out) + 1):
        assert not matcher.found(out[:n])
    assert counting.longest <= 2 * MAX_PENDING_TOKENS, counting.longest


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_batched_detection_equals_one_row_at_a_time(kind):
    """``found_many`` (all of a step's stop-string rows at once, as LLM._apply runs it) gives every
    row the answers ``found`` gives it alone, step by step, rows of different lengths joining and leaving."""
    tok = TOKENIZERS[kind]
    rng = random.Random(2)
    ids = tok.encode(CORPUS[:600], add_bos=False)
    streams = []
    for _ in range(12):
        if rng.random() < 0.5:
            out = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(5, 60))]
        else:
            start = rng.randrange(len(ids) - 60)
            out = ids[start:start + rng.randrange(5, 60)]
        streams.append((out, _stops_from(tok.decode(out), rng, rng.randrange(1, 3)), rng.randrange(0, 10)))
    single = [StopStringMatcher(tok, stops) for _, stops, _ in streams]
    batched = [StopStringMatcher(tok, stops) for _, stops, _ in streams]
    fired = 0
    token_texts = {}       # the one-token decode cache, kept across steps as LLM keeps it
    for step in range(80):
        rows = [i for i, (out, _, start) in enumerate(streams) if start <= step < start + len(out)]
        outs = [streams[i][0][:step - streams[i][2] + 1] for i in rows]
        want = [single[i].found(o) for i, o in zip(rows, outs)]
        got = StopStringMatcher.found_many([batched[i] for i in rows], outs, token_texts)
        assert got == want, step
        fired += sum(want)
        for i in rows:
            assert vars(single[i]) == {**vars(batched[i]), "tokenizer": single[i].tokenizer}
    assert fired >= 5, "the streams must hold stop strings"
    assert token_texts and all(tok.decode([t]) == text for t, text in token_texts.items())
    assert StopStringMatcher.found_many([], []) == []
