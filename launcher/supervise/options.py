"""The tunables of one supervision (``SupervisorOptions``); the defaults suit systemd and containers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.common.errors import ExitCode
from launcher.supervise.keepalive import EXTEND_BY_S, EXTEND_EVERY_S
from launcher.supervise.output import MAX_LINE_BYTES
from launcher.supervise.readiness import HealthCheck

DRAIN_AFTER_EXIT_S = 2.0  # how long to read pipes that outlive the engine's group
STOP_FLUSH_S = 5.0  # after a requested stop, the engine's last output gets this long beyond its exit
STOPPING_SLACK_S = 5.0  # what systemd is told to wait beyond the grace, the drain and the flush


@dataclass(frozen=True)
class SupervisorOptions:
    """Tunables of one supervision; the defaults suit systemd and containers."""

    grace_s: float = 30.0  # SIGTERM -> SIGKILL (Kubernetes' default grace is 30 s too)
    health: HealthCheck | None = None  # poll it from each start; 200 -> on_ready
    liveness_exit_code: int = int(ExitCode.SOFTWARE)  # health.failures probes failed in a row after ready
    ready_file: Path | None = None  # written at mark_ready(), removed when not ready or at exit
    watch_timeouts_s: Mapping[str, float] = field(default_factory=dict)  # event name -> seconds from start
    notify_env: Mapping[str, str] | None = None  # where NOTIFY_SOCKET/WATCHDOG_USEC are read; None: os.environ
    stdout_fd: int = 1
    stderr_fd: int = 2
    group_guard: bool = True
    reap_orphans: bool | None = None  # waitpid(-1) for every child; None: only when we are PID 1
    handle_signals: bool = True  # needs run() on the main thread
    extend_every_s: float = EXTEND_EVERY_S
    extend_by_s: float = EXTEND_BY_S
    max_line_bytes: int = MAX_LINE_BYTES
    line_filter: tuple[bytes, ...] | None = None  # on_line gets only lines holding one of these
    output_flush_s: float = 30.0  # after the engine ended unasked, how long a stalled reader may keep us waiting
    stop_flush_s: float = STOP_FLUSH_S  # ... and after a stop we were asked for (systemd waits on us)

    @property
    def stopping_covers_s(self) -> float:
        """How long a stop may take from SIGTERM to our exit: what ``STOPPING=1`` asks systemd to wait."""
        return self.grace_s + DRAIN_AFTER_EXIT_S + self.stop_flush_s + STOPPING_SLACK_S
