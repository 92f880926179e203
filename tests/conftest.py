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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real engines' tests (`engine` marker) run first and, under pytest-xdist (the README's test
    command runs two or more workers), as one group: one worker starts the engines one after another
    while the others run the rest. Two engines at once would contend for the same cores and memory;
    last, they would leave the other workers idle for their ten minutes."""
    engine = [item for item in items if item.get_closest_marker("engine") is not None]
    for item in engine:
        item.add_marker(pytest.mark.xdist_group("engine"))
    items[:] = engine + [item for item in items if item.get_closest_marker("engine") is None]
