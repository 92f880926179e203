"""How a supervision ended: the phases, the stop book and the exit-code rules.

* ``request_stop(reason, code)`` wins: ``code``, however the engine ended;
* a stop asked for by SIGTERM, SIGINT, SIGHUP or SIGQUIT: 0 if the engine exited 0 or died of
  the signal we forwarded; 137 when it had to be SIGKILLed (the grace ran out, a second
  SIGINT); 70 when it failed otherwise while stopping;
* the engine ended by itself, unasked: 70 (``EX_SOFTWARE``) whatever its own code or signal: a
  supervised server that stops serving has failed (vLLM exits 0 after ``EngineDeadError``), so
  ``Restart=on-failure`` restarts it, and the engine's code never poses as one of ours (its
  exit 1, 2 or 78 would read as our internal error, bad command line or "will not fit"). The
  engine's own code or signal is in the reason and in ``engine_returncode``.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field

from launcher.common.errors import ExitCode

STOP_SIGNALS_CLEAN = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
KILLED_AFTER_GRACE = 128 + signal.SIGKILL  # the engine had to be SIGKILLed while it was being stopped


class Phase(enum.IntEnum):
    """How far the current engine got; ordered, so ``max()`` gives the furthest."""

    NOT_STARTED = 0
    STARTING = 1  # spawned, loading
    HEALTHY = 2  # the health endpoint answered 200
    READY = 3  # mark_ready() was called: numbers checked, READY=1 sent


class State(enum.Enum):
    """What the supervision loop is doing."""

    NEW = "new"
    RUNNING = "running"
    RESTARTING = "restarting"  # stopping the engine to start the next command
    STOPPING = "stopping"  # stopping the engine to exit
    FINISHED = "finished"


@dataclass(frozen=True)
class SupervisorOutcome:
    """How supervision ended; ``exit_code`` is what safe-serve should exit with."""

    exit_code: int
    engine_returncode: int | None  # Popen style: -N when killed by signal N; None if never started
    signal_name: str | None  # e.g. "SIGSEGV" when the engine died of a signal
    reason: str
    phase: Phase  # furthest phase of the last engine
    restarts: int


@dataclass
class StopBook:
    """Why and how the current engine is being stopped; a fresh one at every start."""

    request: tuple[str, int] | None = None  # (reason, exit code) from request_stop
    signal: int | None = None  # first stop signal received
    forwarded: set[int] = field(default_factory=set)  # SIGTERM/SIGINT/SIGHUP/SIGQUIT we forwarded
    deadline: float | None = None  # monotonic time of the SIGKILL escalation
    escalation: str | None = None  # why we SIGKILLed, if we did
    sigints: int = 0
    term_at: float | None = None  # a delayed request_stop: SIGTERM the group at this time


def exit_code_for(returncode: int) -> int:
    """Map a Popen return code to a shell exit code: N stays N, killed by signal N gives 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``; unknown numbers -> ``"signal 99"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def decide_outcome(returncode: int, phase: Phase, restarts: int, stop: StopBook) -> SupervisorOutcome:
    """Apply the exit-code rules of the module docstring to how the engine ended."""
    sig = signal_name(-returncode) if returncode < 0 else None
    how = f"killed by {sig}" if sig else f"exited with code {returncode}"
    if stop.escalation:
        how += f" ({stop.escalation})"
    if stop.request is not None:
        code, reason = stop.request[1], f"{stop.request[0]}; engine {how}"
    elif stop.signal is not None:
        if returncode == 0 or -returncode in stop.forwarded:
            code = 0
        elif stop.escalation and returncode == -signal.SIGKILL:
            code = KILLED_AFTER_GRACE
        else:
            code = int(ExitCode.SOFTWARE)
        reason = f"stopped on {signal_name(stop.signal)}; engine {how}"
    else:
        code, reason = int(ExitCode.SOFTWARE), f"engine {how} unasked (a server must not stop by itself)"
    return SupervisorOutcome(code, returncode, sig, reason, phase, restarts)
