"""`orchestrax serve` scores text: prompt logprobs on `/generate` (`logprob_start_len`,
`max_new_tokens=0`), `/v1/completions` with `echo` and `logprobs`, checked against a NumPy
log-softmax of the same tiny model's logits and through the real clients: lm-eval's
`local-completions` (loglikelihood and generate_until on local task files) and the SGLang
frontend's `select`; SGLang's pause/continue and release/resume memory routes."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import subprocess
import sys
import textwrap
import urllib.request

import numpy as np
import pytest
from loopback import post_sync as _post

from orchestrax import models, registry

pytestmark = pytest.mark.slow
TOK = registry.build_tokenizer("tiny")
CFG = models.tiny_config(vocab_size=len(TOK))
PARAMS = models.init_params(CFG, seed=0)   # what `serve --tiny` (seed 0) serves


def reference_logprobs(ids: list[int]) -> np.ndarray:
    """float64 log p(ids[t] | ids[:t]) for t >= 1, by a NumPy log-softmax of the logits."""
    logits = np.asarray(models.forward(CFG, PARAMS, np.asarray([ids], np.int32)),
                        np.float64)[0]
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return (logits - lse[:, None])[np.arange(len(ids) - 1), ids[1:]]


def test_prompt_scorer_rows_are_right_padded_and_its_pass_asks_the_host_nothing(monkeypatch):
    """Its rows are right-padded by construction (checked here), so its forward takes the
    fused kernel with no layout conditional (XLA's kernel stands in for cuDNN's on the CPU),
    and gives the NumPy reference's logprobs."""
    import re

    from orchestrax import rl
    from orchestrax.models import model as model_lib
    from orchestrax.rollout import prompt_logprobs as pl
    monkeypatch.setitem(model_lib._FUSED, "auto", "xla")
    scorer = pl.PromptScorer(CFG, lambda: PARAMS)
    seen = []
    score = pl._score

    def spy(cfg, params, ids, mask, n_top):
        rl.check_right_padded(mask, "PromptScorer rows")
        seen.append(score.lower(cfg, params, ids, mask, n_top).compile().as_text())
        return score(cfg, params, ids, mask, n_top)
    monkeypatch.setattr(pl, "_score", spy)
    prompts = [TOK.encode("the cat sat on the mat"), TOK.encode("a dog")]
    got = scorer.score(prompts, [0, 0], [0, 0])
    assert seen and not any(re.search(r"\bconditional\(", hlo) for hlo in seen)
    for p, g in zip(prompts, got):
        np.testing.assert_allclose(g.logprobs[1:], reference_logprobs(p), atol=1e-4)
    score.clear_cache()   # the "xla" kernel's program must not serve later calls


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port", str(port),
         "--max-len", "256", "--max-batch", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "listening" in proc.stdout.readline()
        tok_dir = tmp_path_factory.mktemp("tok")
        TOK.save_pretrained(tok_dir)
        yield f"http://127.0.0.1:{port}", str(tok_dir)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_generate_prompt_logprobs_match_numpy_with_sglangs_fields(server):
    url, _ = server
    ids = TOK.encode("the cat sat on the mat")
    status, out = _post(f"{url}/generate", {
        "input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
        "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 0}})
    assert status == 200
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["output_token_logprobs"] == []
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    lps = meta["input_token_logprobs"]
    assert [t[1] for t in lps] == ids and lps[0][0] is None
    np.testing.assert_allclose([t[0] for t in lps[1:]], reference_logprobs(ids), atol=1e-4)
    tops = meta["input_top_logprobs"]
    assert tops[0] is None and all(len(t) == 2 and t[0][0] >= t[1][0] for t in tops[1:])
    # From a later start, with generation: the prompt part is the same numbers from there on.
    status, out = _post(f"{url}/generate", {
        "input_ids": ids, "return_logprob": True, "logprob_start_len": 3,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    lps3 = out["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in lps3] == ids[3:] and lps3[0][0] is None
    np.testing.assert_allclose([t[0] for t in lps3[1:]], [t[0] for t in lps[4:]], atol=1e-5)
    assert len(out["output_ids"]) == 2
    status, bad = _post(f"{url}/generate", {"input_ids": ids, "return_logprob": True,
                                            "logprob_start_len": len(ids)})
    assert status == 400 and "logprob_start_len" in bad["error"]["message"]


def test_completions_echo_logprobs_with_the_openai_client(server):
    import openai
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    text = "a dog ran to the park"
    ids = TOK.encode(text)
    out = client.completions.create(model="orchestrax", prompt=text, max_tokens=0, echo=True,
                                    logprobs=1)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == text and lp.token_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:], reference_logprobs(ids), atol=1e-4)
    assert "".join(lp.tokens) == text and lp.text_offset[0] == 0
    gen = client.completions.create(model="orchestrax", prompt=[ids, ids[:3]], max_tokens=3,
                                    temperature=0, echo=True, logprobs=1)
    assert [c.index for c in gen.choices] == [0, 1]
    assert len(gen.choices[0].logprobs.token_logprobs) == len(ids) + 3
    assert gen.usage.prompt_tokens == len(ids) + 3


TASKS = {
    "tiny_mc.yaml": """
        task: tiny_mc
        dataset_path: json
        dataset_kwargs: {{data_files: {{test: {data}}}}}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{label}}}}"
        metric_list: [{{metric: acc}}]
    """,
    "tiny_gen.yaml": """
        task: tiny_gen
        dataset_path: json
        dataset_kwargs: {{data_files: {{test: {data}}}}}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{question}}}}"
        doc_to_target: "{{{{answer}}}}"
        generation_kwargs: {{until: ["."], max_gen_toks: 4}}
        metric_list: [{{metric: exact_match}}]
    """,
}
DOCS = [{"question": "the cat sat on the", "choices": [" mat", " dog"], "label": 0,
         "answer": "mat"},
        {"question": "a dog ran to the", "choices": [" park", " cat", " sun"], "label": 0,
         "answer": "park"}]


def test_lm_eval_local_completions_loglikelihood_and_generate_until(server, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    url, tok_dir = server
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    for name, spec in TASKS.items():
        (tmp_path / name).write_text(textwrap.dedent(spec.format(data=data)))
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={url}/v1/completions,tokenizer={tok_dir},"
                   "tokenizer_backend=huggingface,model=orchestrax,max_retries=1",
        tasks=["tiny_mc", "tiny_gen"], task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True)
    pairs = [(args, resp) for s in out["samples"]["tiny_mc"]
             for args, resp in zip(s["arguments"], s["resps"])]
    assert len(pairs) == sum(len(d["choices"]) for d in DOCS)
    for args, ((ll, _greedy),) in pairs:
        ctx, cont = args["arguments"] if isinstance(args, dict) else args
        whole, n_ctx = TOK.encode(ctx + cont), len(TOK.encode(ctx))
        assert ll == pytest.approx(reference_logprobs(whole)[n_ctx - 1:].sum(), abs=1e-4)
    assert "acc,none" in out["results"]["tiny_mc"]
    gen = out["samples"]["tiny_gen"]
    assert len(gen) == 2 and all(isinstance(s["resps"][0][0], str) for s in gen)


def test_sglang_frontend_select_picks_the_likeliest_choice(server):
    sgl = pytest.importorskip("sglang")
    url, _ = server
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    choices = [" mat", " dog", " sun"]

    @sgl.function
    def pick(s):
        s += "the cat sat on the"
        s += sgl.select("word", choices=choices)

    state = pick.run()
    prefix = TOK.encode("the cat sat on the")
    start = max(len(prefix) - 2, 0)
    # SGLang's default choice method: the mean logprob over the choice's tokens from
    # logprob_start_len on (its first reported position has none).
    means = []
    for c in choices:
        ids = TOK.encode("the cat sat on the" + c)
        means.append(reference_logprobs(ids)[start:].mean())
    assert state["word"] == choices[int(np.argmax(means))]
    sgl.RuntimeEndpoint(url).cache_prefix("the cat sat")   # max_new_tokens=0, no logprobs


def test_pause_continue_and_release_resume_keep_greedy_tokens(server):
    url, _ = server
    body = {"text": "the cat sat", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    _, before = _post(f"{url}/generate", body)
    for tags in (["kv_cache"], None):
        assert _post(f"{url}/release_memory_occupation", {"tags": tags}) == (200, None)
        status, refused = _post(f"{url}/generate", body)
        assert status == 400 and "resume_memory_occupation" in refused["error"]["message"]
        assert _post(f"{url}/resume_memory_occupation", {"tags": tags}) == (200, None)
        _, after = _post(f"{url}/generate", body)
        assert after["output_ids"] == before["output_ids"]
    assert _post(f"{url}/release_memory_occupation", {"tags": ["gpu"]})[0] == 400
    assert _post(f"{url}/pause_generation", {"mode": "sideways"})[0] == 400
    # in_place: a request sent while paused waits, then finishes with the same tokens.
    assert _post(f"{url}/pause_generation", {"mode": "in_place"}) == (
        200, {"message": "Generation paused successfully.", "status": "ok"})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_post, f"{url}/generate", body)
        for _ in range(10_000):   # until the server holds it (each poll is a round trip)
            with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
                if json.loads(r.read())["internal_states"][0]["outstanding_requests"]:
                    break
        assert not held.done()
        assert _post(f"{url}/continue_generation", {}) == (
            200, {"message": "Generation continued successfully.", "status": "ok"})
        assert held.result()[1]["output_ids"] == before["output_ids"]
