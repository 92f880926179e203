"""Readiness and liveness: the health poller, the failure count after ready, the ready file, the watches.

The poller runs in a thread from each engine start. Until the first 200 it polls every
``interval_s`` and calls ``on_healthy()`` once; after that, when liveness is on
(``live_interval_s > 0``), it probes every ``live_interval_s`` and reports every result to
``on_live(healthy)``, so the loop can count failures in a row (``Liveness``) and feed
systemd's watchdog while the engine answers. ``Watches`` hold the events an engine must report
within a time from its start (``SupervisorOptions.watch_timeouts_s``: its KV cache line).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from launcher.supervise.events import HealthResult, Healthy

log = structlog.get_logger("safe_serve.supervisor")

MAX_STATUS_LINE = 4096  # bytes read for the status line


@dataclass(frozen=True)
class HealthCheck:
    """Where and how often to poll the engine's health endpoint."""

    host: str
    port: int
    path: str = "/health"
    interval_s: float = 1.0  # while starting
    timeout_s: float = 2.0  # in all, per probe: connect, send and every read together
    live_interval_s: float = 0.0  # after the first 200; 0: stop polling (no liveness check)
    live_timeout_s: float = 5.0  # a busy engine may answer slowly while serving (in all, per probe)
    failures: int = 3  # this many failed probes in a row after ready: the engine is gone

    @property
    def url(self) -> str:
        """The URL polled; wildcard binds are polled on loopback."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}{self.path}"


def probe(check: HealthCheck, timeout_s: float) -> bool:
    """One GET of the health path: True on a 200 status line within ``timeout_s`` in all.

    The deadline covers connect, send and every read together (a server that trickles one byte
    a second fails like one that does not answer); only the status line is read. Plain sockets
    to the engine's own address: never a proxy.
    """
    deadline = time.monotonic() + timeout_s
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(check.host, check.host)
    try:
        with socket.create_connection((host, check.port), timeout=timeout_s) as sock:
            netloc = f"[{host}]:{check.port}" if ":" in host else f"{host}:{check.port}"
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(f"GET {check.path} HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode())
            head = b""
            while b"\r\n" not in head and len(head) < MAX_STATUS_LINE:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                chunk = sock.recv(MAX_STATUS_LINE)
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError):
        return False  # refused while loading, timeouts, resets
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1] == b"200"


class HealthPoller:
    """Polls the health URL from a thread (see the module docstring)."""

    def __init__(self, check: HealthCheck, on_healthy: Callable[[], None], on_live: Callable[[bool], None]) -> None:
        self._check = check
        self._on_healthy = on_healthy
        self._on_live = on_live
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="safe-serve-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _probe(self, timeout: float) -> bool:
        return probe(self._check, timeout)

    def _run(self) -> None:
        check = self._check
        while not self._stopped.wait(check.interval_s):
            if self._probe(check.timeout_s) and not self._stopped.is_set():
                self._on_healthy()
                break
        else:
            return
        if check.live_interval_s <= 0:
            return
        while not self._stopped.wait(check.live_interval_s):
            healthy = self._probe(check.live_timeout_s)
            if self._stopped.is_set():
                return
            self._on_live(healthy)


class Liveness:
    """Liveness after ready: failed probes in a row (``check.failures`` of them end the engine), and
    whether the last probe passed recently enough to feed systemd's watchdog."""

    SLACK_S = 1.0

    def __init__(self, check: HealthCheck | None) -> None:
        self.check = check
        self.failures = 0
        self._fresh_until: float | None = None  # a passing probe is this recent; None: not probed after ready

    def passing(self, now: float) -> bool:
        """No probe failed since the last one that passed, and the poller is still reporting (each
        probe has a total deadline: a silent poller is a stuck one)."""
        return self.failures == 0 and (self._fresh_until is None or now <= self._fresh_until)

    def reset(self) -> None:
        self.failures = 0
        self._fresh_until = None

    def _passed(self, now: float) -> None:
        check = self.check
        if check is not None and check.live_interval_s > 0:
            self._fresh_until = now + 2 * (check.live_interval_s + check.live_timeout_s) + self.SLACK_S

    def healthy(self, now: float) -> None:
        """The first 200: probing for liveness starts."""
        self._passed(now)

    def result(self, healthy: bool, now: float) -> str | None:
        """Count one probe; returns why the engine must stop, or None."""
        check = self.check
        if check is None:
            return None
        if healthy:
            if self.failures:
                log.info("engine health answers again", failures=self.failures)
            self.failures = 0
            self._passed(now)
            return None
        self.failures += 1
        log.warning("engine health check failed", url=check.url, failures=self.failures, limit=check.failures)
        if check.failures > 0 and self.failures >= check.failures:
            return f"the engine's {check.path} failed {self.failures} times in a row"
        return None


class Health:
    """The current engine's health: its poller, a fresh one from every start whose reports carry
    that engine's generation (the loop drops an older engine's late reports), and its liveness."""

    def __init__(self, check: HealthCheck | None, post: Callable[[object], None]) -> None:
        self._check = check
        self._post = post  # the loop's inbox: the poller's thread only enqueues
        self._poller: HealthPoller | None = None
        self.liveness = Liveness(check)

    def start(self, generation: int) -> None:
        self.liveness.reset()
        if self._check is None:
            return
        post = self._post
        self._poller = HealthPoller(self._check, lambda: post(Healthy(generation)),
                                    lambda healthy: post(HealthResult(generation, healthy)))
        self._poller.start()

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None


class ReadyFile:
    """The ``--ready-file``: exists (holding the engine pid) exactly while the engine is ready."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        """Atomically, through a random temporary in the file's own directory: never written
        through a link planted at the path or at a temporary's name (launcher.common.safefile)."""
        if self.path is None:
            return
        from launcher.common.safefile import atomic_write, open_dir

        try:
            dir_fd = open_dir(self.path.parent)
            try:
                atomic_write(dir_fd, self.path.name, f"{pid}\n".encode())
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.warning("cannot write the ready file", path=str(self.path), error=str(exc))

    def remove(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the ready file", path=str(self.path), error=str(exc))


class Watches:
    """Events the engine must report in time, armed at every start: name -> seconds from it."""

    def __init__(self, timeouts_s: Mapping[str, float]) -> None:
        self._timeouts_s = timeouts_s
        self._deadlines: dict[str, float] = {}

    def arm(self, now: float) -> None:
        self._deadlines = {name: now + seconds for name, seconds in self._timeouts_s.items()}

    def mark(self, name: str) -> None:
        """The event happened: its watch is off."""
        self._deadlines.pop(name, None)

    def missed(self, now: float) -> list[str]:
        """The watches whose time ran out, taken off (each is missed once)."""
        missed = [name for name, deadline in self._deadlines.items() if now >= deadline]
        for name in missed:
            del self._deadlines[name]
        return missed

    def deadlines(self) -> list[float]:
        return list(self._deadlines.values())
