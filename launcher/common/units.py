"""Byte sizes: parsing what operators type and printing what engines print."""

from __future__ import annotations

import math
import re

from launcher.common.errors import UsageError

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
# ASCII digits only (`\d` also takes Arabic-Indic and other digits float() would read), and a
# bounded count of them: 310 digits overflow a float to inf, and int(inf) raises.
_SIZE = re.compile(r"^\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*([a-zA-Z]{0,3})\s*$")
# No device or host we plan for has a PiB; anything larger is a typo, not a size.
MAX_SIZE_BYTES = 1 << 50


def parse_size(text: str) -> int:
    """Parse `24GiB`, `44.4GiB`, `24576MiB`, `80GB` or a plain byte count into bytes.

    GB means 10**9 and GiB 2**30, as the units say; a bare number is bytes.
    """
    match = _SIZE.match(text) if len(text) <= 64 else None
    if not match or match.group(2).lower() not in _UNITS:
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        raise UsageError(f"cannot read size {shown!r}: use a number with a unit such as 24GiB, 24576MiB or 80GB")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size > MAX_SIZE_BYTES:
        raise UsageError(f"size {text!r} is larger than 1 PiB: not a memory size safe-serve can plan for")
    return size


def format_gib(num_bytes: float, *, digits: int = 2, width: int = 0, unit: bool = True) -> str:
    """`12.34 GiB`, the unit both engines really use (SGLang labels it GB).

    ``digits`` decimals, right-aligned in ``width`` characters; ``unit=False`` leaves out the
    ` GiB` where a column header or a trailing label names it once.
    """
    text = f"{num_bytes / GiB:>{width}.{digits}f}" if width else f"{num_bytes / GiB:.{digits}f}"
    return text + (" GiB" if unit else "")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def floor_to(value: float, decimals: int) -> float:
    scale = 10.0**decimals
    return math.floor(value * scale + 1e-9) / scale
