"""Files in directories other users may write to (the lock directory, the state directory, the
ready file's directory), opened so that nobody else's link, FIFO or directory can stand in for them.

- A directory is opened once, without following a link at its last component, and checked
  (`check_dir`) before anything is created in it; every file in it is then opened relative to
  that descriptor, so the checked directory is the one used.
- Files are opened with ``O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK`` and kept only when ``fstat``
  says they are regular files with one link (a hard link could make a victim's file look like ours).
- Temporaries are created like ``tempfile.mkstemp`` (a random name, ``O_CREAT | O_EXCL``, which
  never follows a link) in the target's own directory, renamed over the target, and removed on
  every failure path, a full disk included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["UnsafeFile", "atomic_write", "check_dir", "open_dir", "open_regular", "read_bounded"]

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path safe-serve will not use as it stands; ``str()`` is one line saying why."""

    def __init__(self, message: str, err: int = errno.EPERM) -> None:
        super().__init__(err, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_dir(st: os.stat_result, path: Path | str, *, trust_owner: bool = False) -> None:
    """Refuse a directory that another user could use to swap our files.

    World-writable is fine only with the sticky bit and an owner we trust (root or us, or any
    owner with ``trust_owner``: a directory the operator named), like ``/tmp`` or
    ``/run/lock``: its owner can rename anyone's files in it, and without the sticky bit so can
    everybody.
    """
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(f"{path} is not a directory", errno.ENOTDIR)
    if st.st_mode & stat.S_IWOTH:
        if st.st_uid not in (0, os.geteuid()) and not trust_owner:
            raise UnsafeFile(f"{path} is world-writable and owned by another user (uid {st.st_uid}); "
                             "refusing to use it")
        if not st.st_mode & stat.S_ISVTX:
            raise UnsafeFile(f"{path} is world-writable without the sticky bit (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); refusing to use it")


def open_dir(path: Path, *, create_mode: int | None = None, parents: bool = False, trust_owner: bool = False) -> int:
    """Open ``path`` as a directory (not through a link at its last component) and check it.

    With ``create_mode`` a missing directory is created with exactly that mode (the umask
    undone on the descriptor, never through the path). ``trust_owner``: see `check_dir`. Returns the descriptor; raises
    `UnsafeFile` for a directory we must not use and `OSError` for the rest.
    """
    created = False
    if create_mode is not None:
        try:
            if parents:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            os.mkdir(path, create_mode)
            created = True
        except FileExistsError:
            pass
    fd = _open_dir_fd(path)
    try:
        st = os.fstat(fd)
        if created and create_mode is not None and st.st_uid == os.geteuid() \
                and stat.S_IMODE(st.st_mode) != create_mode:
            os.fchmod(fd, create_mode)  # undo the umask on what we just made
            st = os.fstat(fd)
        check_dir(st, path, trust_owner=trust_owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir_fd(path: Path) -> int:
    """The directory's descriptor. A link at its last component is followed only when root or we
    own the link (``/var/run -> /run``), as the kernel's ``fs.protected_symlinks`` would."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = os.lstat(path)
        except OSError:
            raise exc from None
        if not stat.S_ISLNK(link.st_mode):
            raise UnsafeFile(f"{path} is not a directory", errno.ENOTDIR) from None
        if link.st_uid not in (0, os.geteuid()):
            raise UnsafeFile(f"{path} is a symbolic link owned by another user (uid {link.st_uid}); "
                             "refusing to follow it", errno.ELOOP) from None
    try:
        return os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except NotADirectoryError:
        raise UnsafeFile(f"{path} is not a directory", errno.ENOTDIR) from None


def open_regular(name: str, flags: int, *, dir_fd: int, where: Path | str, mode: int = 0o600) -> int:
    """Open ``name`` in the directory ``dir_fd`` (shown as ``where``): a regular file with one link.

    Never follows a link, never blocks on a FIFO; raises `UnsafeFile` (one line) for anything
    that is not a plain file of its own, and ``FileNotFoundError`` when it is missing and
    ``flags`` lack ``O_CREAT``.
    """
    shown = os.path.join(str(where), name)
    try:
        fd = os.open(name, flags | _OPEN_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _explain(exc, name, dir_fd, shown) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{shown} is {_kind(st.st_mode)}, not a regular file; refusing to use it")
        if st.st_nlink != 1:
            raise UnsafeFile(f"{shown} has {st.st_nlink} hard links; refusing to use it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _explain(exc: OSError, name: str, dir_fd: int, shown: str) -> OSError:
    """The open error as one line that names what stands at the path."""
    if isinstance(exc, FileNotFoundError):
        return exc
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if isinstance(exc, FileExistsError) and st is not None and stat.S_ISREG(st.st_mode):
        return exc  # O_EXCL lost a race to a plain file: the caller opens that one
    if st is not None and stat.S_ISLNK(st.st_mode):
        return UnsafeFile(f"{shown} is a symbolic link; refusing to follow it", errno.ELOOP)
    if st is not None and not stat.S_ISREG(st.st_mode):
        return UnsafeFile(f"{shown} is {_kind(st.st_mode)}, not a regular file; refusing to use it")
    if st is not None and exc.errno in (errno.EACCES, errno.EPERM):
        return UnsafeFile(f"cannot open {shown} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): "
                          f"{exc.strerror}", exc.errno)
    return UnsafeFile(f"cannot open {shown}: {exc.strerror or exc}", exc.errno or errno.EIO)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(name: str, *, dir_fd: int, where: Path | str, limit: int) -> bytes | None:
    """The bytes of a regular file, or None when it is missing; `UnsafeFile` above ``limit`` bytes."""
    try:
        fd = open_regular(name, os.O_RDONLY, dir_fd=dir_fd, where=where)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{os.path.join(str(where), name)} is larger than {limit} bytes; not read", errno.EFBIG)
    return data


@contextlib.contextmanager
def _temporary(dir_fd: int, prefix: str, mode: int) -> Iterator[tuple[int, str]]:
    """``tempfile.mkstemp`` relative to a directory descriptor; the file is gone afterwards
    unless the caller renamed it."""
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, mode, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no unused temporary name")
    try:
        yield fd, name
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def atomic_write(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` in one rename: a reader sees the old file or
    the new one, never a part; a link at ``name`` is replaced, never written through; the
    temporary is removed whatever fails (``ENOSPC`` included)."""
    with _temporary(dir_fd, f".{name}.", mode) as (fd, tmp):
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fchmod(fd, mode)  # the umask must not decide who can read it
        os.fsync(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
