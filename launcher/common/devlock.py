"""Per-GPU start locks (and one for the host's memory), so two launches never measure free
memory against each other.

A launch takes the lock of every GPU it will use before it reads free memory and keeps it
until the engine has allocated its KV cache; only then can the next launch's measurement be
trusted. One file per GPU UUID under the lock directory, locked with ``flock`` (released by
the kernel when the holder dies, so no stale locks). The holder writes its pid into the file
so that a waiter can say who holds it.

Lock directory: ``$SAFE_SERVE_LOCK_DIR``, else ``/run/lock/safe-serve``, else
``/tmp/safe-serve-locks``. Created world-writable with the sticky bit (like ``/tmp``) so that
different users sharing a GPU meet on the same files.

The directory and the files in it are shared with other users, so nothing in them is trusted
(`launcher.common.safefile`): a default directory that another user made world-writable is
refused (anyone could have made ``/run/lock/safe-serve`` first), one named in
``$SAFE_SERVE_LOCK_DIR`` may belong to another user (the operator vouches for it: systemd makes
the unit's ``RuntimeDirectory=`` the service user's), a world-writable one without the sticky
bit never; lock files are opened without following links and used only when they are regular
files with one link; a file we may not write (another user's 0644) is locked read-only
(``flock`` needs no write access) and carries no pid. The wait polls, so signals and
``--lock-timeout`` are honoured whatever stands at the path. Every problem is one line: exit 75
for what stands at a lock path (it may be gone later), 69 for a lock directory that cannot be
used (configuration).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from launcher.common.errors import ExitCode, SafeServeError, TemporarilyUnavailable
from launcher.common.safefile import UnsafeFile, open_dir, open_regular

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["HOST", "DeviceLock", "LockDirUnusable", "default_lock_dir", "host_lock", "lock_path"]

LOCK_DIR_ENV = "SAFE_SERVE_LOCK_DIR"
_CANDIDATE_DIRS = (Path("/run/lock/safe-serve"), Path("/tmp/safe-serve-locks"))
_SHARED_DIR_MODE = 0o1777  # rwx for all, sticky: anyone may create, only owners may delete
_SHARED_FILE_MODE = 0o666  # any user must be able to open a lock file to flock it
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# The lock name of this host's memory: CPU launches size their KV cache from the same free RAM.
HOST = "host-memory"


class LockDirUnusable(SafeServeError):
    """No lock directory can be used as configured (exit 69): fix the directory or the setting."""

    exit_code = ExitCode.UNAVAILABLE


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """Return the first usable lock directory, creating it if needed.

    Raises:
        LockDirUnusable: ``$SAFE_SERVE_LOCK_DIR`` cannot be used, or no default one can.
    """
    return _lock_dir_choice(env)[0]


def _lock_dir_choice(env: Mapping[str, str] | None) -> tuple[Path, bool]:
    """(the lock directory, whether its owner is trusted because the operator named it).

    A directory named in ``$SAFE_SERVE_LOCK_DIR`` may belong to another user (systemd makes the
    unit's ``RuntimeDirectory=`` the service user's, mode 1777). A default directory anyone
    could have made first must be root's or ours; one that exists and is not is refused
    outright: falling back to the next would split the lock between launches.
    """
    configured = (os.environ if env is None else env).get(LOCK_DIR_ENV)
    if configured:
        path = Path(configured)
        try:
            os.close(open_dir(path, create_mode=0o755, parents=True, trust_owner=True))
        except OSError as exc:
            raise LockDirUnusable(f"{LOCK_DIR_ENV}={configured}: {_why(exc)}",
                                  hint="point it at a directory root or this user owns") from None
        _check_writable(path, f"{LOCK_DIR_ENV}={configured}")
        return path, True
    reasons = []
    for path in _CANDIDATE_DIRS:
        try:
            os.close(open_dir(path, create_mode=_SHARED_DIR_MODE))
        except UnsafeFile as exc:
            raise LockDirUnusable(f"start lock directory {exc}",
                                  hint=f"remove it, or set {LOCK_DIR_ENV} to a directory you trust") from None
        except OSError as exc:
            reasons.append(f"{path}: {exc.strerror or exc}")
            continue
        if os.access(path, os.W_OK | os.X_OK):
            return path, False
        reasons.append(f"{path}: not writable by this user")
    raise LockDirUnusable(
        "no usable directory for the start lock: " + "; ".join(reasons),
        hint=f"set {LOCK_DIR_ENV} to a directory root or this user owns",
    )


def _why(exc: OSError) -> str:
    return str(exc) if isinstance(exc, UnsafeFile) else f"{exc.strerror or exc}"


def _check_writable(path: Path, shown: str) -> None:
    if not os.access(path, os.W_OK | os.X_OK):
        raise LockDirUnusable(f"{shown}: the directory is not writable by this user",
                              hint=f"make it writable, or set {LOCK_DIR_ENV} to another directory")


def host_lock(*, timeout_s: float = 0.0, lock_dir: Path | None = None) -> DeviceLock:
    """The start lock of the host (``--device cpu``): taken like a GPU's, not yet acquired."""
    return DeviceLock([HOST], timeout_s=timeout_s, lock_dir=lock_dir)


def lock_path(lock_dir: Path, uuid: str) -> Path:
    """Return the lock file for one GPU (``MIG-GPU-<uuid>/1/0`` style names are made safe)."""
    return lock_dir / f"{_UNSAFE_CHARS.sub('_', uuid)}.lock"


class DeviceLock:
    """Exclusive start locks on a set of GPUs, taken in sorted UUID order (no deadlock).

    Use as a context manager, or call :meth:`acquire` and :meth:`release`; ``release`` may be
    called early (when the engine reports its KV cache) and again at exit.
    """

    def __init__(
        self,
        uuids: Iterable[str],
        *,
        timeout_s: float = 0.0,
        poll_s: float = 0.2,
        lock_dir: Path | None = None,
    ) -> None:
        self.uuids: tuple[str, ...] = tuple(sorted(set(uuids)))
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._lock_dir = lock_dir
        self._fds: dict[str, int] = {}

    @property
    def held(self) -> bool:
        """True while every lock is held."""
        return bool(self.uuids) and len(self._fds) == len(self.uuids)

    def acquire(self) -> None:
        """Take every lock, waiting up to ``timeout_s`` in total.

        Raises:
            TemporarilyUnavailable: a lock is still held by another process at the deadline
                (exit code 75); the message names the GPU and the holder's pid.
        """
        lock_dir, trusted = (self._lock_dir, True) if self._lock_dir else _lock_dir_choice(None)
        deadline = time.monotonic() + self.timeout_s
        try:
            for uuid in self.uuids:
                if uuid not in self._fds:
                    self._fds[uuid] = _lock_one(lock_path(lock_dir, uuid), uuid, deadline, self.poll_s, self.timeout_s,
                                                trusted=trusted)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Release every lock held; safe to call more than once."""
        for uuid in reversed(self.uuids):
            fd = self._fds.pop(uuid, None)
            if fd is None:
                continue
            try:
                os.ftruncate(fd, 0)  # a waiter must not name us once we let go
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(fd)

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _lock_one(path: Path, uuid: str, deadline: float, poll_s: float, timeout_s: float, *, trusted: bool) -> int:
    """Open and flock one lock file, polling until ``deadline``; return the open fd.

    The wait is a poll (non-blocking ``flock`` and short sleeps), so a signal handler runs
    within ``poll_s`` and ``--lock-timeout`` is honoured whatever stands at the path.
    """
    fd, writable = _open_shared(path, trusted=trusted)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    what = "this host's memory" if uuid == HOST else f"GPU {uuid}"
                    raise TemporarilyUnavailable(
                        f"{what} is being started by {_describe_holder(fd)}; "
                        f"waited {timeout_s:g} s for its start lock {path}",
                        hint="try again when that launch has allocated its KV cache",
                    ) from None
                time.sleep(min(poll_s, remaining))
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_shared(path: Path, *, trusted: bool) -> tuple[int, bool]:
    """Open a lock file that other users may have created: (fd, whether we may write the pid).

    Relative to the directory's descriptor, never through a link, regular files with one link
    only. Opens without O_CREAT first: with ``fs.protected_regular`` the kernel refuses O_CREAT
    on another user's file in a sticky world-writable directory. A file we may not write (another
    user's 0644) is locked read-only.

    Raises:
        TemporarilyUnavailable: what stands at the path is not a lock file we can use (exit 75).
        LockDirUnusable: the directory itself cannot be used (exit 69).
    """
    try:
        dir_fd = open_dir(path.parent, trust_owner=trusted)
    except OSError as exc:
        raise LockDirUnusable(f"start lock directory {_why(exc)}" if isinstance(exc, UnsafeFile)
                              else f"start lock directory {path.parent}: {exc.strerror or exc}",
                              hint=f"set {LOCK_DIR_ENV} to a directory root or this user owns") from None
    try:
        return _open_in(dir_fd, path)
    except UnsafeFile as exc:
        raise TemporarilyUnavailable(f"start lock: {exc}", hint="remove it, or set "
                                     f"{LOCK_DIR_ENV} to another directory") from None
    finally:
        os.close(dir_fd)


def _open_in(dir_fd: int, path: Path) -> tuple[int, bool]:
    for _ in range(100):  # a file removed between our opens: try again, a bounded number of times
        for flags, writable in ((os.O_RDWR, True), (os.O_RDONLY, False)):
            try:
                return open_regular(path.name, flags, dir_fd=dir_fd, where=path.parent), writable
            except FileNotFoundError:
                break
            except UnsafeFile as exc:
                if writable and exc.errno in (errno.EACCES, errno.EPERM):
                    continue  # not ours to write: lock it read-only
                raise
        try:
            fd = open_regular(path.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd, where=path.parent,
                              mode=_SHARED_FILE_MODE)
        except FileExistsError:
            continue  # someone created it between our two opens
        except UnsafeFile as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise LockDirUnusable(f"cannot create the start lock {path}: {exc}",
                                      hint=f"make {path.parent} writable, or set {LOCK_DIR_ENV}") from None
            raise
        try:
            os.fchmod(fd, _SHARED_FILE_MODE)  # undo the umask
        except OSError:
            pass
        return fd, True
    raise TemporarilyUnavailable(f"start lock {path} keeps disappearing while it is opened",
                                 hint="another process is removing it")


def _describe_holder(fd: int) -> str:
    """Name the holder from the pid it wrote, e.g. ``pid 4242``."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "another process (pid not written)"
