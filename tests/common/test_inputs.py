"""CLI values checked before anything is probed: each bad value is one UsageError line (exit 2)."""

from __future__ import annotations

import math

import pytest

from launcher.common.errors import UsageError
from launcher.common.inputs import (
    MAX_CONCURRENCY,
    check_concurrency,
    check_device_and_gpus,
    check_engine_version,
    check_max_retunes,
    check_seconds,
    check_tokens,
    check_tolerance,
)
from launcher.engines.versions import version_key


def _refused(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(UsageError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    return str(caught.value)


class TestEngineVersion:
    @pytest.mark.parametrize(("text", "key"), [
        ("0.32.0", (0, 32, 0)), ("0.5.23", (0, 5, 23)), ("v0.10.2", (0, 10, 2)), (" 0.10.2 ", (0, 10, 2)),
        ("0.8.5.dev169+g1234abc", (0, 8, 5)), ("0.6.3.post1", (0, 6, 3)), ("1", (1,)),
    ])
    def test_real_versions_pass_and_parse(self, text: str, key: tuple[int, ...]) -> None:
        """What pip versions look like passes, and version_key reads the same release from it."""
        assert version_key(check_engine_version(text)).release == key

    def test_release_candidates_pass(self) -> None:
        """Pre-releases pass (version_key reads 0.11.0rc1 as (0, 11, 1) today: its digits are joined)."""
        assert check_engine_version("0.11.0rc1") == "0.11.0rc1"

    @pytest.mark.parametrize("text", ["banana", "", "latest", "0.10.2; rm -rf /", "0..1", "1.2.3.4.5", "9" * 40,
                                      "0.1.0+", "v", "０.１"])
    def test_non_versions_are_usage_errors(self, text: str) -> None:
        """`--engine-version banana` used to plan with "rules 0.10.0"."""
        assert "--engine-version" in _refused(check_engine_version, text)

    @pytest.mark.parametrize("text", ["9" * 10_000, "0." + "1" * 5000, "0.2." + "3" * 4400 + "x"])
    def test_an_installed_version_past_the_int_digit_limit_orders_as_zero(self, text: str) -> None:
        """Installed metadata is not checked by check_engine_version: a release number longer than Python's
        int() limit (4300 digits) raised ValueError out of version_key (a traceback from `plan`)."""
        assert version_key(text) == version_key("0")

    def test_banana_message(self) -> None:
        assert _refused(check_engine_version, "banana") == \
            "--engine-version 'banana': not a version number (e.g. 0.10.2 or 0.5.4)"


class TestCounts:
    @pytest.mark.parametrize("n", [0, -1, -(10**20)])
    def test_concurrency_below_one(self, n: int) -> None:
        assert _refused(check_concurrency, n) == f"--concurrency {n}: must be at least 1"

    def test_concurrency_bounds(self) -> None:
        assert check_concurrency(1) == 1 and check_concurrency(MAX_CONCURRENCY) == MAX_CONCURRENCY
        assert "more than 1,000,000" in _refused(check_concurrency, MAX_CONCURRENCY + 1)

    @pytest.mark.parametrize("n", [True, 2.0, "3", None])
    def test_concurrency_must_be_an_int(self, n: object) -> None:
        assert "must be a whole number" in _refused(check_concurrency, n)

    def test_tokens(self) -> None:
        assert check_tokens(4096) == 4096
        assert _refused(check_tokens, 0) == "--tokens 0: must be at least 1"
        assert "more than" in _refused(check_tokens, 1 << 31)

    def test_max_retunes(self) -> None:
        assert check_max_retunes(0) == 0 and check_max_retunes(2) == 2
        assert "from 0 to 100" in _refused(check_max_retunes, -1)


class TestDeviceAndGpus:
    def test_cpu_with_gpu_is_refused(self) -> None:
        assert _refused(check_device_and_gpus, "cpu", ("rtx4090",)) == (
            "--device cpu and --gpu 'rtx4090' contradict each other: plan for the host (--device cpu) "
            "or for a GPU (--gpu), not both")

    @pytest.mark.parametrize(("device", "gpus"), [("cpu", ()), ("cuda", ()), ("cuda", ("h100", "2xa100"))])
    def test_consistent_choices_pass(self, device: str, gpus: tuple[str, ...]) -> None:
        assert check_device_and_gpus(device, gpus) is None


class TestFloats:
    @pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0.0, True])
    def test_seconds_refused(self, value: float) -> None:
        assert "--grace" in _refused(check_seconds, "--grace", value)

    def test_seconds(self) -> None:
        assert check_seconds("--grace", 30) == 30.0 and check_seconds("--grace", 0, allow_zero=True) == 0.0
        assert _refused(check_seconds, "--watch-timeout", -5.0) == \
            "--watch-timeout -5.0: must be a finite number of seconds, above 0"

    @pytest.mark.parametrize("value", [math.nan, -0.1, 1.0, 5.0, math.inf])
    def test_tolerance_refused(self, value: float) -> None:
        assert "--tolerance" in _refused(check_tolerance, value)

    def test_tolerance(self) -> None:
        assert check_tolerance(0.02) == 0.02 and check_tolerance(0) == 0.0
