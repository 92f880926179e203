"""Supervising one engine process: spawn it, pass its output through, stop it cleanly.

Modules, in the order a start meets them: ``options`` (``SupervisorOptions``), ``process``
(spawning the engine in its process group with its guard, reaping), ``output`` (pass-through
that a slow reader cannot block), ``streams`` (reading the pipes, the two writers,
back-pressure, the status line), ``readiness`` (health poller, liveness count, ready file,
watches), ``keepalive`` (READY/STATUS/EXTEND/WATCHDOG/STOPPING), ``events`` (the loop's inbox,
signal handlers and the control methods that post to it), ``stopping`` (SIGTERM, grace,
SIGKILL, the drain after exit), ``outcome`` (the exit-code rules), ``loop`` (the
``Supervisor``: its state machine and dispatch tables), ``sdnotify`` (the datagram protocol).
"""

from __future__ import annotations

from launcher.supervise.loop import Supervisor
from launcher.supervise.options import SupervisorOptions
from launcher.supervise.outcome import (
    Phase,
    State,
    StopBook,
    SupervisorOutcome,
    decide_outcome,
    exit_code_for,
    signal_name,
)
from launcher.supervise.output import QueuedWriter, StreamPump
from launcher.supervise.process import (
    EngineCommand,
    EngineSpawnError,
    GroupGuard,
    build_child_env,
    spawn_engine,
)
from launcher.supervise.readiness import HealthCheck, ReadyFile

__all__ = [
    "EngineCommand",
    "EngineSpawnError",
    "GroupGuard",
    "HealthCheck",
    "Phase",
    "QueuedWriter",
    "ReadyFile",
    "State",
    "StopBook",
    "StreamPump",
    "Supervisor",
    "SupervisorOptions",
    "SupervisorOutcome",
    "build_child_env",
    "decide_outcome",
    "exit_code_for",
    "signal_name",
    "spawn_engine",
]
