"""Incremental detokenisation with stop strings, for streamed and stop-string requests.

The sampler stops on token ids only; a stop *string* is found on the decoded text after each
decode chunk, and the output is cut at the first token whose text completes it (the tokens
after it are dropped, the stop string itself is trimmed from the text unless `no_stop_trim`).
While streaming, the tail of the text that could still be the start of a stop string, and an
unfinished multi-byte character, are held back until they are decided.
"""

from __future__ import annotations

from typing import Callable, Sequence

_PARTIAL = "\ufffd"   # what a tokenizer decodes an incomplete UTF-8 sequence to


class StopMatcher:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = (),
                 no_stop_trim: bool = False):
        self.decode, self.stops, self.no_stop_trim = decode, tuple(stops), no_stop_trim
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""           # decoded text of self.ids (before any stop cut)
        self.sent = 0            # characters of text already handed out by `feed`
        self.matched: str | None = None
        self.kept_tokens: int | None = None   # set when a stop string matched

    def feed(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the text that is now final. After a match, `matched` and
        `kept_tokens` are set and no more text will come."""
        if self.matched is not None:
            return ""
        self.ids.extend(new_ids)
        self.text = self.decode(self.ids)
        hit = self._first_stop()
        if hit is not None:
            pos, stop = hit
            self.matched = stop
            self.kept_tokens = self._tokens_covering(pos + len(stop))
            final = self.text[:pos + (len(stop) if self.no_stop_trim else 0)]
            return self._emit(len(final), final)
        safe = len(self.text) - self.holdback
        while safe > self.sent and self.text[safe - 1] == _PARTIAL:
            safe -= 1
        return self._emit(safe, self.text)

    def flush(self) -> str:
        """Generation ended without a stop string: everything left is final."""
        return "" if self.matched is not None else self._emit(len(self.text), self.text)

    @property
    def final_text(self) -> str:
        if self.matched is None:
            return self.text
        pos = self.text.find(self.matched)
        return self.text[:pos + (len(self.matched) if self.no_stop_trim else 0)]

    def _emit(self, upto: int, text: str) -> str:
        if upto <= self.sent:
            return ""
        out, self.sent = text[self.sent:upto], upto
        return out

    def _first_stop(self) -> tuple[int, str] | None:
        best = None
        for s in self.stops:
            pos = self.text.find(s)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        return best

    def _tokens_covering(self, chars: int) -> int:
        """Fewest leading tokens whose text reaches `chars` characters (binary search: the
        decoded length only grows with more tokens)."""
        lo, hi = 1, len(self.ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.decode(self.ids[:mid])) >= chars:
                hi = mid
            else:
                lo = mid + 1
        return lo
