"""Hostile input, part 1: files in shared directories (start locks, the ready file).

Another local user plants links, FIFOs, hard links and directories where safe-serve (as root)
opens its start locks and writes its ready file. None of them may be written through, every
problem is one line with exit 75 (what stands at a lock path) or 69 (a lock directory that
cannot be used), and a wait never outlasts --lock-timeout.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.common import devlock
from launcher.common.devlock import DeviceLock, LockDirUnusable, default_lock_dir, host_lock, lock_path
from launcher.common.errors import ExitCode, TemporarilyUnavailable
from launcher.supervise.readiness import ReadyFile
from tests.hostile import NOBODY, OTHER, as_user, needs_root, shared_dir, small_tmpfs_command

REPO = Path(__file__).resolve().parent.parent
VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n"


def _victim(base: Path) -> Path:
    victim = base / "victim"
    victim.write_text(VICTIM_TEXT)
    return victim


def _serve_cpu(lock_dir: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`safe-serve serve M --device cpu`: the host lock is taken before the model is resolved."""
    env = {**os.environ, "SAFE_SERVE_LOCK_DIR": str(lock_dir), "SAFE_SERVE_STATE_DIR": str(lock_dir / "state")}
    return subprocess.run([sys.executable, "-m", "launcher", "serve", "no-such-model", "--device", "cpu",
                           "--lock-timeout", "2", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


class TestLockPath:
    def test_dangling_symlink_is_a_clear_75_within_the_timeout(self, tmp_path: Path) -> None:
        """Before: `open` failed with ENOENT, `O_CREAT|O_EXCL` with EEXIST, forever at 100 % CPU."""
        (tmp_path / "host-memory.lock").symlink_to(tmp_path / "nowhere")
        started = time.monotonic()
        result = _serve_cpu(tmp_path)
        assert time.monotonic() - started < 20
        assert ExitCode.TEMPFAIL == result.returncode, result.stderr
        assert "host-memory.lock is a symbolic link; refusing to follow it" in result.stderr
        assert 1 == len(result.stderr.strip().splitlines()) and "Traceback" not in result.stderr

    def test_symlink_to_a_victim_leaves_it_untouched(self, tmp_path: Path) -> None:
        """Before: root's start emptied the file the link pointed at and wrote its pid there."""
        victim = _victim(tmp_path)
        (tmp_path / "host-memory.lock").symlink_to(victim)
        result = _serve_cpu(tmp_path)
        assert ExitCode.TEMPFAIL == result.returncode
        assert VICTIM_TEXT == victim.read_text()

    def test_gpu_lock_symlink_is_refused(self, tmp_path: Path) -> None:
        victim = _victim(tmp_path)
        lock_path(tmp_path, "GPU-1234").symlink_to(victim)
        with pytest.raises(TemporarilyUnavailable, match="GPU-1234.lock is a symbolic link"):
            DeviceLock(["GPU-1234"], lock_dir=tmp_path).acquire()
        assert VICTIM_TEXT == victim.read_text()

    def test_hard_link_to_a_victim_is_refused(self, tmp_path: Path) -> None:
        """A hard link looks like a regular file; its link count gives it away."""
        victim = _victim(tmp_path)
        os.link(victim, lock_path(tmp_path, devlock.HOST))
        with pytest.raises(TemporarilyUnavailable, match="has 2 hard links"):
            host_lock(lock_dir=tmp_path).acquire()
        assert VICTIM_TEXT == victim.read_text()

    @pytest.mark.parametrize("kind", ["fifo", "directory"])
    def test_lock_path_that_is_not_a_file(self, tmp_path: Path, kind: str) -> None:
        """Before: IsADirectoryError / ftruncate on a FIFO ended as exit 1 'internal error'."""
        path = lock_path(tmp_path, devlock.HOST)
        os.mkfifo(path) if kind == "fifo" else path.mkdir()
        result = _serve_cpu(tmp_path, timeout=20)
        assert ExitCode.TEMPFAIL == result.returncode, result.stderr
        assert f"is a {'FIFO' if kind == 'fifo' else 'directory'}, not a regular file" in result.stderr

    def test_lock_fd_is_not_inherited(self, tmp_path: Path) -> None:
        with host_lock(lock_dir=tmp_path) as lock:
            fd = lock._fds[devlock.HOST]
            assert os.get_inheritable(fd) is False and fcntl_cloexec(fd)


def fcntl_cloexec(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)


@needs_root
class TestForeignOwners:
    def test_another_users_0644_lock_file_is_locked_read_only(self, public_tmp: Path) -> None:
        """Before: a non-root user got EACCES opening it read-write: exit 1. Now flock works on a
        read-only descriptor, and the lock still excludes."""
        locks = shared_dir(public_tmp, "locks")
        path = lock_path(locks, devlock.HOST)
        path.write_text("")
        os.chmod(path, 0o644)
        os.chown(path, OTHER, OTHER)

        def take() -> bool:
            with host_lock(lock_dir=locks) as lock:
                return lock.held

        assert ("ok", True) == as_user(NOBODY, take)
        with host_lock(lock_dir=locks):  # root holds it: the other user waits and gives up with 75

            def wait() -> bool:
                host_lock(timeout_s=0.3, lock_dir=locks).acquire()
                return True

            kind, (name, message, code) = as_user(NOBODY, wait)
        assert ("raised", "TemporarilyUnavailable", 75) == (kind, name, code)
        assert f"this host's memory is being started by pid {os.getpid()}" in message

    def test_unreadable_lock_file_of_another_user_is_75(self, public_tmp: Path) -> None:
        locks = shared_dir(public_tmp, "locks")
        path = lock_path(locks, devlock.HOST)
        path.write_text("")
        os.chmod(path, 0o600)
        os.chown(path, OTHER, OTHER)
        kind, (name, message, code) = as_user(NOBODY, lambda: host_lock(lock_dir=locks).acquire())
        assert ("raised", "TemporarilyUnavailable", 75) == (kind, name, code)
        assert f"owner uid {OTHER}, mode 0600" in message

    def test_unwritable_lock_directory_is_69(self, public_tmp: Path) -> None:
        """Before: PermissionError, exit 1 'internal error'."""
        locks = shared_dir(public_tmp, "locks", mode=0o755)
        kind, (name, message, code) = as_user(NOBODY, lambda: host_lock(lock_dir=locks).acquire())
        assert ("raised", "LockDirUnusable", 69) == (kind, name, code)
        assert "cannot create the start lock" in message and "Permission denied" in message

    def test_configured_directory_of_another_user_is_used_but_its_links_are_not(self, public_tmp: Path) -> None:
        """SAFE_SERVE_LOCK_DIR names the systemd unit's RuntimeDirectory (the service user's, 1777):
        the operator vouches for its owner; what stands in it is still checked."""
        planted = shared_dir(public_tmp, "run-lock", mode=0o1777, uid=NOBODY)
        assert planted == default_lock_dir({"SAFE_SERVE_LOCK_DIR": str(planted)})
        victim = _victim(public_tmp)
        lock_path(planted, devlock.HOST).symlink_to(victim)
        with pytest.raises(TemporarilyUnavailable, match="is a symbolic link"):
            host_lock(lock_dir=planted).acquire()
        assert VICTIM_TEXT == victim.read_text()

    def test_default_directory_planted_by_another_user_is_69(
            self, public_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Before: /run/lock/safe-serve created first by another user was used as it stood. Now it
        is refused, and not by falling back to the next directory (that would split the lock)."""
        planted = shared_dir(public_tmp, "run-lock-safe-serve", mode=0o1777, uid=NOBODY)
        fallback = public_tmp / "tmp-safe-serve-locks"
        monkeypatch.setattr(devlock, "_CANDIDATE_DIRS", (planted, fallback))
        with pytest.raises(LockDirUnusable, match="world-writable and owned by another user") as info:
            host_lock().acquire()
        assert ExitCode.UNAVAILABLE == info.value.exit_code and not fallback.exists()

    def test_default_directory_that_is_another_users_link_is_69(
            self, public_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        link = public_tmp / "link"
        link.symlink_to(public_tmp)
        os.lchown(link, NOBODY, NOBODY)
        monkeypatch.setattr(devlock, "_CANDIDATE_DIRS", (link,))
        with pytest.raises(LockDirUnusable, match="symbolic link owned by another user"):
            default_lock_dir({})

    def test_default_directory_we_cannot_create_falls_back(self, public_tmp: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        closed = shared_dir(public_tmp, "closed", mode=0o755)
        fallback = shared_dir(public_tmp, "open", mode=0o1777)
        monkeypatch.setattr(devlock, "_CANDIDATE_DIRS", (closed / "safe-serve", fallback / "safe-serve"))
        assert ("ok", str(fallback / "safe-serve")) == as_user(NOBODY, lambda: str(default_lock_dir({})))

    def test_world_writable_directory_without_sticky_bit_is_refused(self, public_tmp: Path) -> None:
        open_dir = shared_dir(public_tmp, "open", mode=0o777)
        with pytest.raises(LockDirUnusable, match="without the sticky bit"):
            default_lock_dir({"SAFE_SERVE_LOCK_DIR": str(open_dir)})


class TestLockDirectory:
    def test_lock_dir_that_is_a_file_is_69(self, tmp_path: Path) -> None:
        """Before: FileExistsError from mkdir, exit 1."""
        (tmp_path / "file").write_text("")
        result = _serve_cpu(tmp_path / "file")
        assert ExitCode.UNAVAILABLE == result.returncode, result.stderr
        assert "is not a directory" in result.stderr

    def test_created_shared_directory_has_exactly_1777(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(devlock, "_CANDIDATE_DIRS", (tmp_path / "locks",))
        old = os.umask(0o077)
        try:
            path = default_lock_dir({})
        finally:
            os.umask(old)
        assert 0o1777 == stat.S_IMODE(path.stat().st_mode)


class TestReadyFile:
    def test_planted_link_at_the_old_temporary_name_is_not_written_through(self, tmp_path: Path) -> None:
        """Before: `.NAME.PID.tmp` was predictable and written with write_text, following a link."""
        victim = _victim(tmp_path)
        ready = tmp_path / "ready"
        (tmp_path / f".ready.{os.getpid()}.tmp").symlink_to(victim)
        ReadyFile(ready).write(4242)
        assert VICTIM_TEXT == victim.read_text()
        assert "4242\n" == ready.read_text() and not ready.is_symlink()

    def test_link_at_the_ready_path_is_replaced_not_followed(self, tmp_path: Path) -> None:
        victim = _victim(tmp_path)
        ready = tmp_path / "ready"
        ready.symlink_to(victim)
        ReadyFile(ready).write(7)
        assert VICTIM_TEXT == victim.read_text() and "7\n" == ready.read_text() and not ready.is_symlink()

    @needs_root
    def test_directory_another_user_controls_is_not_used(self, public_tmp: Path) -> None:
        planted = shared_dir(public_tmp, "planted", mode=0o1777, uid=NOBODY)
        ReadyFile(planted / "ready").write(7)
        assert [] == os.listdir(planted)

    def test_full_disk_leaves_no_temporary(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """ENOSPC in the middle of the write: the warning, and no temporary left behind."""
        real_write = os.write

        def full(fd: int, data: bytes | memoryview) -> int:
            if fd > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", full)
        ReadyFile(tmp_path / "ready").write(7)
        monkeypatch.undo()
        assert [] == os.listdir(tmp_path)


_FILL_AND_WRITE = """
import os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from launcher.supervise.readiness import ReadyFile
disk = Path({disk!r})
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 512)
except OSError:
    os.close(fd)
ReadyFile(disk / "ready").write(4242)
print(sorted(os.listdir(disk)))
"""


def test_real_full_disk_leaves_no_temporary(tmp_path: Path) -> None:
    """The same on a real full file system (a 64 KiB tmpfs in a private mount namespace)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    command = small_tmpfs_command(64, disk, [sys.executable, "-c", _FILL_AND_WRITE.format(repo=str(REPO),
                                                                                          disk=str(disk))])
    if command is None:
        pytest.skip("no private tmpfs here (needs root and unshare); the simulated ENOSPC test covers it")
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert 0 == result.returncode, result.stderr
    assert "['filler']" == result.stdout.strip().splitlines()[-1]
    assert "cannot write the ready file" in result.stdout and "No space left on device" in result.stdout
