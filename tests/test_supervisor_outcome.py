"""The exit-code rules (launcher/supervise/outcome.py)."""

from __future__ import annotations

import pytest

from launcher.supervise.outcome import Phase, StopBook, decide_outcome, exit_code_for


class TestExitCodeFor:
    @pytest.mark.parametrize(
        ("returncode", "expected"),
        [pytest.param(0, 0, id="ok"), pytest.param(1, 1, id="error"), pytest.param(-9, 137, id="sigkill"),
         pytest.param(-11, 139, id="sigsegv")],
    )
    def test_mapping(self, returncode: int, expected: int) -> None:
        """Exit statuses pass through and death by signal N becomes 128+N."""
        assert expected == exit_code_for(returncode)


class TestDecideOutcome:
    @pytest.mark.parametrize(
        ("returncode", "stop", "expected_code", "reason_start"),
        [
            pytest.param(1, StopBook(), 70, "engine exited with code 1", id="own-error-is-70-never-our-1"),
            pytest.param(2, StopBook(), 70, "engine exited with code 2", id="own-2-is-not-a-usage-error"),
            pytest.param(78, StopBook(), 70, "engine exited with code 78", id="own-78-is-not-will-not-fit"),
            pytest.param(0, StopBook(), 70, "engine exited with code 0 unasked", id="own-clean-exit-is-a-failure"),
            pytest.param(-11, StopBook(), 70, "engine killed by SIGSEGV", id="own-crash"),
            pytest.param(-9, StopBook(), 70, "engine killed by SIGKILL", id="oom-killer-unasked"),
            pytest.param(-15, StopBook(signal=15, forwarded={15}), 0, "stopped on SIGTERM", id="term-died-of-term"),
            pytest.param(0, StopBook(signal=2, forwarded={2}), 0, "stopped on SIGINT", id="int-exit-0"),
            pytest.param(1, StopBook(signal=15, forwarded={15}), 70, "stopped on SIGTERM", id="term-but-exit-1"),
            pytest.param(-9, StopBook(signal=15, forwarded={15}, escalation="grace"), 137, "stopped on SIGTERM",
                         id="term-escalated"),
            pytest.param(-3, StopBook(signal=3, forwarded={3}), 0, "stopped on SIGQUIT", id="quit-died-of-quit"),
            pytest.param(-9, StopBook(signal=15, forwarded={15}), 70, "stopped on SIGTERM",
                         id="term-then-killed-by-someone-else"),
            pytest.param(0, StopBook(request=("KV too small", 78), signal=15, forwarded={15}), 78, "KV too small",
                         id="request-wins"),
        ],
    )
    def test_exit_code_rules(self, returncode: int, stop: StopBook, expected_code: int, reason_start: str) -> None:
        """request_stop's code wins, a forwarded TERM/INT/HUP/QUIT ending is clean, SIGKILL after the grace is
        137, any other end of the engine is 70 (its own code never becomes ours)."""
        outcome = decide_outcome(returncode, Phase.STARTING, 0, stop)
        assert expected_code == outcome.exit_code
        assert outcome.reason.startswith(reason_start)
