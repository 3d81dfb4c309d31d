"""A passage index for local search: FAISS over embeddings (exact inner product on unit vectors)
or BM25, built once with a progress bar and cached on disk under a key of (corpus file, backend,
embedder, subset)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Literal, Sequence

import numpy as np

from orchestrax.checks import at_least, one_of
from orchestrax.tools.bm25 import BM25
from orchestrax.tools.embed import Embedder, EmbedderConfig, embedder_key, make_embedder

Backend = Literal["dense", "bm25"]
_FORMAT_VERSION = 1


def default_cache_dir() -> str:
    return os.environ.get("ORCHESTRAX_CACHE_DIR", os.path.expanduser("~/.cache/orchestrax"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchIndexConfig:
    corpus_path: str
    backend: Backend = "dense"
    embedder: EmbedderConfig = EmbedderConfig()
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    titles: tuple[str, ...] | None = None   # index only these passages (tests, demos)
    faiss_threads: int = 1                  # a flat search of one query is < 1 ms on one thread

    def __post_init__(self):
        at_least(self, 1, "faiss_threads")
        one_of(self, "backend", self.backend, ("dense", "bm25"))
        if not self.corpus_path:
            raise ValueError("SearchIndexConfig.corpus_path is empty; point it at a corpus file")


@dataclasses.dataclass(frozen=True)
class Passage:
    pid: str
    title: str
    text: str


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """A JSON dict title -> {title, extract|text} (the wiki-summaries shape), a JSON list, or JSONL
    of {id?, title, text|extract|contents}."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus_path={str(path)!r} does not exist")
    raw = path.read_text()
    if path.suffix == ".jsonl":
        records: list[Any] = [json.loads(line) for line in raw.splitlines() if line.strip()]
    else:
        data = json.loads(raw)
        records = list(data.values()) if isinstance(data, dict) else data
    out = []
    for i, r in enumerate(records):
        text = r.get("text") or r.get("extract") or r.get("contents")
        if not isinstance(text, str):
            raise ValueError(f"corpus record {i} has no 'text'/'extract'/'contents' string")
        title = str(r.get("title", ""))
        out.append(Passage(pid=str(r.get("id", title or i)), title=title, text=text))
    return out


def passage_text(p: Passage) -> str:
    return f"{p.title}. {p.text}" if p.title else p.text


def _cache_key(config: SearchIndexConfig, embedder_key: str) -> str:
    st = pathlib.Path(config.corpus_path).resolve().stat()
    parts = [str(_FORMAT_VERSION), str(pathlib.Path(config.corpus_path).resolve()), str(st.st_size),
             str(st.st_mtime_ns), config.backend, embedder_key,
             json.dumps(sorted(config.titles)) if config.titles is not None else "all"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def cached_index_dir(config: SearchIndexConfig) -> pathlib.Path | None:
    """Where `config`'s index lives once built; None when it has not been built yet."""
    key = embedder_key(config.embedder) if config.backend == "dense" else "bm25"
    root = pathlib.Path(config.cache_dir) / "search" / _cache_key(config, key)
    name = "index.faiss" if config.backend == "dense" else "bm25.json"
    return root if (root / name).is_file() else None


class SearchIndex:
    """`await index.search(query, k)` -> [(Passage, score)], best first."""

    def __init__(self, passages: list[Passage], *, bm25: BM25 | None = None,
                 faiss_index: Any = None, embedder: Embedder | None = None, path: str = ""):
        self.passages, self.bm25 = passages, bm25
        self.faiss_index, self.embedder = faiss_index, embedder
        self.path = path

    async def search(self, query: str, k: int = 5) -> list[tuple[Passage, float]]:
        if self.bm25 is not None:
            hits = self.bm25.search(query, k)
        else:
            q_1D = await self.embedder.embed([query])
            scores, ids = self.faiss_index.search(q_1D, min(k, len(self.passages)))
            hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        return [(self.passages[i], s) for i, s in hits]


async def _embed_all(embedder: Embedder, texts: Sequence[str], batch: int,
                     progress: bool) -> np.ndarray:
    from tqdm import tqdm

    # sorting by length keeps each batch's padding small; rows go back to corpus order after
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.zeros((len(texts), 0), np.float32)
    with tqdm(total=len(texts), desc="embedding passages", unit="psg", disable=not progress) as bar:
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            vecs = await embedder.embed([texts[i] for i in idx])
            if out.shape[1] == 0:
                out = np.zeros((len(texts), vecs.shape[1]), np.float32)
            out[idx] = vecs
            bar.update(len(idx))
    return out


async def build_index_async(config: SearchIndexConfig, *, progress: bool = True,
                            embedder: Embedder | None = None) -> SearchIndex:
    """Load the cached index for `config`, or build and cache it."""
    try:
        import faiss
    except ImportError as e:
        raise RuntimeError("dense local search needs FAISS: "
                           "`pip install 'orchestrax[search]'`") from e

    passages = load_corpus(config.corpus_path)
    if config.titles is not None:
        wanted = set(config.titles)
        missing = wanted - {p.title for p in passages}
        if missing:
            raise ValueError(f"SearchIndexConfig.titles: {len(missing)} not in the corpus, "
                             f"e.g. {sorted(missing)[:3]}")
        passages = [p for p in passages if p.title in wanted]
    if not passages:
        raise ValueError(f"SearchIndexConfig.corpus_path={config.corpus_path!r}: "
                         "no passages to index")
    dense = config.backend == "dense"
    if dense and embedder is None:
        embedder = make_embedder(config.embedder)
    space = embedder.key if dense else "bm25"
    root = pathlib.Path(config.cache_dir) / "search" / _cache_key(config, space)
    name = "index.faiss" if dense else "bm25.json"
    if not (root / name).is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(dir=root.parent, prefix=".building-"))
        try:
            texts = [passage_text(p) for p in passages]
            if dense:
                x_ND = await _embed_all(embedder, texts, config.embedder.batch_size, progress)
                flat = faiss.IndexFlatIP(x_ND.shape[1])
                flat.add(x_ND)
                faiss.write_index(flat, str(tmp / name))
            else:
                BM25.build(texts).save(tmp / name)
            (tmp / "meta.json").write_text(json.dumps(
                {"corpus_path": config.corpus_path, "backend": config.backend,
                 "embedder": space, "passages": len(passages)}))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            tmp.rename(root)  # atomic: a concurrent builder either wins or finds it built
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    if dense:
        faiss.omp_set_num_threads(config.faiss_threads)
        flat = faiss.read_index(str(root / name))
        if flat.ntotal != len(passages):
            raise ValueError(f"cached index {root} holds {flat.ntotal} vectors for "
                             f"{len(passages)} passages; delete it to rebuild")
        return SearchIndex(passages, faiss_index=flat, embedder=embedder, path=str(root))
    return SearchIndex(passages, bm25=BM25.load(root / name), path=str(root))


def build_index(config: SearchIndexConfig, *, progress: bool = True) -> SearchIndex:
    """Synchronous entry point for scripts (not from inside a running event loop)."""
    return asyncio.run(build_index_async(config, progress=progress))
