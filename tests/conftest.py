"""Shared fixtures: a clean environment for every test (no GPU masks, no systemd socket), and
the pids a test started, killed after it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_SCRUBBED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NOTIFY_SOCKET", "WATCHDOG_USEC",
             "VLLM_CPU_KVCACHE_SPACE", "SAFE_SERVE_STATE_DIR", "HF_HUB_OFFLINE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in _SCRUBBED:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(name="cleanup")
def _cleanup() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


@pytest.fixture(name="public_tmp")
def _public_tmp() -> Iterator[Path]:
    """A fresh directory under /tmp that every user can reach (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="safe-serve-hostile-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
