"""Byte sizes: parsing what operators type and printing what engines print."""

from __future__ import annotations

import math
import re

from launcher.errors import UsageError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse `24GiB`, `44.4GiB`, `24576MiB`, `80GB` or a plain byte count into bytes.

    GB means 10**9 and GiB 2**30, as the units say; a bare number is bytes.
    """
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read size {text!r}: use a number with a unit such as 24GiB, 24576MiB or 80GB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def gib(num_bytes: float) -> float:
    return num_bytes / GiB


def format_gib(num_bytes: float) -> str:
    """`12.34 GiB`, the unit both engines really use (SGLang labels it GB)."""
    return f"{num_bytes / GiB:.2f} GiB"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def floor_to(value: float, decimals: int) -> float:
    scale = 10**decimals
    return math.floor(value * scale + 1e-9) / scale
