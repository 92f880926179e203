"""The engine's environment (launcher/supervise/process.py)."""

from __future__ import annotations

from launcher.supervise.process import build_child_env


class TestBuildChildEnv:
    def test_overrides_set_and_none_deletes(self) -> None:
        """Overrides replace or add values and None removes a variable."""
        env = build_child_env({"A": "1", "B": "2"}, {"B": None, "C": "3", "A": "x"})
        assert {"A": "x", "C": "3"} == env

    def test_systemd_variables_never_reach_the_child(self) -> None:
        """NOTIFY_SOCKET and WATCHDOG_* are removed even when an override sets them."""
        base = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1", "PATH": "/bin"}
        assert {"PATH": "/bin"} == build_child_env(base, {"NOTIFY_SOCKET": "@x"})
