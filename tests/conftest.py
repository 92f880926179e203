"""Shared fixtures: a clean environment for every test (no GPU masks, no systemd socket)."""

from __future__ import annotations

import pytest

_SCRUBBED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NOTIFY_SOCKET", "WATCHDOG_USEC",
             "VLLM_CPU_KVCACHE_SPACE", "SAFE_SERVE_STATE_DIR", "HF_HUB_OFFLINE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in _SCRUBBED:
        monkeypatch.delenv(key, raising=False)
