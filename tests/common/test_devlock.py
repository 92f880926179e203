"""Start locks per GPU and for the host (launcher/common/devlock.py), against real holder processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.common.devlock import DeviceLock, default_lock_dir, lock_path
from launcher.common.errors import ExitCode, TemporarilyUnavailable

REPO = Path(__file__).resolve().parents[1].parent

_HOLDER = """\
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from launcher.common.devlock import DeviceLock
lock = DeviceLock({uuids!r}, lock_dir=Path({lock_dir!r}))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


class TestDeviceLock:
    def _holder(self, tmp_path: Path, uuids: list[str], cleanup: list[int]) -> subprocess.Popen[str]:
        code = _HOLDER.format(repo=str(REPO), uuids=uuids, lock_dir=str(tmp_path))
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        cleanup.append(proc.pid)
        assert proc.stdout is not None and "held\n" == proc.stdout.readline()
        return proc

    def test_second_acquirer_times_out_naming_the_holder(self, tmp_path: Path, cleanup: list[int]) -> None:
        """A lock held by another process makes acquire() fail after the timeout with exit code 75 and its pid."""
        holder = self._holder(tmp_path, ["GPU-aaaa"], cleanup)
        lock = DeviceLock(["GPU-aaaa"], timeout_s=0.3, poll_s=0.05, lock_dir=tmp_path)
        started = time.monotonic()
        with pytest.raises(TemporarilyUnavailable) as info:
            lock.acquire()
        assert time.monotonic() - started >= 0.3
        assert ExitCode.TEMPFAIL == info.value.exit_code == 75
        assert f"GPU GPU-aaaa is being started by pid {holder.pid}" in str(info.value)
        assert lock.held is False

    def test_lock_is_free_when_the_holder_dies(self, tmp_path: Path, cleanup: list[int]) -> None:
        """flock dies with its holder, so a SIGKILLed launch leaves no stale lock."""
        holder = self._holder(tmp_path, ["GPU-aaaa"], cleanup)
        holder.kill()
        holder.wait()
        with DeviceLock(["GPU-aaaa"], timeout_s=2.0, lock_dir=tmp_path) as lock:
            assert lock.held is True
            assert f"{os.getpid()}\n" == lock_path(tmp_path, "GPU-aaaa").read_text()

    def test_early_release_lets_the_next_launch_in(self, tmp_path: Path) -> None:
        """release() before the context ends frees every GPU, and a second release is harmless."""
        with DeviceLock(["GPU-b", "GPU-a"], lock_dir=tmp_path) as first:
            assert ("GPU-a", "GPU-b") == first.uuids
            first.release()
            with DeviceLock(["GPU-a"], lock_dir=tmp_path) as second:
                assert second.held is True
        assert "" == lock_path(tmp_path, "GPU-a").read_text()

    def test_partial_acquisition_is_rolled_back(self, tmp_path: Path, cleanup: list[int]) -> None:
        """If the second GPU is busy the first one is released again (sorted order, no deadlock)."""
        self._holder(tmp_path, ["GPU-b"], cleanup)
        lock = DeviceLock(["GPU-b", "GPU-a"], timeout_s=0.1, poll_s=0.02, lock_dir=tmp_path)
        with pytest.raises(TemporarilyUnavailable):
            lock.acquire()
        with DeviceLock(["GPU-a"], lock_dir=tmp_path) as other:
            assert other.held is True

    def test_lock_dir_from_environment_and_safe_names(self, tmp_path: Path) -> None:
        """SAFE_SERVE_LOCK_DIR wins, and MIG names with slashes become flat file names."""
        target = tmp_path / "locks"
        assert target == default_lock_dir({"SAFE_SERVE_LOCK_DIR": str(target)})
        assert target / "MIG-GPU-1234_1_0.lock" == lock_path(target, "MIG-GPU-1234/1/0")


class TestHostLock:
    def test_cpu_launches_wait_for_each_other(self, tmp_path: Path, cleanup: list[int]) -> None:
        """The host lock is one flock file like a GPU's: a second CPU launch times out with 75, naming the host."""
        from launcher.common.devlock import HOST, host_lock

        code = _HOLDER.format(repo=str(REPO), uuids=[HOST], lock_dir=str(tmp_path))
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        cleanup.append(holder.pid)
        assert holder.stdout is not None and "held\n" == holder.stdout.readline()
        lock = host_lock(timeout_s=0.2, lock_dir=tmp_path)
        with pytest.raises(TemporarilyUnavailable) as info:
            lock.acquire()
        assert f"this host's memory is being started by pid {holder.pid}" in str(info.value)
        assert info.value.exit_code == ExitCode.TEMPFAIL
        holder.kill()
        holder.wait()
        with host_lock(timeout_s=2.0, lock_dir=tmp_path) as again:
            assert again.held and lock_path(tmp_path, HOST).name == "host-memory.lock"
