"""The loop's inbox: signals and requests from hooks and threads, the signal handlers, and the
control methods that post the requests (``Controls``, the thread-safe half of the ``Supervisor``).

Signal handlers only enqueue (the C-level handler already wrote the wake-up pipe via
``signal.set_wakeup_fd``); other threads ``post``, which also writes the pipe, so one
``select()`` wakes for engine output, signals and requests alike.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import FrameType

from launcher.supervise.process import EngineCommand


class EventQueue:
    """Events for the loop: a SimpleQueue plus a self-pipe that wakes ``select()``.

    Signal handlers only ``put_signal`` (the C-level handler already wrote the pipe via
    ``signal.set_wakeup_fd``); other threads ``post``, which also writes the pipe.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.read_fd = self.write_fd = -1

    def open(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def put_signal(self, signum: int) -> None:
        self._queue.put_nowait(signum)

    def signals_queued(self, signums: Iterable[int]) -> AbstractContextManager[None]:
        """While inside, each of ``signums`` is queued as its number and wakes ``select()``;
        after, the previous handlers are back. Only on the main thread, after ``open``."""
        return installed_signal_handlers(signums, self._handle_signal, self.write_fd)

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: enqueue only (NO LOGGING); the C-level handler already woke us."""
        self.put_signal(signum)

    def post(self, event: object) -> None:
        self._queue.put_nowait(event)
        with self._lock:
            if self.write_fd >= 0:
                try:
                    os.write(self.write_fd, b"\0")
                except BlockingIOError:
                    pass  # the pipe is full: a wake-up is pending anyway

    def pop(self) -> object | None:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def drain_pipe(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            for fd in (self.read_fd, self.write_fd):
                if fd >= 0:
                    os.close(fd)
            self.read_fd = self.write_fd = -1


@contextmanager
def installed_signal_handlers(signums: Iterable[int], handler: Callable[[int, FrameType | None], None],
                              wakeup_fd: int) -> Iterator[None]:
    """Install ``handler`` for ``signums`` and ``wakeup_fd`` as the wake-up fd; restore both after."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("Supervisor.run() handles signals and must run on the main thread")
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    old_wakeup = signal.set_wakeup_fd(wakeup_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


@dataclass(frozen=True)
class StopRequest:
    reason: str
    exit_code: int
    kill: bool
    after_s: float = 0.0  # let the engine's last lines pass (and let it exit by itself) first


@dataclass(frozen=True)
class RestartRequest:
    command: EngineCommand
    reason: str


@dataclass(frozen=True)
class MarkReady:
    status: str | None


@dataclass(frozen=True)
class MarkEvent:
    name: str


@dataclass(frozen=True)
class Healthy:
    generation: int




@dataclass(frozen=True)
class HealthResult:
    """One liveness probe after the engine was first healthy."""

    generation: int
    healthy: bool


@dataclass(frozen=True)
class OutputDrained:
    """A writer fell below its low-water mark: read the engine's pipes again."""


class Controls:
    """The supervisor's control methods: each posts one event to the loop's inbox and returns,
    so any thread or hook may call them; the loop's request table acts on the event."""

    def __init__(self) -> None:
        self._events = EventQueue()

    def request_stop(self, reason: str, exit_code: int, *, kill: bool = False, after_s: float = 0.0) -> None:
        """Stop the engine's group (SIGTERM, SIGKILL after the grace; at once if ``kill``) and
        make :meth:`run` return ``exit_code`` whatever the engine does. With ``after_s`` the
        SIGTERM waits that long (the engine's last lines pass, it may exit by itself)."""
        self._events.post(StopRequest(reason, int(exit_code), kill, after_s))

    def request_restart(self, command: EngineCommand, reason: str = "retune") -> None:
        """Stop the engine gracefully, then start ``command`` (ignored once stopping)."""
        self._events.post(RestartRequest(command, reason))

    def mark_ready(self, status: str | None = None) -> None:
        """Declare the engine serving: READY=1 (+ STATUS) to systemd, write the ready file."""
        self._events.post(MarkReady(status))

    def mark_event(self, name: str) -> None:
        """Record that a watched event happened, disarming its watch timeout."""
        self._events.post(MarkEvent(name))
