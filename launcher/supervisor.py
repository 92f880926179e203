"""Run one engine process, pass its output through unchanged, and stop it cleanly.

The shape is gunicorn's arbiter, cut down to one child: signal handlers only enqueue, one loop
waits on the engine's pipes and a wake-up fd, dispatches queued events through explicit
tables, then runs reconcile steps every tick (reap, deadlines, systemd keep-alives).

What the engine gets:

* its own session and process group (we signal the group, so its workers hear us too);
* ``PR_SET_PDEATHSIG=SIGKILL``: if safe-serve is SIGKILLed, the engine dies with it;
* a *group guard*: a tiny helper process that holds a pipe from us and SIGKILLs the engine's
  process group when that pipe closes without a goodbye, i.e. when we died. The death signal
  only reaches the direct child; the guard also reaches the engine's own children (vLLM's
  EngineCore and workers) that stay in its group. Processes that leave the group (``setsid``)
  escape both; the real engines do not do that;
* an environment without ``NOTIFY_SOCKET``/``WATCHDOG_*`` (only we talk to systemd);
* stdin from ``/dev/null``; stdout and stderr to pipes that we copy byte for byte to our own
  stdout and stderr and also split into lines for the ``on_line`` hook.

Exit-code rules (see :class:`SupervisorOutcome`):

* ``request_stop(reason, code)`` wins: ``code``, however the engine ended;
* stop asked for by SIGTERM, SIGINT or SIGHUP: 0 if the engine exited 0 or died of the
  signal we forwarded; otherwise as below (e.g. 137 when it had to be SIGKILLed);
* otherwise the engine's own exit status, or 128+N when it died of signal N.
"""

from __future__ import annotations

import ctypes
import enum
import fcntl
import http.client
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any

import structlog

from launcher import sdnotify
from launcher.errors import ExitCode, SafeServeError

__all__ = [
    "EngineCommand",
    "EngineSpawnError",
    "GroupGuard",
    "HealthCheck",
    "Phase",
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

log = structlog.get_logger("safe_serve.supervisor")

LineHook = Callable[[str, bytes], None]

SYSTEMD_CHILD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
READ_CHUNK = 1 << 20  # bytes per os.read
PIPE_SIZE = 1 << 20  # asked for with F_SETPIPE_SZ; 1 MiB is the unprivileged Linux maximum
MAX_LINE_BYTES = 16 << 20  # longer lines reach on_line truncated (pass-through is never cut)
PARTIAL_FLUSH_BYTES = 64 << 10  # an unterminated line this long is written through at once
PARTIAL_FLUSH_AFTER_S = 0.2  # ... or after this long (tqdm bars end in \r, not \n)
DRAIN_AFTER_EXIT_S = 2.0  # how long to read pipes that outlive the engine's group
TICK_S = 1.0  # reconcile steps run at least this often
EXTEND_EVERY_S = 10.0  # while loading, tell systemd every 10 s ...
EXTEND_BY_S = 30.0  # ... to wait 30 s more (a lost datagram still leaves 20 s of slack)
STOP_SIGNALS_CLEAN = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_PR_SET_PDEATHSIG = 1


class EngineSpawnError(SafeServeError):
    """The engine executable could not be started (not installed, not executable)."""

    exit_code = ExitCode.UNAVAILABLE


@dataclass(frozen=True)
class EngineCommand:
    """One engine invocation: argv (no shell), the complete child environment, a cwd."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("EngineCommand.argv must not be empty")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True)
class HealthCheck:
    """Where and how often to poll the engine's readiness endpoint."""

    host: str
    port: int
    path: str = "/health"
    interval_s: float = 1.0
    timeout_s: float = 2.0

    @property
    def url(self) -> str:
        """The URL polled; wildcard binds are polled on loopback."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}{self.path}"


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


def build_child_env(base: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """Return ``base`` with ``overrides`` applied (None deletes) and systemd's variables removed.

    ``NOTIFY_SOCKET`` and ``WATCHDOG_*`` are for the main process only; ``LISTEN_*`` describe
    socket-activation fds the engine does not inherit.
    """
    env = dict(base)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    for key in SYSTEMD_CHILD_VARS:
        env.pop(key, None)
    return env


def exit_code_for(returncode: int) -> int:
    """Map a Popen return code to a shell exit code: N stays N, killed by signal N gives 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``; unknown numbers -> ``"signal 99"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --------------------------------------------------------------------------- output pumps


class StreamPump:
    """Copies one pipe to one fd byte for byte and hands every line to a hook.

    Complete lines are written through as soon as they are read; an unterminated tail is held
    back (so our own messages do not land inside an engine line) until its newline comes, it
    grows past ``PARTIAL_FLUSH_BYTES``, it is ``PARTIAL_FLUSH_AFTER_S`` old, or EOF.
    The hook gets each line without its ``\\n`` (a ``\\r`` stays); a last line without newline
    is handed over at EOF; lines over ``max_line_bytes`` reach the hook truncated.
    With ``needles`` the hook gets only the lines containing one of them, and chunks without
    any are never split into lines (C-speed ``bytes.find`` instead of a Python call per line).
    A failing destination (closed stdout) is dropped and the pipe is still drained.
    """

    __slots__ = (
        "carry",
        "max_line_bytes",
        "name",
        "needles",
        "on_line",
        "out_broken",
        "out_fd",
        "pending",
        "pending_since",
    )

    def __init__(
        self,
        name: str,
        out_fd: int,
        on_line: LineHook | None,
        max_line_bytes: int = MAX_LINE_BYTES,
        needles: tuple[bytes, ...] | None = None,
    ) -> None:
        self.name = name
        self.out_fd = out_fd
        self.on_line = on_line
        self.max_line_bytes = max_line_bytes
        self.needles = needles
        self.pending = bytearray()  # read, not yet written through
        self.pending_since: float | None = None
        self.carry = bytearray()  # start of the current line, for the hook
        self.out_broken = False

    def feed(self, chunk: bytes) -> None:
        """Forward one chunk read from the pipe and call the hook for each completed line."""
        end = chunk.rfind(b"\n") + 1
        if end:
            if self.pending:
                self._write(self.pending, memoryview(chunk)[:end])
                self.pending.clear()
            else:
                self._write(memoryview(chunk)[:end])
            self.pending += memoryview(chunk)[end:]
        else:
            self.pending += chunk
        if len(self.pending) >= PARTIAL_FLUSH_BYTES:
            self.flush_partial()
        elif self.pending:
            if self.pending_since is None:
                self.pending_since = time.monotonic()
        else:
            self.pending_since = None
        if self.on_line is None:
            return
        if self.needles is None:
            self._split(chunk)
        else:
            self._split_filtered(chunk, self.on_line, self.needles)

    def flush_partial(self) -> None:
        """Write the held-back unterminated tail through now."""
        if self.pending:
            self._write(self.pending)
            self.pending.clear()
        self.pending_since = None

    def close(self) -> None:
        """At EOF: write everything through and hand an unterminated last line to the hook."""
        self.flush_partial()
        if self.carry and self.on_line is not None:
            line = bytes(self.carry)
            self.carry.clear()
            if self.needles is None or _has_needle(line, self.needles):
                self.on_line(self.name, line)

    def _split(self, chunk: bytes) -> None:
        parts = chunk.split(b"\n")
        tail = parts.pop()
        if parts:
            if self.carry:
                self._extend_carry(parts[0])
                parts[0] = bytes(self.carry)
                self.carry.clear()
            on_line, name, cap = self.on_line, self.name, self.max_line_bytes
            assert on_line is not None
            if len(chunk) > cap:  # rare: a line in this chunk may need truncating
                parts = [line[:cap] for line in parts]
            for line in parts:  # the hot loop: keep it bare
                on_line(name, line)
        self._extend_carry(tail)

    def _split_filtered(self, chunk: bytes, on_line: LineHook, needles: tuple[bytes, ...]) -> None:
        first_nl = chunk.find(b"\n")
        if first_nl < 0:
            self._extend_carry(chunk)
            return
        self._extend_carry(chunk[:first_nl])  # the first line may straddle the previous chunk
        first = bytes(self.carry)
        self.carry.clear()
        if _has_needle(first, needles):
            on_line(self.name, first)
        last_nl = chunk.rfind(b"\n")
        if last_nl > first_nl and any(chunk.find(n, first_nl + 1, last_nl) >= 0 for n in needles):
            cap = self.max_line_bytes
            for line in chunk[first_nl + 1 : last_nl].split(b"\n"):
                if _has_needle(line, needles):
                    on_line(self.name, line[:cap])
        self._extend_carry(chunk[last_nl + 1 :])

    def _extend_carry(self, piece: bytes) -> None:
        room = self.max_line_bytes - len(self.carry)
        if room > 0:
            self.carry += piece[:room]

    def _write(self, *buffers: bytes | bytearray | memoryview) -> None:
        if self.out_broken:
            return
        try:
            _writev_all(self.out_fd, list(buffers))
        except OSError as exc:
            self.out_broken = True
            log.warning("engine output dropped: cannot write to our own stream", stream=self.name, error=str(exc))


def _has_needle(line: bytes, needles: tuple[bytes, ...]) -> bool:
    return any(needle in line for needle in needles)


def _writev_all(fd: int, buffers: list[bytes | bytearray | memoryview]) -> None:
    """Write all buffers in order, retrying short writes and waiting out a non-blocking fd."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        try:
            written = os.writev(fd, views)
        except BlockingIOError:  # our stdout was left non-blocking by whoever opened it
            _wait_writable(fd)
            continue
        while written and views:
            if written >= len(views[0]):
                written -= len(views.pop(0))
            else:
                views[0] = views[0][written:]
                written = 0


def _wait_writable(fd: int) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_WRITE)
        sel.select(1.0)


# --------------------------------------------------------------------------- engine process


def _load_prctl() -> Callable[..., int] | None:
    """Resolve libc's prctl once, in the parent, so the forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def _death_signal_preexec(parent_pid: int) -> Callable[[], None]:
    """Return the ``preexec_fn`` that makes the child die with us (Linux; a no-op elsewhere).

    The death signal fires when the *thread* that forked exits, so the engine must be spawned
    from the thread that stays in ``run()``. If we died between fork and prctl, getppid has
    already changed and the child kills itself.
    """
    prctl, sigkill = _PRCTL, int(signal.SIGKILL)

    def preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigkill)

    return preexec


def spawn_engine(command: EngineCommand) -> subprocess.Popen[bytes]:
    """Start the engine without a shell, in a new session (its own process group), piped.

    Raises:
        EngineSpawnError: the executable or the cwd is missing or not executable.
    """
    try:
        return subprocess.Popen(  # argv comes from our own engine adapter, no shell
            command.argv,
            env=build_child_env(command.env, {}),
            cwd=command.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_death_signal_preexec(os.getpid()),  # noqa: PLW1509  # no other way to set PDEATHSIG
        )
    except OSError as exc:
        raise EngineSpawnError(
            f"cannot start the engine {command.argv[0]!r}: {exc.strerror or exc}",
            hint="is the engine installed in this environment?",
        ) from exc


def _grow_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer: fewer wake-ups under floods (best effort)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass


_GUARD_SOURCE = """\
import os, signal, sys
if not os.read(0, 1):  # EOF without the goodbye byte: safe-serve is gone
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except OSError:
        pass
"""


class GroupGuard:
    """A helper process that SIGKILLs the engine's process group if we die without a goodbye.

    It sits in its own session (terminal Ctrl-C does not reach it) blocked on a pipe whose
    only writer is us; ``disarm()`` sends the goodbye byte. Costs one small idle process.
    """

    def __init__(self, pgid: int) -> None:
        read_fd, self._write_fd = os.pipe()  # both close-on-exec; the guard gets read_fd as stdin
        try:
            self._proc = subprocess.Popen(  # our own interpreter and source
                [sys.executable, "-I", "-S", "-c", _GUARD_SOURCE, str(pgid)],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(self._write_fd)
            raise
        finally:
            os.close(read_fd)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def disarm(self) -> None:
        """Say goodbye and reap the guard; idempotent."""
        if self._write_fd < 0:
            return
        try:
            os.write(self._write_fd, b"x")
        except OSError:
            pass  # the guard is already gone (e.g. systemd's SIGTERM to the whole cgroup)
        os.close(self._write_fd)
        self._write_fd = -1
        try:
            self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class _Engine:
    """One spawned engine: its process group, its output pipes, its guard and exit status."""

    def __init__(self, command: EngineCommand, popen: subprocess.Popen[bytes], guard: GroupGuard | None, generation: int) -> None:
        self.command = command
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # leader of its own session
        self.guard = guard
        self.generation = generation
        self.pipes: dict[int, tuple[StreamPump, Any]] = {}  # read fd -> (pump, Popen file object)
        self.phase = Phase.STARTING
        self.returncode: int | None = None

    def signal_group(self, signum: int) -> bool:
        """Signal every process of the group; only before the leader is reaped (pgid still ours)."""
        if self.returncode is not None:
            return False
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        return True

    def kill_stragglers(self) -> bool:
        """SIGKILL what is left of the group once the leader has been reaped; True if any."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def record_exit(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.returncode  # we reaped it; Popen must not wait again


class _HealthPoller:
    """Polls the health URL from a thread until it answers 200, then reports once."""

    def __init__(self, check: HealthCheck, on_healthy: Callable[[], None]) -> None:
        self._check = check
        self._on_healthy = on_healthy
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="safe-serve-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        url, timeout = self._check.url, self._check.timeout_s
        while not self._stopped.wait(self._check.interval_s):
            try:
                with opener.open(url, timeout=timeout) as response:
                    healthy = response.status == 200
            except (OSError, http.client.HTTPException, ValueError):
                continue  # refused while loading, 503 while starting, timeouts: keep polling
            if healthy and not self._stopped.is_set():
                self._on_healthy()
                return


# --------------------------------------------------------------------------- loop plumbing


class ReadyFile:
    """The ``--ready-file``: exists (holding the engine pid) exactly while the engine is ready."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(f"{pid}\n")
            os.replace(tmp, self.path)  # a probe never sees a half-written file
        except OSError as exc:
            log.warning("cannot write the ready file", path=str(self.path), error=str(exc))

    def remove(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the ready file", path=str(self.path), error=str(exc))


class _EventQueue:
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
def installed_signal_handlers(signums: Iterable[int], handler: Callable[[int, FrameType | None], None], wakeup_fd: int) -> Iterator[None]:
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
class _StopRequest:
    reason: str
    exit_code: int
    kill: bool


@dataclass(frozen=True)
class _RestartRequest:
    command: EngineCommand
    reason: str


@dataclass(frozen=True)
class _MarkReady:
    status: str | None


@dataclass(frozen=True)
class _MarkEvent:
    name: str


@dataclass(frozen=True)
class _Healthy:
    generation: int


@dataclass
class StopBook:
    """Why and how the current engine is being stopped; a fresh one at every start."""

    request: tuple[str, int] | None = None  # (reason, exit code) from request_stop
    signal: int | None = None  # first stop signal received
    forwarded: set[int] = field(default_factory=set)  # SIGTERM/SIGINT/SIGHUP we forwarded
    deadline: float | None = None  # monotonic time of the SIGKILL escalation
    escalation: str | None = None  # why we SIGKILLed, if we did
    sigints: int = 0


def decide_outcome(returncode: int, phase: Phase, restarts: int, stop: StopBook) -> SupervisorOutcome:
    """Apply the exit-code rules of the module docstring to how the engine ended."""
    sig = signal_name(-returncode) if returncode < 0 else None
    how = f"killed by {sig}" if sig else f"exited with code {returncode}"
    if stop.escalation:
        how += f" ({stop.escalation})"
    if stop.request is not None:
        code, reason = stop.request[1], f"{stop.request[0]}; engine {how}"
    elif stop.signal is not None:
        clean = returncode == 0 or -returncode in stop.forwarded
        code = 0 if clean else exit_code_for(returncode)
        reason = f"stopped on {signal_name(stop.signal)}; engine {how}"
    else:
        code, reason = exit_code_for(returncode), f"engine {how}"
    return SupervisorOutcome(code, returncode, sig, reason, phase, restarts)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- supervisor


@dataclass(frozen=True)
class SupervisorOptions:
    """Tunables of one supervision; the defaults suit systemd and containers."""

    grace_seconds: float = 30.0  # SIGTERM -> SIGKILL (Kubernetes' default grace is 30 s too)
    health: HealthCheck | None = None  # poll it from each start; 200 -> on_ready
    ready_file: Path | None = None  # written at mark_ready(), removed when not ready or at exit
    watches: Mapping[str, float] = field(default_factory=dict)  # event name -> seconds from start
    notify_env: Mapping[str, str] | None = None  # where NOTIFY_SOCKET is read; None: os.environ
    stdout_fd: int = 1
    stderr_fd: int = 2
    group_guard: bool = True
    reap_orphans: bool | None = None  # waitpid(-1) for every child; None: only when we are PID 1
    handle_signals: bool = True  # needs run() on the main thread
    extend_every_s: float = EXTEND_EVERY_S
    extend_by_s: float = EXTEND_BY_S
    max_line_bytes: int = MAX_LINE_BYTES
    line_filter: tuple[bytes, ...] | None = None  # on_line gets only lines holding one of these


class Supervisor:
    """Starts an engine, passes its output through, stops it on signals, requests or deadlines.

    Hooks run on the thread that called :meth:`run` (the main thread when signals are
    handled), one at a time, so they need no locks:

    * ``on_line(stream, line)``: every line of ``"stdout"``/``"stderr"``, as bytes without
      the ``\\n``. Hot path: keep a cheap substring prefilter before any regex or decode, or
      set ``SupervisorOptions.line_filter`` to the substrings the parser needs, so that
      only lines holding one reach the hook (floods then cost no Python call per line).
    * ``on_ready()``: the health endpoint answered 200. Without this hook that alone marks
      the engine ready; with it, the hook decides and calls :meth:`mark_ready`.
    * ``on_watch_timeout(name)``: a watch from ``SupervisorOptions.watches`` was not marked
      in time (:meth:`mark_event`).
    * ``on_exit(returncode)``: the engine exited on its own (not stopped by us), after its
      last line was read; may call :meth:`request_restart`.

    The control methods (:meth:`request_stop`, :meth:`request_restart`, :meth:`mark_ready`,
    :meth:`mark_event`) only enqueue; they may be called from any thread or hook.
    An exception escaping a hook is a bug: the engine is stopped and the exception re-raised.
    """

    def __init__(
        self,
        command: EngineCommand,
        options: SupervisorOptions | None = None,
        *,
        on_line: LineHook | None = None,
        on_ready: Callable[[], None] | None = None,
        on_watch_timeout: Callable[[str], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self._command = command
        self._opts = options or SupervisorOptions()
        self._on_line = on_line
        self._on_ready = on_ready
        self._on_watch_timeout = on_watch_timeout
        self._on_exit = on_exit
        self._state = State.NEW
        self._engine: _Engine | None = None
        self._generation = 0
        self._restarts = 0
        self._reap_all = os.getpid() == 1 if self._opts.reap_orphans is None else self._opts.reap_orphans
        self._events = _EventQueue()
        self._selector = selectors.DefaultSelector()
        self._ready_file = ReadyFile(self._opts.ready_file)
        self._health: _HealthPoller | None = None
        self._stop = StopBook()
        self._pending_restart: EngineCommand | None = None
        self._drain_deadline: float | None = None
        self._watch_deadlines: dict[str, float] = {}
        self._next_extend: float | None = None
        self._stopping_sent = False
        self._outcome: SupervisorOutcome | None = None
        self._signal_table: dict[int, Callable[[int], None]] = {
            signal.SIGTERM: self._on_stop_signal,
            signal.SIGHUP: self._on_stop_signal,
            signal.SIGQUIT: self._on_stop_signal,
            signal.SIGINT: self._on_sigint,
            signal.SIGCHLD: self._on_sigchld,
        }
        self._request_table: dict[type, Callable[[Any], None]] = {
            _StopRequest: self._on_stop_request,
            _RestartRequest: self._on_restart_request,
            _MarkReady: self._on_mark_ready,
            _MarkEvent: self._on_mark_event,
            _Healthy: self._on_healthy,
        }

    # ------------------------------------------------------------------ public API

    @property
    def generation(self) -> int:
        """How many engines this supervisor has started (the current one's number)."""
        return self._generation

    @property
    def state(self) -> State:
        return self._state

    @property
    def phase(self) -> Phase:
        return self._engine.phase if self._engine else Phase.NOT_STARTED

    @property
    def engine_pid(self) -> int | None:
        return self._engine.pid if self._engine else None

    def request_stop(self, reason: str, exit_code: int, *, kill: bool = False) -> None:
        """Stop the engine's group (SIGTERM, SIGKILL after the grace; at once if ``kill``) and
        make :meth:`run` return ``exit_code`` whatever the engine does."""
        self._events.post(_StopRequest(reason, int(exit_code), kill))

    def request_restart(self, command: EngineCommand, reason: str = "retune") -> None:
        """Stop the engine gracefully, then start ``command`` (ignored once stopping)."""
        self._events.post(_RestartRequest(command, reason))

    def mark_ready(self, status: str | None = None) -> None:
        """Declare the engine serving: READY=1 (+ STATUS) to systemd, write the ready file."""
        self._events.post(_MarkReady(status))

    def mark_event(self, name: str) -> None:
        """Record that a watched event happened, disarming its watch timeout."""
        self._events.post(_MarkEvent(name))

    def status(self, text: str) -> None:
        """Show ``text`` in ``systemctl status`` (STATUS=); thread-safe, never raises."""
        self._notify(f"STATUS={_one_line(text)}")

    def run(self) -> SupervisorOutcome:
        """Start the engine and supervise it (and its restarts) until it is gone.

        Raises:
            EngineSpawnError: the engine could not be started.
        """
        if self._state is not State.NEW:
            raise RuntimeError("Supervisor.run() may be called only once")
        self._ready_file.remove()  # a stale file from a crashed run must not pass a probe
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # our own buffered text goes out before the engine's bytes
        self._events.open()
        self._selector.register(self._events.read_fd, selectors.EVENT_READ, None)
        try:
            with self._signals():
                self._state = State.RUNNING
                self._spawn(self._command)
                while self._state is not State.FINISHED:
                    self._pump_io(self._next_timeout(time.monotonic()))
                    self._drain_events()
                    self._reconcile(time.monotonic())
        except BaseException:
            self._abandon()
            raise
        finally:
            self._close()
        assert self._outcome is not None
        return self._outcome

    # ------------------------------------------------------------------ loop steps

    def _pump_io(self, timeout: float) -> None:
        for key, _mask in self._selector.select(timeout):
            if key.data is None:
                self._events.drain_pipe()
                continue
            try:
                chunk = os.read(key.fd, READ_CHUNK)
            except OSError:
                chunk = b""
            if chunk:
                key.data.feed(chunk)
            else:
                self._close_pipe(key.fd)

    def _drain_events(self) -> None:
        while (event := self._events.pop()) is not None:
            if isinstance(event, int):
                self._signal_table[event](event)
            else:
                self._request_table[type(event)](event)

    def _reconcile(self, now: float) -> None:
        """Every tick: reap, flush stale partial lines, deadlines, keep-alives, end of engine."""
        self._reap()
        engine = self._current()
        for pump, _file in engine.pipes.values():
            if pump.pending_since is not None and now - pump.pending_since >= PARTIAL_FLUSH_AFTER_S:
                pump.flush_partial()
        if engine.returncode is None:
            if self._stop.deadline is not None and now >= self._stop.deadline:
                self._escalate(f"the engine did not stop within the {self._opts.grace_seconds:g} s grace period")
            self._check_watches(now)
            if self._next_extend is not None and now >= self._next_extend and self._state is not State.STOPPING:
                self._notify(f"EXTEND_TIMEOUT_USEC={int(self._opts.extend_by_s * 1e6)}")
                self._next_extend = now + self._opts.extend_every_s
            return
        if self._drain_deadline is None:  # just reaped: clear the group, then read what is left
            if engine.kill_stragglers():
                log.warning("killed processes left in the engine's process group", pgid=engine.pgid)
            self._drain_deadline = now + DRAIN_AFTER_EXIT_S
        if engine.pipes and now < self._drain_deadline:
            return
        if engine.pipes:
            log.warning("engine output pipes still open after its exit; closing them", pgid=engine.pgid)
        self._finish_engine(engine)

    def _next_timeout(self, now: float) -> float:
        deadlines = [now + TICK_S, *self._watch_deadlines.values()]
        for candidate in (self._stop.deadline, self._drain_deadline, self._next_extend):
            if candidate is not None:
                deadlines.append(candidate)
        for pump, _file in self._current().pipes.values():
            if pump.pending_since is not None:
                deadlines.append(pump.pending_since + PARTIAL_FLUSH_AFTER_S)
        return max(0.0, min(deadlines) - now)

    def _reap(self) -> None:
        """Collect exit statuses: the engine's, and every orphan's when we are PID 1."""
        engine = self._current()
        while self._reap_all or engine.returncode is None:
            try:
                pid, status = os.waitpid(-1 if self._reap_all else engine.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == engine.pid:
                engine.record_exit(status)
                log.info("engine exited", pid=pid, returncode=engine.returncode)
            else:
                log.debug("reaped an orphaned process", pid=pid)

    def _check_watches(self, now: float) -> None:
        if self._state is not State.RUNNING:
            return
        for name, deadline in list(self._watch_deadlines.items()):
            if now >= deadline:
                del self._watch_deadlines[name]
                log.warning("watched event did not happen in time", watch=name)
                if self._on_watch_timeout is not None:
                    self._on_watch_timeout(name)

    # ------------------------------------------------------------------ dispatch targets

    def _on_stop_signal(self, signum: int) -> None:
        """SIGTERM, SIGHUP, SIGQUIT, a first SIGINT: forward to the engine's group and stop."""
        if self._state is State.FINISHED:
            return
        log.info("forwarding signal to the engine's process group", signal=signal_name(signum), pgid=self.engine_pid)
        if self._stop.signal is None:
            self._stop.signal = signum
        self._begin_stop(signum, State.STOPPING)

    def _on_sigint(self, signum: int) -> None:
        """A second SIGINT (impatient Ctrl-C) kills the engine's group at once."""
        self._stop.sigints += 1
        if self._stop.sigints >= 2 and self._state is State.STOPPING:
            self._escalate("second SIGINT")
        else:
            self._on_stop_signal(signum)

    def _on_sigchld(self, signum: int) -> None:
        self._reap()

    def _on_stop_request(self, request: _StopRequest) -> None:
        if self._state is State.FINISHED:
            return
        log.warning("stopping the engine", reason=request.reason, exit_code=request.exit_code)
        if self._stop.request is None:
            self._stop.request = (request.reason, request.exit_code)
        self._begin_stop(signal.SIGTERM, State.STOPPING)
        if request.kill:
            self._escalate(request.reason)

    def _on_restart_request(self, request: _RestartRequest) -> None:
        if self._state not in (State.RUNNING, State.RESTARTING):
            log.info("restart ignored: already stopping", reason=request.reason)
            return
        self._pending_restart = request.command
        if self._state is State.RUNNING:
            log.info("restarting the engine", reason=request.reason)
            self._ready_file.remove()
            self._begin_stop(signal.SIGTERM, State.RESTARTING)

    def _on_mark_ready(self, request: _MarkReady) -> None:
        engine = self._current()
        if self._state is not State.RUNNING or engine.returncode is not None or engine.phase is Phase.READY:
            return
        engine.phase = Phase.READY
        self._next_extend = None
        self._ready_file.write(engine.pid)
        self._notify(f"READY=1\nSTATUS={_one_line(request.status or f'engine ready (pid {engine.pid})')}")
        log.info("engine ready", pid=engine.pid)

    def _on_mark_event(self, request: _MarkEvent) -> None:
        self._watch_deadlines.pop(request.name, None)

    def _on_healthy(self, event: _Healthy) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        engine.phase = max(engine.phase, Phase.HEALTHY)
        if self._on_ready is not None:
            self._on_ready()
        else:
            self.mark_ready()

    # ------------------------------------------------------------------ stopping

    def _begin_stop(self, signum: int, state: State) -> None:
        if state is State.STOPPING:
            self._pending_restart = None  # stopping wins over a restart in progress
        self._state = state
        if self._stop.deadline is None:
            self._stop.deadline = time.monotonic() + self._opts.grace_seconds
        if signum in STOP_SIGNALS_CLEAN:
            self._stop.forwarded.add(signum)
        self._current().signal_group(signum)
        if state is State.STOPPING and not self._stopping_sent:
            self._stopping_sent = True
            extend_us = int((self._opts.grace_seconds + DRAIN_AFTER_EXIT_S + 5.0) * 1e6)
            self._notify(f"STOPPING=1\nSTATUS=stopping the engine\nEXTEND_TIMEOUT_USEC={extend_us}")
        elif state is State.RESTARTING:
            self.status("restarting the engine")

    def _escalate(self, reason: str) -> None:
        engine = self._current()
        if self._stop.escalation is None and engine.returncode is None:
            self._stop.escalation = reason
            log.error("killing the engine's process group", reason=reason, pgid=engine.pgid)
            engine.signal_group(signal.SIGKILL)

    def _finish_engine(self, engine: _Engine) -> None:
        """The engine is reaped and drained: restart it or decide the outcome."""
        for fd in list(engine.pipes):
            self._close_pipe(fd)
        self._stop_health()
        if engine.guard is not None:
            engine.guard.disarm()
        self._ready_file.remove()
        assert engine.returncode is not None
        if self._state is State.RUNNING and self._on_exit is not None:
            self._on_exit(engine.returncode)
        self._drain_events()  # requests made by the last lines or by on_exit
        if self._state is State.RESTARTING and self._pending_restart is not None:
            command, self._pending_restart = self._pending_restart, None
            self._restarts += 1
            self._state = State.RUNNING
            self._spawn(command)
            return
        self._outcome = decide_outcome(engine.returncode, engine.phase, self._restarts, self._stop)
        self._state = State.FINISHED

    def _abandon(self) -> None:
        """After an unexpected exception: stop the group without the loop, briefly."""
        engine = self._engine
        if engine is None or engine.returncode is not None:
            return
        engine.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + min(self._opts.grace_seconds, 5.0)
        while engine.returncode is None:
            late = time.monotonic() >= deadline
            if late:
                engine.signal_group(signal.SIGKILL)
            try:
                pid, status = os.waitpid(engine.pid, 0 if late else os.WNOHANG)
            except ChildProcessError:
                return  # reaped elsewhere; nothing left to wait for
            if pid:
                engine.record_exit(status)
            else:
                time.sleep(0.05)
        engine.kill_stragglers()

    # ------------------------------------------------------------------ plumbing

    def _current(self) -> _Engine:
        assert self._engine is not None, "no engine started yet"
        return self._engine

    def _spawn(self, command: EngineCommand) -> None:
        popen = spawn_engine(command)
        self._generation += 1
        guard = None
        if self._opts.group_guard:
            try:
                guard = GroupGuard(popen.pid)
            except OSError as exc:
                log.warning("no group guard: engine children may outlive a SIGKILLed safe-serve", error=str(exc))
        engine = _Engine(command, popen, guard, self._generation)
        for name, fileobj, out_fd in (("stdout", popen.stdout, self._opts.stdout_fd), ("stderr", popen.stderr, self._opts.stderr_fd)):
            assert fileobj is not None
            pump = StreamPump(name, out_fd, self._on_line, self._opts.max_line_bytes, self._opts.line_filter)
            _grow_pipe(fileobj.fileno())
            engine.pipes[fileobj.fileno()] = (pump, fileobj)
            self._selector.register(fileobj.fileno(), selectors.EVENT_READ, pump)
        self._engine = engine
        now = time.monotonic()
        self._stop = StopBook()
        self._drain_deadline = None
        self._watch_deadlines = {name: now + seconds for name, seconds in self._opts.watches.items()}
        self._next_extend = now
        if self._opts.health is not None:
            generation = self._generation
            self._health = _HealthPoller(self._opts.health, lambda: self._events.post(_Healthy(generation)))
            self._health.start()
        log.info("engine started", pid=popen.pid, argv=list(command.argv), restarts=self._restarts)
        self.status(f"engine starting (pid {popen.pid})")

    def _close_pipe(self, fd: int, *, hook: bool = True) -> None:
        pump, fileobj = self._current().pipes.pop(fd)
        self._selector.unregister(fd)
        fileobj.close()
        if not hook:
            pump.on_line = None
        pump.close()

    def _stop_health(self) -> None:
        if self._health is not None:
            self._health.stop()
            self._health = None

    def _notify(self, state: str) -> None:
        sdnotify.notify(state, self._opts.notify_env)

    def _signals(self) -> AbstractContextManager[None]:
        if not self._opts.handle_signals:
            return nullcontext()
        return installed_signal_handlers(self._signal_table, self._handle_signal, self._events.write_fd)

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: enqueue only (NO LOGGING); the C-level handler already woke us."""
        self._events.put_signal(signum)

    def _close(self) -> None:
        self._stop_health()
        if self._engine is not None:
            for fd in list(self._engine.pipes):  # only after an exception: no more hook calls
                self._close_pipe(fd, hook=False)
            if self._engine.guard is not None:
                self._engine.guard.disarm()
        self._ready_file.remove()
        if not self._stopping_sent:
            self._stopping_sent = True
            self._notify("STOPPING=1")
        self._selector.close()
        self._events.close()
