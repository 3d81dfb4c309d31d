"""The SGLang routes RL frameworks call on `orchestrax serve`, with SGLang's field names."""

from loopback import run_serve

from orchestrax import models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.server import ServerState

TOK = tiny_qwen3_tokenizer()
CFG = models.tiny_config(vocab_size=len(TOK))


def run(fn):
    def make_state():
        sampler = ContinuousSampler(CFG, models.init_params(CFG, seed=0), max_batch=4,
                                    max_len=64, weight_version="v7")
        return ServerState(sampler=sampler, model_path="tiny", tokenizer=TOK)
    return run_serve(make_state, lambda http, url, state: fn(http, url))


def test_rl_routes_answer_with_sglang_fields():
    async def fn(http, url):
        out = {}
        async with http.get(f"{url}/health_generate") as r:
            out["health"] = r.status
        for path, body in (("tokenize", {"prompt": "the answer"}),
                           ("tokenize", {"prompt": ["a b", "<|im_end|>"]}),
                           ("detokenize", {"tokens": TOK.encode("a <|im_end|>")}),
                           ("tokenize", {"prompt": 3}), ("detokenize", {"tokens": [-1]})):
            async with http.post(f"{url}/{path}", json=body) as r:
                out.setdefault(path, []).append((r.status, await r.json()))
        for path in ("weight_version", "get_weight_version"):
            async with http.get(f"{url}/{path}") as r:
                out[path] = (r.status, await r.json())
        async with http.post(f"{url}/update_weights_from_tensor", json={}) as r:
            out["tensor"] = (r.status, await r.json())
        async with http.post(f"{url}/init_weights_update_group", json={}) as r:
            out["nccl"] = r.status
        return out

    out = run(fn)
    assert out["health"] == 200
    (s1, one), (s2, many), (s3, bad) = out["tokenize"]
    assert s1 == 200 and one == {"tokens": TOK.encode("the answer"),
                                 "count": len(TOK.encode("the answer")), "max_model_len": 64}
    assert many["tokens"][1] == [TOK.convert_tokens_to_ids("<|im_end|>")]
    assert many["count"] == [len(t) for t in many["tokens"]]
    assert s3 == 400 and "prompt" in bad["error"]["message"]
    (d1, text), (d2, bad_ids) = out["detokenize"]
    assert (d1, text) == (200, {"text": "a <|im_end|>"})
    assert d2 == 400 and "tokens" in bad_ids["error"]["message"]
    assert out["weight_version"] == out["get_weight_version"] == (200, {"weight_version": "v7"})
    status, body = out["tensor"]
    assert status == 501 and body["success"] is False
    assert "/update_weights_from_disk" in body["message"]
    assert out["nccl"] == 501
