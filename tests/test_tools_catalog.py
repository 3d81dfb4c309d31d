"""Tool-spec JSON form, pricing sheets, the catalog, and seeded configuration randomisation."""

import asyncio
import json
import logging
import shutil

import pytest

from orchestrax.tools.tool import Pricing, ToolError, ToolSpec
from orchestrax.tools.catalog import CatalogConfig, build_catalog
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.llm_tool import LLMTool, LLMToolConfig
from orchestrax.tools.randomize import (RandomizeConfig, apply_config, instance_seed, reprice,
                                        sample_config)
from orchestrax.tools.search_index import SearchIndexConfig
from orchestrax.tools.sheets import bundled_sheets, load_sheet, sheet_from_json
from orchestrax.tools.specs import check_arguments, spec_from_json, spec_to_json
from orchestrax.tools.web_search import WebSearchConfig

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
URL = "http://127.0.0.1:9"
LLMS = (
    LLMToolConfig(name="gpt5", role="generalist", chat=ChatEndpoint(base_url=URL, model="gpt-5")),
    LLMToolConfig(name="gpt5_mini", role="generalist", chat=ChatEndpoint(base_url=URL, model="gpt-5-mini")),
    LLMToolConfig(name="math_72b", role="math", chat=ChatEndpoint(base_url=URL, model="m"),
                  price_model="qwen2.5-math-72b"),
    LLMToolConfig(name="coder_32b", role="coder", chat=ChatEndpoint(base_url=URL, model="c"),
                  price_model="qwen2.5-coder-32b"),
    LLMToolConfig(name="llama_70b", role="generalist", chat=ChatEndpoint(base_url=URL, model="llama-3.3-70b")),
)


@pytest.fixture(scope="module")
def catalog(shared_data, tmp_path_factory):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    cfg = CatalogConfig(
        search=SearchIndexConfig(corpus_path=str(shared_data / "corpus" / "wiki_summaries_en.json"),
                                 backend="bm25", cache_dir=str(tmp_path_factory.mktemp("cache"))),
        web=WebSearchConfig(api_key_env="ORCHESTRAX_TEST_TAVILY_KEY"), llms=LLMS)
    mp = pytest.MonkeyPatch()
    mp.setenv("ORCHESTRAX_TEST_TAVILY_KEY", "tvly-x")
    try:
        return build_catalog(cfg)
    finally:
        mp.undo()


def test_spec_json_round_trip_and_errors():
    spec = ToolSpec(name="t", description="d", category="specialist", latency_s=2.5,
                    parameters={"type": "object", "properties": {"x": {"type": "integer"}},
                                "required": ["x"]},
                    pricing=Pricing(kind="per_token", usd_per_m_input=1.0, usd_per_m_output=2.0))
    data = json.loads(json.dumps(spec_to_json(spec)))
    assert spec_from_json(data) == spec
    assert set(data) == {"name", "description", "parameters", "category", "pricing", "latency_s"}
    with pytest.raises(ValueError, match="category"):
        spec_from_json({**data, "category": "magic"})
    with pytest.raises(ValueError, match="parameters"):
        spec_from_json({**data, "parameters": {"type": "nonsense"}})
    with pytest.raises(ValueError, match="usd_per_call"):
        spec_from_json({**data, "pricing": {"kind": "per_call", "usd_per_call": -1}})
    with pytest.raises(ValueError, match="kind"):
        spec_from_json({**data, "pricing": {"kind": "per_minute"}})
    with pytest.raises(ValueError, match=r"tool spec has unknown fields \['colour'\]; allowed: "
                                          r"\['name', 'description', 'parameters', 'category', "):
        spec_from_json({**data, "colour": "red"})
    with pytest.raises(ValueError, match=r"pricing has unknown fields \['usd_per_hour'\]; allowed: "
                                          r"\['kind', 'usd_per_call', "):
        spec_from_json({**data, "pricing": {"kind": "per_call", "usd_per_hour": 1.0}})
    with pytest.raises(ToolError, match="x"):
        check_arguments(spec, {"x": "five"})
    with pytest.raises(ToolError, match="object"):
        check_arguments(spec, ["x"])


def test_bundled_sheets_are_complete_and_consistent():
    train, held_out = bundled_sheets("train"), bundled_sheets("eval")
    assert len(train) >= 3 and held_out == ["eval_heldout"]
    models = set(load_sheet("train_list").models)
    assert {"gpt-5", "gpt-5-mini", "qwen3-32b", "llama-3.3-70b"} <= models
    for name in train + held_out:
        sheet = load_sheet(name)
        assert set(sheet.models) == models, name          # every sheet prices every model
        assert set(sheet.tools) == {"python", "local_search", "web_search"}, name
        assert sheet.note
    # list prices, per million tokens
    assert load_sheet("train_list").model_pricing("gpt-5").cost(
        input_tokens=1_000_000, output_tokens=1_000_000) == pytest.approx(11.25)
    with pytest.raises(KeyError, match="gpt-5-mini"):
        load_sheet("train_list").model_pricing("gpt-9")
    with pytest.raises(FileNotFoundError, match="train_list"):
        load_sheet("no_such_sheet")
    with pytest.raises(ValueError, match="split"):
        sheet_from_json({"name": "x", "split": "test", "models": {}})
    with pytest.raises(ValueError, match="usd_per_m_input"):
        sheet_from_json({"name": "x", "split": "train",
                         "models": {"m": {"provider": "p", "usd_per_m_input": -1, "usd_per_m_output": 0}}})


def test_catalog_contents_prices_and_categories(catalog):
    assert set(catalog) == {"python", "local_search", "web_search", *(c.name for c in LLMS)}
    sheet = load_sheet("train_list")
    assert catalog["gpt5"].spec.pricing == sheet.model_pricing("gpt-5")
    assert catalog["math_72b"].spec.pricing == sheet.model_pricing("qwen2.5-math-72b")
    assert catalog["python"].spec.pricing == sheet.tools["python"]
    assert catalog["coder_32b"].spec.category == "specialist"
    assert catalog["gpt5"].spec.category == "generalist"
    assert catalog["local_search"].spec.category == "basic"
    for tool in catalog.values():  # every spec survives the JSON form
        assert spec_from_json(json.loads(json.dumps(spec_to_json(tool.spec)))) == tool.spec


@needs_bwrap
def test_catalog_without_a_key_leaves_web_search_out_with_a_notice(monkeypatch, caplog):
    monkeypatch.delenv("ORCHESTRAX_TEST_NO_KEY", raising=False)
    with caplog.at_level(logging.INFO, logger="orchestrax.tools.catalog"):
        tools = build_catalog(CatalogConfig(web=WebSearchConfig(api_key_env="ORCHESTRAX_TEST_NO_KEY")))
    assert set(tools) == {"python"}
    notices = [r.getMessage() for r in caplog.records if "web_search" in r.getMessage()]
    assert len(notices) == 1 and "ORCHESTRAX_TEST_NO_KEY" in notices[0]
    with pytest.raises(KeyError, match="no-such-model"):
        build_catalog(CatalogConfig(python=None, web=None, llms=(LLMToolConfig(
            name="x", role="generalist", chat=ChatEndpoint(base_url=URL, model="no-such-model")),)))
    with pytest.raises(ValueError, match="duplicate"):
        CatalogConfig(llms=(LLMS[0], LLMS[0]))


def test_randomised_configurations_are_reproducible_and_cover_everything(catalog):
    names = sorted(catalog)
    samples = [sample_config(names, seed) for seed in range(200)]
    assert samples == [sample_config(list(reversed(names)), seed) for seed in range(200)]
    assert len(set(samples)) > 50
    assert set().union(*(s.tools for s in samples)) == set(names)
    assert {s.sheet for s in samples} == set(bundled_sheets("train"))  # never the held-out one
    assert all(s.tools for s in samples)
    kept = [sample_config(names, seed, RandomizeConfig(always=("python",), max_tools=3))
            for seed in range(100)]
    assert all("python" in s.tools and len(s.tools) <= 3 for s in kept)
    assert instance_seed(7, "task-1", 0) == instance_seed(7, "task-1", 0) != instance_seed(7, "task-2", 0)
    with pytest.raises(ValueError, match="always"):
        sample_config(names, 0, RandomizeConfig(always=("nope",)))
    with pytest.raises(ValueError, match="max_tools"):
        RandomizeConfig(min_tools=3, max_tools=2)


def test_applied_configuration_reprices_copies_only(catalog):
    sample = next(s for seed in range(100)
                  if (s := sample_config(sorted(catalog), seed)).sheet == "train_priority"
                  and {"gpt5", "python"} <= set(s.tools))
    tools = apply_config(catalog, sample)
    sheet = load_sheet("train_priority")
    assert set(tools) == set(sample.tools)
    assert tools["gpt5"].spec.pricing == sheet.model_pricing("gpt-5")
    assert tools["python"].spec.pricing == sheet.tools["python"]
    assert catalog["gpt5"].spec.pricing == load_sheet("train_list").model_pricing("gpt-5")
    held_out = reprice(catalog["gpt5"], load_sheet("eval_heldout"))
    assert isinstance(held_out, LLMTool) and held_out.spec.pricing.usd_per_m_input == 1.0
    # the repriced python tool still runs and bills with its new price
    res = asyncio.run(tools["python"]({"code": "print(1)"}))
    assert res.cost == pytest.approx(sheet.tools["python"].usd_per_second * res.latency)


def test_catalog_inside_an_event_loop_needs_a_prebuilt_index(shared_data):
    cfg = CatalogConfig(python=None, web=None, search=SearchIndexConfig(
        corpus_path=str(shared_data / "corpus" / "wiki_summaries_en.json"), backend="bm25"))

    async def inside():
        build_catalog(cfg)

    with pytest.raises(RuntimeError, match="search_index="):
        asyncio.run(inside())


@needs_bwrap
def test_nominal_clock_charges_the_spec_latency_not_the_wall_time(shared_data, tmp_path):
    search = SearchIndexConfig(corpus_path=str(shared_data / "corpus" / "wiki_summaries_en.json"),
                               backend="bm25", cache_dir=str(tmp_path), titles=("Paris",))
    tools = build_catalog(CatalogConfig(search=search, web=None, clock="nominal"))
    sheet = load_sheet("train_list")
    py = asyncio.run(tools["python"]({"code": "import time; time.sleep(0.3); print(1)"}))
    assert py.observation.strip() == "1"
    # 0.1 s whatever the sandbox took (over 0.3 s here): cost = per-call + per-second x 0.1
    price = sheet.tools["python"]
    assert py.latency == 0.1 and py.cost == price.cost(seconds=0.1)
    hit = asyncio.run(tools["local_search"]({"query": "Paris"}))
    assert hit.latency == tools["local_search"].spec.latency_s == 0.05
    measured = build_catalog(CatalogConfig(search=None, web=None))["python"]
    assert asyncio.run(measured({"code": "import time; time.sleep(0.3)"})).latency >= 0.3
    with pytest.raises(ValueError, match=r"CatalogConfig.clock='wall'; allowed: measured, nominal"):
        CatalogConfig(clock="wall")
