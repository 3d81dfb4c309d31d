"""Sampler over one or more SGLang-compatible servers (real SGLang, `sglang-router`, or
`orchestrax serve`), speaking the native `/generate` API over aiohttp.

Each request goes to the healthy server with the fewest outstanding requests; a connection
error, timeout, 5xx, or a 200 whose body is cut or malformed marks that server down and the
request is retried on another (same rid; the caller gets exactly one result per request). A 400
is the request's own fault and is raised at once. A background task re-checks down servers with
`/health` and, before routing to them again, replays the last weight sync they missed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from typing import Any, Sequence

import aiohttp

from orchestrax.rollout.base import GenerateRequest, GenerateResult
from orchestrax.rollout.protocol import ProtocolError, request_to_json, result_from_json

log = logging.getLogger(__name__)


class SamplerUnavailable(RuntimeError):
    """Every attempt on every server failed."""


class WeightSyncError(RuntimeError):
    pass


class _BadResponse(Exception):
    """A 200 answer whose body is truncated or not a /generate item: retried elsewhere."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGLangClientConfig:
    urls: tuple[str, ...]
    request_timeout_s: float = 600.0
    max_attempts: int = 4                # per request, across servers
    retry_backoff_s: float = 0.05        # doubled per attempt
    health_interval_s: float = 1.0
    health_timeout_s: float = 5.0
    max_connections: int = 1024

    def __post_init__(self):
        if not self.urls:
            raise ValueError("SGLangClientConfig.urls is empty; give at least one server URL")
        for u in self.urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"SGLangClientConfig.urls entry {u!r}; must start with http(s)://")
        for name in ("request_timeout_s", "health_interval_s", "health_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SGLangClientConfig.{name}={getattr(self, name)}; must be > 0")
        if self.max_attempts < 1:
            raise ValueError(f"SGLangClientConfig.max_attempts={self.max_attempts}; must be >= 1")


@dataclasses.dataclass(eq=False)
class _Server:
    url: str
    healthy: bool = True
    outstanding: int = 0
    weight_version: str | None = None   # last version this server confirmed


class SGLangClient:
    """`Sampler` protocol over HTTP. Use as `async with SGLangClient(cfg) as s: ...`."""

    def __init__(self, config: SGLangClientConfig):
        self.config = config
        self.servers = [_Server(url=u.rstrip("/")) for u in config.urls]
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None
        self._last_sync: dict[str, Any] | None = None
        self.stats = {"requests": 0, "retries": 0, "failures": 0}
        self._reported = dict(self.stats)

    async def __aenter__(self) -> "SGLangClient":
        self._ensure_session()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            self._health_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s))
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())
        return self._session

    # --- generation ----------------------------------------------------------------------------
    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        # One HTTP call per request, so routing balances per request and a failure retries
        # only the request it hit.
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def _pick(self, tried: set[str]) -> _Server:
        pool = [s for s in self.servers if s.healthy and s.url not in tried] \
            or [s for s in self.servers if s.healthy] \
            or [s for s in self.servers if s.url not in tried] or self.servers
        return min(pool, key=lambda s: s.outstanding)

    async def _one(self, req: GenerateRequest) -> GenerateResult:
        session = self._ensure_session()
        if req.rid is None:  # an id lets abort() reach the request on the server
            req = dataclasses.replace(req, rid=uuid.uuid4().hex)
        body = request_to_json([req])
        body = {**body, "input_ids": body["input_ids"][0],
                "sampling_params": body["sampling_params"][0], "rid": req.rid}
        tried: set[str] = set()
        last: Exception | None = None
        self.stats["requests"] += 1
        for attempt in range(self.config.max_attempts):
            server = self._pick(tried)
            tried.add(server.url)
            server.outstanding += 1
            try:
                async with session.post(f"{server.url}/generate", json=body) as resp:
                    if resp.status == 400:  # our request is wrong: retrying cannot help
                        raise ProtocolError(f"{server.url}: {await resp.text()}")
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(resp.request_info, (),
                                                          status=resp.status,
                                                          message=await resp.text())
                    try:
                        return result_from_json(await resp.json(), request=req)
                    except (ValueError, aiohttp.ContentTypeError) as e:
                        # A 200 that does not parse is the server's (or the network's) fault.
                        raise _BadResponse(f"{server.url} sent a malformed body: {e}") from None
            except ProtocolError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError,
                    _BadResponse) as e:
                last = e
                server.healthy = False
                self.stats["retries"] += 1
                log.warning("generate on %s failed (%s); retrying elsewhere", server.url, e)
                await asyncio.sleep(self.config.retry_backoff_s * 2 ** attempt)
            finally:
                server.outstanding -= 1
        self.stats["failures"] += 1
        raise SamplerUnavailable(f"request {req.rid} failed on {sorted(tried)} after "
                                 f"{self.config.max_attempts} attempts: {last}")

    def take_counters(self) -> dict[str, int]:
        """Requests, retries and failed requests since the previous call (for per-step metrics)."""
        out = {k: v - self._reported[k] for k, v in self.stats.items()}
        self._reported = dict(self.stats)
        return out

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request (by rid) or all in-flight requests on every server; the pending
        `generate` calls return with finish_reason 'abort'."""
        body = {"abort_all": True} if rid is None else {"rid": rid}
        await asyncio.gather(*(self._post(s, "/abort_request", body) for s in self.servers),
                             return_exceptions=True)

    # --- health and weights --------------------------------------------------------------------
    async def _post(self, server: _Server, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        session = self._ensure_session()
        async with session.post(f"{server.url}{path}", json=body) as resp:
            ctype = resp.headers.get("Content-Type", "")
            return resp.status, (await resp.json() if "json" in ctype else await resp.text())

    async def _get_json(self, server: _Server, path: str) -> Any:
        session = self._ensure_session()
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        async with session.get(f"{server.url}{path}", timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def check_health(self, server: _Server) -> bool:
        session = self._ensure_session()
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
            async with session.get(f"{server.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
            if ok and self._last_sync and server.weight_version != self._last_sync["weight_version"]:
                ok = await self._sync_one(server, self._last_sync)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            ok = False
        server.healthy = ok
        return ok

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            down = [s for s in self.servers if not s.healthy]
            if down:
                await asyncio.gather(*(self.check_health(s) for s in down))

    async def _sync_one(self, server: _Server, body: dict[str, Any]) -> bool:
        try:
            status, out = await self._post(server, "/update_weights_from_disk", body)
            info = await self._get_json(server, "/model_info")
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            log.warning("weight sync to %s failed: %s", server.url, e)
            return False
        ok = status == 200 and info.get("weight_version") == body["weight_version"]
        if ok:
            server.weight_version = body["weight_version"]
        else:
            log.warning("weight sync to %s rejected: %s %s", server.url, status, out)
        return ok

    async def update_weights_from_disk(self, model_path: str, weight_version: str, *,
                                       abort_all_requests: bool = False) -> None:
        """Load `model_path` on every server and check `/model_info`'s weight_version. A server
        that is down now gets the same update when it comes back, before any traffic."""
        body = {"model_path": model_path, "weight_version": str(weight_version),
                "abort_all_requests": abort_all_requests}
        self._last_sync = body
        live = [s for s in self.servers if s.healthy]
        results = await asyncio.gather(*(self._sync_one(s, body) for s in live))
        for s, ok in zip(live, results):
            s.healthy = ok
        if not any(results):
            raise WeightSyncError(f"no server accepted weights {model_path} "
                                  f"(version {weight_version})")
