"""Ending one engine: SIGTERM to its group, the grace, SIGKILL, and the drain of its pipes after it exits.

``Stopper`` keeps the current engine's ``StopBook`` (why it is being stopped; the outcome reads
it) and the timers of its end: a delayed SIGTERM (``request_stop(after_s=...)``), the grace
after which the group is SIGKILLed, and, once the engine is reaped, how long its pipes are
still read: ``DRAIN_AFTER_EXIT_S`` for processes that outlive the group, stretched up to the
flush budget while a slow reader (not a process) holds them. The loop decides *when* an
engine is stopped (its states); this module only *how*. A fresh book at every start.
"""

from __future__ import annotations

import signal
import time

import structlog

from launcher.supervise.options import DRAIN_AFTER_EXIT_S, SupervisorOptions
from launcher.supervise.outcome import STOP_SIGNALS_CLEAN, StopBook
from launcher.supervise.process import Engine

log = structlog.get_logger("safe_serve.supervisor")


class Stopper:
    """The stop of the current engine (see the module docstring)."""

    def __init__(self, options: SupervisorOptions) -> None:
        self._opts = options
        self.book = StopBook()
        self._drain_deadline: float | None = None
        self._drain_limit: float | None = None

    def reset(self) -> None:
        """A new engine starts: nothing asked, no timers."""
        self.book = StopBook()
        self._drain_deadline = self._drain_limit = None

    # ------------------------------------------------------------------ what was asked

    @property
    def asked(self) -> bool:
        """A stop signal or a ``request_stop`` came for this engine."""
        return self.book.signal is not None or self.book.request is not None

    @property
    def group_signalled(self) -> bool:
        """A stop signal went to the group (the grace runs)."""
        return self.book.deadline is not None

    def stop_signal(self, signum: int) -> None:
        """A stop signal came: the first one names the stop; a delayed SIGTERM is now moot."""
        if self.book.signal is None:
            self.book.signal = signum
        self.book.term_at = None

    def sigint(self) -> int:
        """Count a SIGINT; returns how many came."""
        self.book.sigints += 1
        return self.book.sigints

    def request(self, reason: str, exit_code: int) -> None:
        """``request_stop``: the first request decides the exit code."""
        if self.book.request is None:
            self.book.request = (reason, exit_code)

    def term_later(self, after_s: float) -> None:
        """SIGTERM the group ``after_s`` from now (unless a delayed SIGTERM is already set)."""
        if self.book.term_at is None:
            self.book.term_at = time.monotonic() + after_s

    # ------------------------------------------------------------------ signalling the group

    def signal_group(self, engine: Engine, signum: int) -> None:
        """Send ``signum`` to the engine's group; the grace runs from the first one."""
        if self.book.deadline is None:
            self.book.deadline = time.monotonic() + self._opts.grace_s
        if signum in STOP_SIGNALS_CLEAN:
            self.book.forwarded.add(signum)
        engine.signal_group(signum)

    def kill(self, engine: Engine, reason: str) -> None:
        """SIGKILL the group, once, unless the engine is already gone."""
        if self.book.escalation is None and engine.returncode is None:
            self.book.escalation = reason
            log.error("killing the engine's process group", reason=reason, pgid=engine.pgid)
            engine.signal_group(signal.SIGKILL)

    def term_due(self, now: float) -> bool:
        """The delayed SIGTERM is due (and taken off: it fires once)."""
        if self.book.term_at is not None and now >= self.book.term_at:
            self.book.term_at = None
            return True
        return False

    def grace_over(self, now: float) -> bool:
        return self.book.deadline is not None and now >= self.book.deadline

    def deadlines(self) -> list[float]:
        candidates = (self.book.deadline, self.book.term_at, self._drain_deadline)
        return [t for t in candidates if t is not None]

    # ------------------------------------------------------------------ after the exit

    def flush_budget_s(self) -> float:
        """How long a stalled reader may keep us after the engine's exit."""
        return self._opts.stop_flush_s if self.asked else self._opts.output_flush_s

    def drained(self, engine: Engine, now: float, *, reader_stalled: bool) -> bool:
        """The engine is reaped: kill what is left of its group, read its pipes while they may
        still bring output; True once they are closed or their time is up."""
        if self._drain_deadline is None:
            if engine.kill_stragglers():
                log.warning("killed processes left in the engine's process group", pgid=engine.pgid)
            self._drain_deadline = now + DRAIN_AFTER_EXIT_S
            self._drain_limit = now + DRAIN_AFTER_EXIT_S + self.flush_budget_s()
        if reader_stalled and self._drain_limit is not None:
            # a slow reader, not a process outliving the group, keeps the pipes open
            self._drain_deadline = min(max(self._drain_deadline, now + DRAIN_AFTER_EXIT_S), self._drain_limit)
        if engine.pipes and now < self._drain_deadline:
            return False
        if engine.pipes:
            log.warning("engine output pipes still open after its exit; closing them", pgid=engine.pgid)
        return True

    def flush_left_s(self) -> float:
        """What is left of the flush budget, counted from the engine's exit (from now if it never exited)."""
        limit = self._drain_limit if self._drain_limit is not None else time.monotonic() + self.flush_budget_s()
        return max(limit - time.monotonic(), 0.0)
