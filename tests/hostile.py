"""Helpers for the hostile-input tests: another user's files and processes, a full disk.

The tests run as root in CI; another local user is simulated with `os.chown` to `nobody` and
with a forked child that drops to that uid (no exec, so it needs no access to the interpreter's
install directory).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

NOBODY = 65534
OTHER = 65533  # a second foreign uid (need not exist in /etc/passwd)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown files to another user")


def as_user(uid: int, func: Callable[[], Any]) -> tuple[str, Any]:
    """Run ``func`` in a forked child as ``uid``: ("ok", result) or ("raised", (type name, str, exit_code))."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, run, report, and never return into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                report: tuple[str, Any] = ("ok", func())
            except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
                report = ("raised", (type(exc).__name__, str(exc), getattr(exc, "exit_code", None)))
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(report, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    assert data, "the child as another user reported nothing"
    result: tuple[str, Any] = pickle.loads(data)  # noqa: S301 - our own child's report
    return result


def shared_dir(base: Path, name: str, *, mode: int = 0o1777, uid: int = 0) -> Path:
    """``base/name`` with ``mode`` and owner ``uid`` (``base`` from the ``public_tmp`` fixture)."""
    path = base / name
    path.mkdir()
    os.chmod(path, mode)
    os.chown(path, uid, uid)
    return path


def small_tmpfs_command(size_kib: int, mount_point: Path, inner: list[str]) -> list[str] | None:
    """``inner`` run in a private mount namespace with a ``size_kib`` tmpfs at ``mount_point``
    (a real full disk), or None where this machine does not allow it."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return None
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"mount -t tmpfs -o size={size_kib}k tmpfs {mount_point}"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    script = f"mount -t tmpfs -o size={size_kib}k tmpfs {mount_point} && exec \"$@\""
    return [unshare, "-m", "sh", "-c", script, "sh", *inner]
