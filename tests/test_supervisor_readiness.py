"""Health URLs (launcher/supervise/readiness.py)."""

from __future__ import annotations

import pytest

from launcher.supervise.readiness import HealthCheck


class TestHealthCheck:
    @pytest.mark.parametrize(
        ("host", "url"),
        [
            pytest.param("0.0.0.0", "http://127.0.0.1:8000/health", id="wildcard-v4"),
            pytest.param("::", "http://[::1]:8000/health", id="wildcard-v6"),
            pytest.param("fe80::1", "http://[fe80::1]:8000/health", id="v6-literal"),
            pytest.param("gpu-box", "http://gpu-box:8000/health", id="name"),
        ],
    )
    def test_url(self, host: str, url: str) -> None:
        """Wildcard binds are polled on loopback and IPv6 literals get brackets."""
        assert url == HealthCheck(host, 8000).url
