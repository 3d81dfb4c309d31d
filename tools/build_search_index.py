"""Build (or find cached) the local-search index over a passage corpus: `orchestrax index`.

  python tools/build_search_index.py --corpus ../shared/data/corpus/wiki_summaries_en.json
  python tools/build_search_index.py --corpus ... --backend bm25 --cache-dir /tmp/cache

The operator's entry point to `orchestrax index` (same flags, `--config`, `--set`); see
`orchestrax.tools.index_command`.
"""

import sys

from orchestrax.cli import main

if __name__ == "__main__":
    sys.exit(main(["index", *sys.argv[1:]]))
