"""Stop signals before (and after) the supervisor runs: never a death by default action.

``safe-serve`` waits for start locks, probes and plans before the engine starts; systemd,
Docker or a user may stop it then. From the first line of ``main`` the stop signals (SIGTERM,
SIGHUP, SIGQUIT) raise ``StopSignal`` in the main thread, which ``cli.main`` turns into one line
and the documented code (0 for ``serve``: a stop asked for is clean whatever the phase; 128+N for
the other commands). SIGUSR1, SIGUSR2 and SIGALRM mean nothing to safe-serve: they are noted
and ignored (their default action would kill us silently, leaving the ready file behind).

While the supervisor runs it installs its own handlers; once it has started an engine, a stop
signal that reaches these handlers (after the supervisor restored them) is only noted: the
supervision's outcome already decides the exit code. Python handlers are reset to the default
action on ``exec``, so the engine keeps the default dispositions.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
NOT_STOPS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


class StopSignal(BaseException):  # noqa: N818  # like KeyboardInterrupt: not an error, a request
    """A stop signal arrived before the engine was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


_state = {"supervised": False, "serving": False}
noted: list[int] = []  # NOT_STOPS (and late stops) received outside the supervisor, for the log


def _on_stop(signum: int, frame: FrameType | None) -> None:
    if _state["supervised"]:
        noted.append(signum)
        return
    raise StopSignal(signum)


def _on_not_stop(signum: int, frame: FrameType | None) -> None:
    noted.append(signum)


def install(*, serving: bool) -> None:
    """Handle the stop signals and ignore the others from now on (main thread only)."""
    _state["serving"] = serving
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop)
    for signum in NOT_STOPS:
        signal.signal(signum, _on_not_stop)


def supervised() -> None:
    """The supervisor is starting the engine: from now on its outcome decides the exit code."""
    _state["supervised"] = True


def exit_code(stop: StopSignal) -> int:
    """0 when ``serve`` was stopped before the engine started (operators.md, exit codes); 128+N otherwise."""
    return 0 if _state["serving"] else 128 + stop.signum


def take_noted() -> list[str]:
    """The names of the signals noted so far (and forget them)."""
    names = [signal.Signals(signum).name for signum in noted]
    noted.clear()
    return names
