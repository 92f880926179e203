"""The engine process: its command, its own session and process group, and the group guard.

What the engine gets:

* its own session and process group (we signal the group, so its workers hear us too);
* ``PR_SET_PDEATHSIG=SIGKILL``: if safe-serve is SIGKILLed, the engine dies with it;
* a *group guard*: a tiny helper process that holds a pipe from us and SIGKILLs the engine's
  process group when that pipe closes without a goodbye, i.e. when we died. The death signal
  only reaches the direct child; the guard also reaches the engine's own children (vLLM's
  EngineCore and workers) that stay in its group. Processes that leave the group (``setsid``)
  escape both; the real engines do not do that;
* an environment without ``NOTIFY_SOCKET``/``WATCHDOG_*`` (only we talk to systemd);
* stdin from ``/dev/null``; stdout and stderr to pipes (see ``output``).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import structlog

from launcher.common.errors import ExitCode, SafeServeError
from launcher.supervise.outcome import Phase

log = structlog.get_logger("safe_serve.supervisor")

SYSTEMD_CHILD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
PIPE_SIZE = 1 << 20  # asked for with F_SETPIPE_SZ; 1 MiB is the unprivileged Linux maximum
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
    shown: tuple[str, ...] | None = None  # argv as logged, secrets masked (the adapter's shown_argv); None: argv

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("EngineCommand.argv must not be empty")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))



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


def grow_pipe(fd: int) -> None:
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


class Engine:
    """One spawned engine: its process group, its output pipes, its guard and exit status."""

    def __init__(self, command: EngineCommand, popen: subprocess.Popen[bytes], guard: GroupGuard | None,
                 generation: int) -> None:
        self.command = command
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # leader of its own session
        self.guard = guard
        self.generation = generation
        self.pipes: dict[int, tuple[Any, Any]] = {}  # read fd -> (pump, Popen file object)
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

    def stop_now(self, grace_s: float) -> None:
        """Without the loop (after an unexpected exception): SIGTERM the group, SIGKILL after
        ``grace_s``, reap the leader, kill what is left of the group."""
        if self.returncode is not None:
            return
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.returncode is None:
            late = time.monotonic() >= deadline
            if late:
                self.signal_group(signal.SIGKILL)
            try:
                pid, status = os.waitpid(self.pid, 0 if late else os.WNOHANG)
            except ChildProcessError:
                return  # reaped elsewhere; nothing left to wait for
            if pid:
                self.record_exit(status)
            else:
                time.sleep(0.05)
        self.kill_stragglers()

    def record_exit(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.returncode  # we reaped it; Popen must not wait again


def start_engine(command: EngineCommand, generation: int, *, group_guard: bool) -> Engine:
    """Spawn ``command`` as engine number ``generation``, with its group guard if asked (a guard
    that cannot start is said and done without).

    Raises:
        EngineSpawnError: as ``spawn_engine``.
    """
    popen = spawn_engine(command)
    guard = None
    if group_guard:
        try:
            guard = GroupGuard(popen.pid)
        except OSError as exc:
            log.warning("no group guard: engine children may outlive a SIGKILLed safe-serve", error=str(exc))
    return Engine(command, popen, guard, generation)


def reap(engine: Engine, *, every_child: bool) -> None:
    """Collect exit statuses without blocking: the engine's, and with ``every_child`` (we are
    PID 1) every orphan's too."""
    while every_child or engine.returncode is None:
        try:
            pid, status = os.waitpid(-1 if every_child else engine.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == engine.pid:
            engine.record_exit(status)
            log.info("engine exited", pid=pid, returncode=engine.returncode)
        else:
            log.debug("reaped an orphaned process", pid=pid)
