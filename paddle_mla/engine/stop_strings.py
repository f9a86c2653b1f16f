"""Stop strings found in O(1) per token: incremental detokenization over a bounded window.

Decoding the whole output at every token (to look for a stop string) is O(output) per token. Here
each completion keeps two token offsets, as vLLM's incremental detokenizer does:

- ``prefix_offset``: the first token of the decode window, a character boundary, and a token that
  the decoder renders (not a skipped special token);
- ``read_offset``: the tokens whose text has been emitted.

The text of the new tokens is ``decode(out[prefix:])`` minus ``decode(out[prefix:read])``: both
decodes start at the same token, so whatever a decoder does to a window's first token (a
SentencePiece leading space) cancels out. While that text ends in U+FFFD (a multi-byte character
split across tokens) the offsets stay, and the character completes at a later token. The search
covers the new text plus the last ``len(longest stop) - 1`` emitted characters, so a stop string
spanning tokens is seen at the token that completes it, as the full decode would see it.

``found`` is a detector: the caller confirms a hit with one full decode (once per completion) and
cuts the text there, so the final text and the stopping token are what the full decode gives.
The window equals the full text's tail for decoders that render a token from its neighbours only
(byte-level BPE, Metaspace, WordPiece); where a window's text does not extend its own prefix, or
the window grows past ``2 * MAX_PENDING_TOKENS`` (an undecodable tail, a long run of skipped special
tokens), ``found`` answers True and the full decode decides, as before.
"""

from __future__ import annotations

MAX_PENDING_TOKENS = 8      # a UTF-8 character spans at most 4 byte tokens; past this, let the full decode judge
_INCOMPLETE = "\ufffd"


class StopStringMatcher:
    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.keep = max(len(s) for s in self.stops) - 1   # emitted characters a stop string can reach back into
        self.prefix_offset = 0
        self.read_offset = 0
        self.tail = ""

    def found(self, token_ids: list[int]) -> bool:
        """Whether the text of ``token_ids`` (the whole output so far; only its tail is read) may
        hold a stop string. Call it with each longer output; tokens are read past ``read_offset``."""
        windows = self._windows(token_ids)
        if windows is None:
            return False
        decode = self.tokenizer.decode
        return self._judge(len(token_ids), decode(windows[0]) if windows[0] else "", decode(windows[1]))

    @staticmethod
    def found_many(matchers: list["StopStringMatcher"], outputs: list[list[int]],
                   token_texts: dict[int, str] | None = None) -> list[bool]:
        """``found`` of many completions at once (one step's stop-string rows, one tokenizer).
        ``token_texts``: a cache of one-token decodes kept by the caller across steps; once the
        window moves on at every token, each row's prefix is the one token before, so one of the
        two decodes per row becomes a dict lookup."""
        hits = [False] * len(matchers)
        rows, texts = [], []
        for i, (m, out) in enumerate(zip(matchers, outputs)):
            windows = m._windows(out)
            if windows is not None:
                rows.append(i)
                texts += windows
        if not rows:
            return hits
        decode = matchers[rows[0]].tokenizer.decode
        decoded = []
        for ids in texts:
            if not ids:
                decoded.append("")
            elif len(ids) == 1 and token_texts is not None:
                text = token_texts.get(ids[0])
                if text is None:
                    text = token_texts[ids[0]] = decode(ids)
                decoded.append(text)
            else:
                decoded.append(decode(ids))
        for j, i in enumerate(rows):
            hits[i] = matchers[i]._judge(len(outputs[i]), decoded[2 * j], decoded[2 * j + 1])
        return hits

    def _windows(self, token_ids: list[int]):
        """The token lists of the two decodes (prefix, window), or None when nothing is new."""
        n = len(token_ids)
        if n <= self.read_offset:
            return None
        return token_ids[self.prefix_offset:self.read_offset], token_ids[self.prefix_offset:n]

    def _judge(self, n: int, prefix_text: str | None, window_text: str | None) -> bool:
        """``found``'s answer from the two decodes of ``_windows``; moves the offsets."""
        if prefix_text is None or window_text is None:      # a tokenizer without text: nothing to match
            return False
        if not window_text.startswith(prefix_text):
            return True          # this decoder's window text is not incremental here: the full decode decides
        new_text = window_text[len(prefix_text):]
        hit = any(s in self.tail + new_text for s in self.stops)
        if n - self.prefix_offset > 2 * MAX_PENDING_TOKENS:
            return True          # an undecodable tail or a long run of skipped tokens: the full decode decides
        if new_text.endswith(_INCOMPLETE):
            return hit           # wait for the character's next bytes before emitting
        if new_text:
            self.tail = (self.tail + new_text)[-self.keep:] if self.keep else ""
            self.prefix_offset = self.read_offset
        # else: only tokens the decoder skips (special tokens). The window keeps its first token, so
        # it still starts at a token the decoder renders: a decoder treats its first rendered token
        # apart (Metaspace drops its leading space), and both decodes must agree on which one it is.
        self.read_offset = n
        return hit
