"""Episodes in several worker processes, each with its own asyncio event loop.

One event loop runs thousands of episodes while they wait on tools and the sampler, but the
Python work of a turn (decode, parse, validate, tokenise the observations, bookkeeping) runs on
one core. With a fast sampler that work is the bottleneck; `EpisodePool` spreads the episodes of a
batch over `workers` processes (the agent-loop workers of verl, the rollout workers of slime).

Each worker builds its own world once, from a picklable `build` callable run inside the worker:
a `Player` whose `play(job)` runs one episode there and returns something picklable (usually a
`Trajectory`, or `(trajectory, outcome)` when the worker also verifies). A job is whatever the
player needs to know about one episode: a `Task`, or a task with per-call settings. Samplers
that live in another process (SGLang servers, or the trainer's embedded sampler served on
loopback) are reached by each worker's own HTTP client.

Workers start with the "spawn" method: the trainer process holds JAX's threads, which a fork
would copy in an undefined state. A worker that dies is started again and its share of the batch
is played again once; a second death raises.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import multiprocessing
import queue
import threading
import traceback
from typing import Any, Callable, Protocol, Sequence

from orchestrax.agent.fanout import YOUNG_GC_THRESHOLD, young_gc_threshold


class Player(Protocol):
    async def play(self, job: Any) -> Any: ...
    # Optional: `async def aclose(self)`, awaited in the worker when the pool closes.


class WorkerError(RuntimeError):
    """A worker's `build` or `play` raised; carries the worker's traceback text."""


def _worker_main(conn, build: Callable[[], Player], max_in_flight: int) -> None:
    """Loop of one worker: receive a list of jobs, play them, stream the results back.

    Results go back in small batches as episodes finish ("part" messages of (index, result)),
    so the parent unpickles them while the rest of the share still waits on tools; "done" ends
    the share. A sender thread does the pickling and pipe writes, so a slow reader never stalls
    this worker's event loop for long."""
    try:
        player = build()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    # The young generation fills with coroutine frames, handles and futures that die young;
    # every full collection walks each live trajectory's token lists. Frozen: what `build` made.
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=_send_all, args=(conn, outbox), daemon=True)
    sender.start()

    async def play_all(jobs: Sequence[Any]) -> None:
        gate = asyncio.Semaphore(max_in_flight)
        loop = asyncio.get_running_loop()
        pending: list[tuple[int, Any]] = []

        def flush():  # scheduled once per loop iteration that finished episodes
            if pending:
                outbox.put(("part", pending[:]))
                pending.clear()

        async def one(index: int, job: Any):
            async with gate:
                result = await player.play(job)
            if not pending:
                loop.call_soon(flush)
            pending.append((index, result))

        try:  # a failing job cancels the rest of its share (and sends none of it)
            async with asyncio.TaskGroup() as group:
                for index, job in enumerate(jobs):
                    group.create_task(one(index, job))
        except BaseException:
            pending.clear()
            raise
        flush()

    with asyncio.Runner() as runner:
        while True:
            try:
                jobs = conn.recv()
            except EOFError:  # the parent went away
                break
            if jobs is None:
                break
            try:
                runner.run(play_all(jobs))
                outbox.put(("done", None))
            except Exception:
                outbox.put(("error", traceback.format_exc()))
        if hasattr(player, "aclose"):  # e.g. HTTP sessions of the player's sampler client
            runner.run(player.aclose())
    outbox.put(None)
    sender.join()


def _send_all(conn, outbox: queue.SimpleQueue) -> None:
    while (message := outbox.get()) is not None:
        try:
            conn.send(message)
        except (BrokenPipeError, OSError):  # the parent went away
            return


class EpisodePool:
    """`workers` processes playing episodes; `await pool.play(jobs)` returns results in job
    order (one `play` at a time). Use as a context manager, or call `close()`."""

    def __init__(self, build: Callable[[], Player], *, workers: int, max_in_flight: int = 4096):
        if workers < 1:
            raise ValueError(f"EpisodePool workers={workers}; must be >= 1")
        if max_in_flight < 1:
            raise ValueError(f"EpisodePool max_in_flight={max_in_flight}; must be >= 1 "
                             "(episodes alive at once in each worker)")
        self._build, self._max_in_flight = build, max_in_flight
        self._ctx = multiprocessing.get_context("spawn")
        # All workers boot at once (interpreter, imports, `build`), so the pool is ready in about
        # one worker's start time rather than the sum of them.
        self._workers = self._await_ready([self._launch() for _ in range(workers)])

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._workers]

    def _launch(self):
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, self._build, self._max_in_flight),
                                 daemon=True, name="orchestrax-episodes")
        proc.start()
        child.close()
        return proc, parent

    def _await_ready(self, launched: list) -> list:
        failure = None
        for proc, conn in launched:
            status, detail = self._receive(conn, proc)
            if status != "ready" and failure is None:
                failure = detail
        if failure is not None:
            for proc, conn in launched:
                if proc.is_alive():
                    proc.terminate()
                proc.join()
                conn.close()
            raise WorkerError(f"episode worker failed to build its player:\n{failure}")
        return launched

    def _start(self):
        return self._await_ready([self._launch()])[0]

    @staticmethod
    def _receive(conn, proc) -> tuple[str, Any]:
        try:
            return conn.recv()
        except EOFError:
            proc.join()
            return "died", f"exit code {proc.exitcode}"

    async def play(self, jobs: Sequence[Any],
                   on_done: Callable[[int], object] | None = None) -> list[Any]:
        """Play every job; job i goes to worker i % workers (a GRPO group's copies of one task
        spread over the workers). Results come back in job order. `on_done(n)` is called on
        this event loop as each batch of n results arrives (a progress bar's update; a share
        replayed after its worker died counts again)."""
        n = len(self._workers)
        shares = [list(jobs[w::n]) for w in range(n)]
        report = None
        if on_done is not None:
            loop = asyncio.get_running_loop()
            report = functools.partial(loop.call_soon_threadsafe, on_done)
        # Every share runs to its end before an error is raised: a worker's pipe must never have
        # two readers (this batch's and the next one's).
        with young_gc_threshold():  # unpickling thousands of trajectories
            done = await asyncio.gather(
                *(self._play_share(w, s, report) for w, s in enumerate(shares) if s),
                return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        results: list[Any] = [None] * len(jobs)
        for w, share in zip((w for w, s in enumerate(shares) if s), done):
            results[w::n] = share
        return results

    async def _play_share(self, w: int, share: list[Any], report) -> list[Any]:
        for attempt in range(2):
            proc, conn = self._workers[w]
            status, detail = await asyncio.to_thread(self._exchange, conn, proc, share, report)
            if status == "done":
                return detail
            if status == "error":
                raise WorkerError(f"episode worker {w} raised:\n{detail}")
            # The process died (OOM kill, segfault in a native tool): start another, replay.
            conn.close()
            self._workers[w] = await asyncio.to_thread(self._start)
        raise WorkerError(f"episode worker {w} died twice on the same share ({detail})")

    def _exchange(self, conn, proc, share, report):
        """Runs in a thread: send the share, collect its streamed results (`report(n)` for
        each part of n, when given)."""
        try:
            conn.send(share)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            proc.join()
            return "died", f"exit code {proc.exitcode}"
        results: list[Any] = [None] * len(share)
        while True:
            status, detail = self._receive(conn, proc)
            if status != "part":
                return (status, results) if status == "done" else (status, detail)
            for index, result in detail:
                results[index] = result
            if report is not None:
                report(len(detail))

    def close(self) -> None:
        for proc, conn in self._workers:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
            conn.close()
        self._workers = []

    def __enter__(self) -> "EpisodePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
