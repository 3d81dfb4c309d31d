"""Build (or find cached) the local-search index over a passage corpus.

  python tools/build_search_index.py --corpus ../shared/data/corpus/wiki_summaries_en.json
  python tools/build_search_index.py --corpus ... --backend bm25 --cache-dir /tmp/cache
  python tools/build_search_index.py --corpus ... --embedder openai --base-url http://host:30000 \
      --model Qwen/Qwen3-Embedding-0.6B
"""

from __future__ import annotations

import argparse
import os
import time

from orchestrax.tools.embed import EmbedderConfig
from orchestrax.tools.search_index import SearchIndexConfig, build_index, default_cache_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--backend", choices=["dense", "bm25"], default="dense")
    ap.add_argument("--embedder", choices=["minilm", "openai"], default="minilm")
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--model", default="Qwen/Qwen3-Embedding-0.6B")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--torch-threads", type=int, default=2, help="MiniLM threads while building")
    ap.add_argument("--cache-dir", default=default_cache_dir())
    ap.add_argument("--query", action="append", default=[], help="try a query after building")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model must never touch the hub
    config = SearchIndexConfig(
        corpus_path=args.corpus, backend=args.backend, cache_dir=args.cache_dir,
        embedder=EmbedderConfig(kind=args.embedder, base_url=args.base_url, model=args.model,
                                max_length=args.max_length, batch_size=args.batch_size,
                                torch_threads=args.torch_threads))
    t0 = time.monotonic()
    index = build_index(config)
    print(f"index ready: {len(index.passages)} passages at {index.path} "
          f"({time.monotonic() - t0:.1f} s)")
    import asyncio

    for q in args.query:
        hits = asyncio.run(index.search(q, 5))
        print(f"\n{q!r}:\n" + "\n".join(f"  {s:.3f}  {p.title}" for p, s in hits))


if __name__ == "__main__":
    main()
