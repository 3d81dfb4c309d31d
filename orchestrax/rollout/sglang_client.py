"""Sampler over one or more SGLang-compatible servers (real SGLang, `sglang-router`, or
`orchestrax serve`), speaking the native `/generate` API over aiohttp.

Each request goes to a server that is up and serves the current weights, the one with the fewest
outstanding requests. A connection error or timeout marks that server down (only a health check
brings it back); a 5xx, or a 200 whose body is cut or malformed, leaves it up but has it
re-checked at once. Either way the request is retried on another server (same rid; the caller
gets exactly one result per request). A 400 is the request's own fault and is raised at once.

Weights. A background task checks every server each `health_interval_s`: `/health`, then
`/model_info`'s `weight_version` and `model_path`. The client that published weights
(`update_weights_from_disk`) replays its last sync to a server that reports anything else (one
that missed it, or restarted since and serves its start weights) before routing to it again.
A client that publishes nothing (an episode worker's) knows no path or version of its own: it
does not route to a server that reports the not-yet-synced version while another reports a
synced one. Every answer's `meta_info.weight_version` is checked the same way, so a server seen
to be behind has its answer retried elsewhere (counted in `stats["stale_answers"]`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from typing import Any, Sequence

import aiohttp

from orchestrax.checks import above, at_least
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult, Sampler
from orchestrax.rollout.protocol import ProtocolError, request_to_json, result_from_json
from orchestrax.rollout.weight_sync import WeightSync, write_version

log = logging.getLogger(__name__)


async def post_json(session: aiohttp.ClientSession, url: str, body: Any, **kw: Any
                    ) -> tuple[int, Any]:
    """POST `body` (JSON-encoded unless already str or bytes, sent as they are) to `url` ->
    (status, the answer's JSON, or its text when it is not JSON: aiohttp's own 413 is plain)."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    async with session.post(url, data=data, headers=headers, **kw) as resp:
        text = await resp.text()
    if "json" in resp.headers.get("Content-Type", ""):
        try:
            return resp.status, json.loads(text)
        except ValueError:
            pass
    return resp.status, text

# What a server reports before any weight update: SGLang's `--weight-version` default, and
# `orchestrax serve`'s. The trainer's versions are step numbers, so they never equal it.
UNSYNCED_VERSION = "default"


class SamplerUnavailable(RuntimeError):
    """Every attempt on every server failed."""


class WeightSyncError(RuntimeError):
    pass


class _BadResponse(Exception):
    """A 200 answer whose body is truncated or not a /generate item: retried elsewhere."""


class _StaleAnswer(Exception):
    """A 200 answer from weights other than the current ones, while a current server is up."""


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
        above(self, 0, "request_timeout_s", "health_interval_s", "health_timeout_s")
        at_least(self, 1, "max_attempts")


@dataclasses.dataclass(eq=False)
class _Server:
    url: str
    healthy: bool = True                # False: its connection failed; a health check decides
    suspect: bool = False               # it answered a failure; a health check is under way
    outstanding: int = 0
    weight_version: str | None = None   # what it last reported (/model_info or an answer)
    model_path: str | None = None       # what its /model_info last reported (None: unknown)
    sync_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    check: asyncio.Task | None = None   # the health check in progress, if any


_UNREACHABLE = (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError)


class SGLangClient(Sampler):
    """`Sampler` protocol over HTTP. Use as `async with SGLangClient(cfg) as s: ...`.
    `weight_sync`: where `publish` writes each version for the servers to load (None: this
    client only samples)."""

    def __init__(self, config: SGLangClientConfig, *, weight_sync: WeightSync | None = None):
        self.config, self.weight_sync = config, weight_sync
        self.servers = [_Server(url=u.rstrip("/")) for u in config.urls]
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None
        self._last_sync: dict[str, Any] | None = None
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "stale_answers": 0}
        self._reported = dict(self.stats)

    async def __aenter__(self) -> "SGLangClient":
        self._ensure_session()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        tasks = [t for t in [self._health_task, *(s.check for s in self.servers)] if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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

    # --- which server ------------------------------------------------------------------------
    def behind(self, server: _Server) -> bool:
        """Whether `server` serves weights other than the current ones. Current: the last sync
        this client sent (version and path); for a client that sent none, any synced version
        once some server reports one."""
        if self._last_sync is not None:
            return (server.weight_version != self._last_sync["weight_version"]
                    or server.model_path not in (None, self._last_sync["model_path"]))
        return server.weight_version == UNSYNCED_VERSION and any(
            s.weight_version not in (None, "", UNSYNCED_VERSION) for s in self.servers)

    def _pick(self, tried: set[str]) -> _Server:
        # A server known down only when none is up (it may be back); one that just answered a
        # failure only when no other is up (it fails fast, so least-outstanding would favour
        # it); a server behind only when no current one is up (its turns are then dropped as
        # stale by the trainer).
        up = ([s for s in self.servers if s.healthy and not s.suspect]
              or [s for s in self.servers if s.healthy] or self.servers)
        current = [s for s in up if not self.behind(s)] or up
        pool = [s for s in current if s.url not in tried] or current
        return min(pool, key=lambda s: s.outstanding)

    def _note_version(self, server: _Server, version: str) -> bool:
        """Record the weight version an answer reports; True if it is stale while another
        server that is up serves the current weights."""
        if version and version != server.weight_version:
            server.weight_version, server.model_path = version, None  # path: ask /model_info
        return self.behind(server) and any(s.healthy and not self.behind(s)
                                           for s in self.servers if s is not server)

    # --- generation ----------------------------------------------------------------------------
    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        # One HTTP call per request, so routing balances per request and a failure retries
        # only the request it hit.
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

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
                        result = result_from_json(await resp.json(), request=req)
                    except (ValueError, aiohttp.ContentTypeError) as e:
                        # A 200 that does not parse is the server's (or the network's) fault.
                        raise _BadResponse(f"{server.url} sent a malformed body: {e}") from None
                if self._note_version(server, result.weight_version):
                    self.stats["stale_answers"] += 1
                    raise _StaleAnswer(f"{server.url} answered from weights "
                                       f"{result.weight_version!r}")
                return result
            except ProtocolError:
                raise
            except (*_UNREACHABLE, aiohttp.ClientError, _BadResponse, _StaleAnswer) as e:
                last = e
                if isinstance(e, _UNREACHABLE):
                    server.healthy = False  # refused, reset or timed out: down until checked
                else:  # it answered: up, but ask whether it is healthy and what it serves
                    server.suspect = True
                    self._recheck(server)
                self.stats["retries"] += 1
                log.warning("generate on %s failed (%s); retrying elsewhere", server.url, e)
                await asyncio.sleep(self.config.retry_backoff_s * 2 ** attempt)
            finally:
                server.outstanding -= 1
        self.stats["failures"] += 1
        raise SamplerUnavailable(f"request {req.rid} failed on {sorted(tried)} after "
                                 f"{self.config.max_attempts} attempts: {last}")

    def take_counters(self) -> dict[str, int]:
        """Requests, retries (failed attempts, stale answers included), failed requests and
        stale answers since the previous call (for per-step metrics)."""
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
        return await post_json(self._ensure_session(), f"{server.url}{path}", body)

    async def _read_model_info(self, server: _Server) -> None:
        """Record the weight version and model path `/model_info` reports (SGLang's field names;
        SGLang, like `orchestrax serve`, sets model_path to the last loaded directory). A server
        without the route (a plain proxy) keeps what was known."""
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        async with self._ensure_session().get(f"{server.url}/model_info",
                                              timeout=timeout) as resp:
            if resp.status != 200:
                return
            info = await resp.json()
        if isinstance(info, dict) and info.get("weight_version") is not None:
            server.weight_version = str(info["weight_version"])
            server.model_path = info.get("model_path")

    async def check_health(self, server: _Server) -> bool:
        """`/health`, then what `/model_info` says it serves; a server behind this client's last
        weight sync gets it replayed. Returns whether the server is up and current."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
            async with self._ensure_session().get(f"{server.url}/health",
                                                  timeout=timeout) as resp:
                server.healthy = resp.status == 200
            if server.healthy:
                await self._read_model_info(server)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError):
            server.healthy = False
        server.suspect = False
        if server.healthy and self._last_sync is not None and self.behind(server):
            await self._sync_one(server)
        return server.healthy and not self.behind(server)

    def _recheck(self, server: _Server) -> asyncio.Task:
        """A health check of `server` now, unless one is running."""
        if server.check is None or server.check.done():
            server.check = asyncio.get_running_loop().create_task(self.check_health(server))
        return server.check

    async def _health_loop(self) -> None:
        # Every server, not only the ones seen failing: a server restarted between two checks
        # answers /health but serves its start weights.
        while True:
            await asyncio.gather(*(self._recheck(s) for s in self.servers),
                                 return_exceptions=True)
            await asyncio.sleep(self.config.health_interval_s)

    async def _sync_one(self, server: _Server, *, replay: bool = True) -> bool:
        """Load this client's last weight sync on `server` and check `/model_info`. One sync per
        server at a time, and always the newest: a replay never lands after a newer publish,
        and is skipped if the server became current while it waited."""
        async with server.sync_lock:
            if replay and not self.behind(server):
                return True
            body = self._last_sync
            try:
                status, out = await self._post(server, "/update_weights_from_disk", body)
                await self._read_model_info(server)
            except _UNREACHABLE as e:
                log.warning("weight sync to %s failed: %s", server.url, e)
                server.healthy = False
                return False
            except (aiohttp.ClientError, ValueError) as e:
                log.warning("weight sync to %s failed: %s", server.url, e)
                return False
            ok = status == 200 and not self.behind(server)
            if not ok:
                log.warning("weight sync to %s rejected: %s %s (it reports version %r, path %r)",
                            server.url, status, out, server.weight_version, server.model_path)
            return ok

    async def publish(self, params: Any, version: str) -> Any:
        """Write `params` as an HF directory (in a worker thread: blocking file I/O) and load it
        on every server, checking each server's weight_version. Returns the directory."""
        ws = self.weight_sync
        if ws is None:
            raise RuntimeError("SGLangClient.publish: this client has no weight_sync directory "
                               "(SamplerConfig.weight_sync_dir)")
        path = await asyncio.to_thread(write_version, ws.model, params, ws.root, str(version),
                                       tokenizer_dir=ws.tokenizer_dir, keep=ws.keep)
        await self.update_weights_from_disk(str(path.resolve()), str(version))
        return path

    async def update_weights_from_disk(self, model_path: str, weight_version: str, *,
                                       abort_all_requests: bool = False) -> None:
        """Load `model_path` on every server and check `/model_info`'s weight_version and
        model_path. From now on a server that reports anything else is not routed to; the
        health checks replay this sync to it (a server down now, one that rejected it, one
        restarted later)."""
        body = {"model_path": model_path, "weight_version": str(weight_version),
                "abort_all_requests": abort_all_requests}
        self._last_sync = body
        live = [s for s in self.servers if s.healthy]
        results = await asyncio.gather(*(self._sync_one(s, replay=False) for s in live))
        if not any(results):
            # Each server is marked down (a failed request, or a health check whose timeout
            # ran out while this process's event loop was blocked, e.g. by a train step) or
            # refused: check every one again now; a check replays this sync to one that is up.
            await asyncio.gather(*(self._recheck(s) for s in self.servers),
                                 return_exceptions=True)
            if not any(s.healthy and not self.behind(s) for s in self.servers):
                raise WeightSyncError(f"no server accepted weights {model_path} "
                                      f"(version {weight_version})")
