"""The child processes of `orchestrax rehearse` (servers, trainers, eval) and the HTTP calls
it makes to them: each child in its own session, its output in a log file, SIGKILLed if the
parent dies; `Fleet.close` stops them all."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Any, Sequence


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the rehearsal dies (PR_SET_PDEATHSIG), so a
    killed rehearsal leaves no server behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)


@dataclasses.dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: pathlib.Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


class Fleet:
    """The processes of one rehearsal; `close` stops them all (TERM, then KILL)."""

    def __init__(self, logs: pathlib.Path):
        self.logs = logs
        self.children: list[Child] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Child:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def check(self, children: Sequence[Child] | None = None, *, done_ok: bool = False) -> None:
        """Fail naming the first of `children` (default: all) that exited on its own; with
        `done_ok`, one that exited with 0 has finished and is not a failure."""
        for c in self.children if children is None else children:
            code = c.proc.poll()
            if code is not None and not (done_ok and code == 0):
                raise RuntimeError(f"{c.name} exited with {code}; its log {c.log} ends:\n"
                                   f"{c.tail()}")

    def stop(self, children: Sequence[Child]) -> None:
        for c in children:
            if c.proc.poll() is None:
                os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for c in children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
        self.children = [c for c in self.children if c not in children]

    def close(self) -> None:
        self.stop(list(self.children))


def get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(fleet: Fleet, ready, what: str, deadline: float) -> None:
    """Poll `ready()` until it is true; fail if a child dies or the deadline passes."""
    while True:
        fleet.check()
        try:
            if ready():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"rehearsal: timed out waiting for {what}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def url_port(url: str) -> int:
    host_port = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError(f"rehearsal: {url!r} is not a loopback URL with a port; the rehearsal "
                         "starts every server itself on 127.0.0.1")
    return int(port)
