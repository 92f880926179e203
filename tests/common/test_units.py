"""Sizes as operators type them: units, decimals, and absurd values refused with one line."""

from __future__ import annotations

import pytest

from launcher.common.errors import UsageError
from launcher.common.units import MAX_SIZE_BYTES, GiB, MiB, cdiv, floor_to, format_gib, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("24GiB", 24 * GiB), ("44.4GiB", int(44.4 * GiB)), ("24576MiB", 24576 * MiB), ("80GB", 80 * 10**9),
    ("256MiB", 256 * MiB), ("1024B", 1024), ("0", 0), (" 2 tib ", 2 << 40), ("1.5k", 1500), ("1024TiB", 1 << 50),
    ("24Gi", 24 * GiB), ("512Mi", 512 * MiB),
])
def test_sizes(text: str, expected: int) -> None:
    """GB is 10**9 and GiB (Kubernetes' Gi) 2**30; bytes need their B; case and spaces do not matter."""
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("1" + "0" * 309, "cannot read size '1000000000000000000000000000000000000000...'"),  # float() gives inf
    ("1" + "0" * 309 + "GiB", "cannot read size"),
    ("9" * 16, "cannot read size"),
    ("1025TiB", "larger than 1 PiB"),
    ("999999999999999TB", "larger than 1 PiB"),
    ("1e9", "cannot read size '1e9'"),
    ("inf", "cannot read size 'inf'"),
    ("nan GiB", "cannot read size"),
    ("-1GiB", "cannot read size"),
    ("24 GiBs", "cannot read size"),
    ("٣GiB", "cannot read size"),  # an Arabic-Indic digit: \\d and float() take it, we do not
    ("", "cannot read size ''"),
    ("1", "size '1' has no unit"),  # --margin 1 was silently one byte
    ("0.5", "size '0.5' has no unit"),  # --max-gpu-memory 0.5 was 0 bytes
    ("24GiB" * 100, "cannot read size"),
])
def test_absurd_sizes_are_usage_errors(text: str, fragment: str) -> None:
    """Every unreadable or absurd size is one short UsageError (exit 2), never OverflowError."""
    with pytest.raises(UsageError) as caught:
        parse_size(text)
    assert fragment in str(caught.value) and len(str(caught.value)) < 200 and caught.value.exit_code == 2


def test_bound_is_one_pib() -> None:
    assert MAX_SIZE_BYTES == 1 << 50 and parse_size("1024TiB") == MAX_SIZE_BYTES


def test_formatting_helpers() -> None:
    assert format_gib(44.42 * GiB) == "44.42 GiB" and cdiv(7, 2) == 4 and floor_to(0.92999, 2) == 0.92


def test_format_gib_serves_every_view() -> None:
    """One formatter: the plan's column (width 8, no unit), the gpus view (1 decimal), a sentence."""
    assert format_gib(23.99 * GiB, width=8, unit=False) == "   23.99"
    assert format_gib(14.2 * GiB, digits=1) == "14.2 GiB"
    assert format_gib(0.5 * GiB, unit=False) == "0.50"
