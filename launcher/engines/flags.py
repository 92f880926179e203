"""Reading the engine flags an operator pinned after `--`, exactly as the engine would.

The flags pass through untouched; we only read the memory-relevant ones so the plan
keeps them and never overrides what the operator set.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import UsageError


@dataclass(frozen=True)
class FlagSpec:
    name: str  # canonical spelling, e.g. "--max-model-len"
    parse: Callable[[str], Any] | None  # None: a boolean switch
    aliases: tuple[str, ...] = ()


def _spellings(spec: FlagSpec) -> list[str]:
    names = [spec.name, *spec.aliases]
    # argparse in both engines accepts the underscore spelling too (--tp_size).
    return names + [n.replace("-", "_").replace("__", "--", 1) for n in names]


def parse_pinned(argv: Sequence[str], specs: Sequence[FlagSpec]) -> dict[str, Any]:
    """Values of the known flags in `argv` (last one wins, as in argparse).

    One serve reads the same argv many times (plan, alternatives, lock, calibration key,
    health port): the parse is pure, so it is done once per argv and copied out.
    """
    return dict(_parse_pinned(tuple(argv), tuple(specs)))


@functools.lru_cache(maxsize=256)
def _parse_pinned(argv: tuple[str, ...], specs: tuple[FlagSpec, ...]) -> tuple[tuple[str, Any], ...]:
    lookup = {spelling: spec for spec in specs for spelling in _spellings(spec)}
    pinned: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        spec = lookup.get(name)
        if spec is None:
            i += 1
            continue
        if spec.parse is None:
            pinned[spec.name] = True if not eq else inline.lower() not in ("0", "false", "no")
            i += 1
            continue
        if eq:
            raw = inline
            i += 1
        elif i + 1 < len(argv):
            raw = argv[i + 1]
            i += 2
        else:
            raise UsageError(f"engine flag {name} needs a value")
        try:
            pinned[spec.name] = spec.parse(raw)
        except (ValueError, UsageError) as exc:
            raise UsageError(f"engine flag {name}: cannot read {raw!r} ({exc})") from None
    return tuple(pinned.items())


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """vLLM's `human_readable_int`: 1k = 1000, 1K = 1024, 25.6k; no decimals with K/M/G/T."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]


def human_int_or_auto(text: str) -> int:
    """`--max-model-len` also takes -1 and auto (fit the KV cache); otherwise a positive count."""
    return -1 if text.strip().lower() in ("auto", "-1") else positive(human_int)(text)


def positive(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse`, refusing zero and negative values (sizes, counts and lengths)."""
    def parse_positive(text: str) -> Any:
        value = parse(text)
        if value <= 0:
            raise ValueError("must be positive")
        return value

    return parse_positive


positive_int = positive(int)


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be in (0, 1]")
    return value


def drop_flag(args: Sequence[str], flag: str, specs: Sequence[FlagSpec] = ()) -> list[str]:
    """`args` without `flag` in any spelling (`--flag v`, `--flag=v`, `--flag_name v`, and the
    aliases its spec in `specs` lists, e.g. `-tp` for `--tensor-parallel-size`)."""
    spec = next((s for s in specs if s.name == flag), None)
    spellings = set(_spellings(spec)) if spec is not None else {flag, flag.replace("-", "_").replace("__", "--", 1)}
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        name = token.partition("=")[0]
        if name in spellings:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def set_flag(args: Sequence[str], flag: str, value: str, specs: Sequence[FlagSpec] = ()) -> list[str]:
    """`args` with `flag` set to `value`, replacing any earlier spelling of it."""
    return [*drop_flag(args, flag, specs), flag, value]


def split_engine_cmd(engine_cmd: str) -> list[str]:
    """`--engine-cmd` split like a shell would; an unclosed quote is a usage error (exit 2)."""
    try:
        return shlex.split(engine_cmd)
    except ValueError as exc:
        raise UsageError(f"--engine-cmd {engine_cmd!r}: {exc}", hint="quote it as one shell word") from None
