"""Okapi BM25 over a passage list: the no-model fallback for local search.

score(q, d) = sum_{t in q} idf(t) * tf(t, d) (k1 + 1) / (tf(t, d) + k1 (1 - b + b |d| / avgdl)),
idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))  (the non-negative Lucene form).
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
import re
from typing import Sequence

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")
# the commonest function words carry no topical signal and only slow scoring down
STOPWORDS = frozenset(
    "a an and are as at be by for from has have he her his in is it its of on or she that the "
    "their they this to was were which who with about what whose".split())


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25:
    def __init__(self, postings: dict[str, dict[int, int]], doc_len_N: np.ndarray,
                 *, k1: float = 1.5, b: float = 0.75):
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 k1={k1}, b={b}; need k1 >= 0 and 0 <= b <= 1")
        self.postings, self.doc_len_N, self.k1, self.b = postings, doc_len_N, k1, b
        n = len(doc_len_N)
        self.avgdl = float(doc_len_N.mean()) if n else 0.0
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in postings.items()}

    @classmethod
    def build(cls, texts: Sequence[str], **kw) -> "BM25":
        postings: dict[str, dict[int, int]] = collections.defaultdict(dict)
        lens = np.zeros(len(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            toks = tokenize(text)
            lens[i] = len(toks)
            for tok, c in collections.Counter(toks).items():
                postings[tok][i] = c
        return cls(dict(postings), lens, **kw)

    def scores(self, query: str) -> np.ndarray:
        s_N = np.zeros(len(self.doc_len_N), dtype=np.float32)
        norm_N = self.k1 * (1 - self.b + self.b * self.doc_len_N / max(self.avgdl, 1e-9))
        for tok in set(tokenize(query)):
            post = self.postings.get(tok)
            if not post:
                continue
            ids = np.fromiter(post.keys(), dtype=np.int64, count=len(post))
            tf = np.fromiter(post.values(), dtype=np.float32, count=len(post))
            s_N[ids] += self.idf[tok] * tf * (self.k1 + 1) / (tf + norm_N[ids])
        return s_N

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        s_N = self.scores(query)
        k = min(k, len(s_N))
        top = np.argpartition(-s_N, k - 1)[:k] if k else np.zeros(0, np.int64)
        top = top[np.argsort(-s_N[top], kind="stable")]
        return [(int(i), float(s_N[i])) for i in top if s_N[i] > 0]

    def save(self, path: pathlib.Path) -> None:
        data = {"k1": self.k1, "b": self.b, "doc_len": self.doc_len_N.tolist(),
                "postings": {t: [[i, c] for i, c in p.items()] for t, p in self.postings.items()}}
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: pathlib.Path) -> "BM25":
        data = json.loads(path.read_text())
        postings = {t: {i: c for i, c in p} for t, p in data["postings"].items()}
        return cls(postings, np.asarray(data["doc_len"], np.float32), k1=data["k1"], b=data["b"])
