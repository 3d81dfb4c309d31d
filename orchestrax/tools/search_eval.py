"""Title-paraphrase queries derived from a corpus, and recall@k, for checking local search.

A query for a passage is its first sentence with every word of the title removed, parentheticals
dropped, the subject dropped (everything up to an "is/was" among the first 8 words) and cut to
`max_words` — so the query describes the article without naming it ("2001: A Space Odyssey is a
1968 epic science fiction film produced and directed by Stanley Kubrick, ..." -> "a 1968 epic
science fiction film produced and directed by Stanley Kubrick"). A template prefix such as
"the article about ..." only dilutes a mean-pooled query embedding (full-corpus MiniLM recall@5
0.84 with it, 0.92 without), so queries are the bare description.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from orchestrax.tools.search_index import Passage, SearchIndex

_WORD = re.compile(r"[A-Za-z0-9']+")
_COPULA = {"is", "was", "are", "were"}


def paraphrase_query(p: Passage, *, max_words: int = 14) -> str | None:
    """None when too little is left once the title is removed."""
    first = re.split(r"(?<=[a-z0-9)])\. ", p.text, maxsplit=1)[0]
    first = re.sub(r"\([^)]*\)", " ", first)
    title_words = {w.lower() for w in _WORD.findall(p.title)}
    words = [w for w in _WORD.findall(first) if w.lower() not in title_words]
    # drop the subject: everything up to an early "is/was" is the title's leftovers
    cut = next((i for i, w in enumerate(words[:8]) if w.lower() in _COPULA), -1)
    words = words[cut + 1:]
    if len(words) < 5:
        return None
    return " ".join(words[:max_words])


def derive_queries(passages: Sequence[Passage], n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """`n` (query, target title) pairs over passages with unique titles, sampled by `seed`."""
    counts: dict[str, int] = {}
    for p in passages:
        counts[p.title] = counts.get(p.title, 0) + 1
    eligible = [(q, p.title) for p in passages if counts[p.title] == 1
                and (q := paraphrase_query(p)) is not None]
    if len(eligible) < n:
        raise ValueError(f"only {len(eligible)} passages yield a query; asked for n={n}")
    return random.Random(seed).sample(eligible, n)


async def recall_at_k(index: SearchIndex, queries: Sequence[tuple[str, str]], k: int = 5) -> float:
    hits = 0
    for query, title in queries:
        hits += any(p.title == title for p, _ in await index.search(query, k))
    return hits / len(queries)
