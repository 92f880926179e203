"""The searches every planner and `fit` share: monotone predicates, bisected.

A planner asks "does this length fit?" and `fit` asks "do this many requests fit?"; both
answers only get worse as the number grows, so one bisection serves each.
"""

from __future__ import annotations

from collections.abc import Callable


def largest_length(fits: Callable[[int], bool], upper: int, multiple: int) -> int:
    """The largest multiple of `multiple` (or `upper` itself) for which `fits(length)` holds; 0 if none."""
    if fits(upper):
        return upper
    low, high = 0, upper // multiple
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid * multiple):
            low = mid
        else:
            high = mid - 1
    return low * multiple


def largest_count(fits: Callable[[int], bool], ceiling: int = 1 << 20) -> int:
    """The largest n >= 1 for which `fits(n)` holds (0 if not even 1), doubling until it fails,
    then bisecting. At most `ceiling`: a predicate that never fails (a planner that caps the
    running requests itself) would otherwise double until str(n) overflows (fuzz: fit ... 99.0)."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        if high >= ceiling:
            return ceiling
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
