"""Byte sizes: parsing what operators type and printing what engines print."""

from __future__ import annotations

import math
import re

from launcher.common.errors import UsageError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {
    "b": 1,
    "k": 1000, "kb": 1000, "kib": KiB, "ki": KiB,  # Ki/Mi/Gi/Ti: Kubernetes' spelling of KiB/MiB/GiB/TiB
    "m": 1000**2, "mb": 1000**2, "mib": MiB, "mi": MiB,
    "g": 1000**3, "gb": 1000**3, "gib": GiB, "gi": GiB,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40, "ti": 1 << 40,
}
# ASCII digits only (`\d` also takes Arabic-Indic and other digits float() would read), and a
# bounded count of them: 310 digits overflow a float to inf, and int(inf) raises.
_SIZE = re.compile(r"^\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*([a-zA-Z]{0,3})\s*$")
# No device or host we plan for has a PiB; anything larger is a typo, not a size.
MAX_SIZE_BYTES = 1 << 50


def parse_size(text: str) -> int:
    """Parse `24GiB`, `44.4GiB`, `24576MiB`, `80GB`, `24Gi` or `512B` into bytes.

    GB means 10**9 and GiB (Gi) 2**30, as the units say. A size needs its unit: a bare `1` was
    one byte, which nobody means (0 alone is fine: nothing).
    """
    match = _SIZE.match(text) if len(text) <= 64 else None
    shown = text if len(text) <= 40 else f"{text[:40]}..."
    if match and not match.group(2) and float(match.group(1)) == 0:
        return 0
    if match and not match.group(2):
        raise UsageError(f"size {shown!r} has no unit: write e.g. {match.group(1)}GiB or {match.group(1)}MiB "
                         "(or a share of the GPU such as 50% where the option takes one)")
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read size {shown!r}: use a number with a unit such as 24GiB, 24Gi, 24576MiB "
                         "or 80GB")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size > MAX_SIZE_BYTES:
        raise UsageError(f"size {text!r} is larger than 1 PiB: not a memory size safe-serve can plan for")
    return size


_SHARE = re.compile(r"^\s*([0-9]{1,3}(?:\.[0-9]{1,6})?)\s*%\s*$")


def parse_share(text: str) -> float | None:
    """`50%` -> 0.5 (a share of the GPU, above 0 and at most 100%); None if `text` is not a percentage."""
    match = _SHARE.match(text) if len(text) <= 16 else None
    if not match:
        return None
    share = float(match.group(1)) / 100
    if not 0 < share <= 1:
        raise UsageError(f"{text.strip()!r}: a share of the GPU is above 0% and at most 100%")
    return share


def parse_size_or_share(text: str, total_bytes: int | None) -> int:
    """A size (`24GiB`) or a share of `total_bytes` (`50%`: the GPU's whole memory)."""
    share = parse_share(text)
    if share is None:
        return parse_size(text)
    if total_bytes is None:
        raise UsageError(f"{text.strip()!r}: a share needs a GPU to take it of; give a size such as 24GiB")
    return int(total_bytes * share)


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
