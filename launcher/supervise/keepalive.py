"""What systemd hears from the supervisor: READY, STATUS, EXTEND_TIMEOUT, WATCHDOG, STOPPING.

* while the engine loads, ``EXTEND_TIMEOUT_USEC`` every ``extend_every_s`` (a start that takes
  longer than ``TimeoutStartSec=`` is still alive while we say so);
* ``READY=1`` with a ``STATUS=`` line when the engine is ready;
* ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the engine is ready and alive (the loop
  decides "alive": the liveness probes pass);
* ``STOPPING=1`` once, with an extension that covers the grace period and the drain.

Every call is a no-op without ``NOTIFY_SOCKET`` and never raises (``sdnotify``).
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.supervise import sdnotify

EXTEND_EVERY_S = 10.0  # while loading, tell systemd every 10 s ...
EXTEND_BY_S = 30.0  # ... to wait 30 s more (a lost datagram still leaves 20 s of slack)
MIN_WATCHDOG_EVERY_S = 0.5  # a tiny WATCHDOG_USEC must not make the loop spin


def one_line(text: str) -> str:
    """``STATUS=`` takes one line: newlines (from an engine or a model name) become spaces."""
    return " ".join(text.split())


class KeepAlive:
    """The systemd notifications of one supervision, with their schedules (monotonic seconds)."""

    def __init__(self, env: Mapping[str, str] | None, *, extend_every_s: float = EXTEND_EVERY_S,
                 extend_by_s: float = EXTEND_BY_S) -> None:
        self._env = env
        self._extend_every_s = extend_every_s
        self._extend_by_s = extend_by_s
        watchdog = sdnotify.watchdog_interval_s(env)
        self.watchdog_every_s = max(watchdog, MIN_WATCHDOG_EVERY_S) if watchdog is not None else None
        self.next_extend: float | None = None
        self.next_watchdog: float | None = None
        self.stopping_sent = False

    def notify(self, state: str) -> None:
        sdnotify.notify(state, self._env)

    def status(self, text: str) -> None:
        self.notify(f"STATUS={one_line(text)}")

    def starting(self, pid: int, now: float) -> None:
        """An engine was spawned: extend the start timeout from now on; no watchdog until ready."""
        self.next_extend = now
        self.next_watchdog = None
        self.status(f"engine starting (pid {pid})")

    def ready(self, status: str, now: float) -> None:
        self.next_extend = None
        self.notify(f"READY=1\nSTATUS={one_line(status)}")
        if self.watchdog_every_s is not None:
            self.next_watchdog = now

    def restarting(self) -> None:
        self.status("restarting the engine")

    def stopping(self, covers_s: float) -> None:
        """Say STOPPING=1 once, asking systemd to wait ``covers_s`` for the engine to go."""
        if not self.stopping_sent:
            self.stopping_sent = True
            self.notify(f"STOPPING=1\nSTATUS=stopping the engine\nEXTEND_TIMEOUT_USEC={int(covers_s * 1e6)}")

    def tick(self, now: float, *, loading: bool, alive: bool) -> None:
        """Send what is due: an extension while ``loading``, a watchdog ping while ``alive``."""
        if self.next_extend is not None and now >= self.next_extend and loading:
            self.notify(f"EXTEND_TIMEOUT_USEC={int(self._extend_by_s * 1e6)}")
            self.next_extend = now + self._extend_every_s
        if self.next_watchdog is not None and self.watchdog_every_s is not None and now >= self.next_watchdog:
            if alive:
                self.notify("WATCHDOG=1")
            self.next_watchdog = now + self.watchdog_every_s

    def deadlines(self) -> list[float]:
        return [t for t in (self.next_extend, self.next_watchdog) if t is not None]

    def close(self) -> None:
        """At the end of supervision: STOPPING=1 if it was not said yet."""
        if not self.stopping_sent:
            self.stopping_sent = True
            self.notify("STOPPING=1")
