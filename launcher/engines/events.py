"""What an engine's startup lines mean, as data: the watcher matches, the serve loop decides."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

FATAL = "fatal:"  # an error that ends a start; the plan's retune rules may know what to change
CRASH = "crash:"  # the engine is dying while it runs (engine dead, NCCL, scheduler crash): nothing to retune


@dataclass(frozen=True)
class EngineEvent:
    """One log line the engine's rules recognised, with the figures it carries.

    `kind` is a figure ("kv", "weights", "available_kv", "pre_load", "kv_alloc"), "ready",
    `fatal:<name>` or `crash:<name>`; `values` holds the numbers the rule read (GiB, tokens).
    """

    kind: str
    values: dict[str, Any] = field(default_factory=dict)
    line: str = ""

    @property
    def is_fatal(self) -> bool:
        return self.kind.startswith(FATAL)

    @property
    def is_crash(self) -> bool:
        return self.kind.startswith(CRASH)

    @property
    def name(self) -> str:
        """The kind without its `fatal:`/`crash:` prefix."""
        return self.kind.partition(":")[2] or self.kind


@dataclass(frozen=True)
class LineRule:
    kind: str
    pattern: re.Pattern[str]
    convert: Callable[[re.Match[str]], dict[str, Any]]


def number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_line(rules: Sequence[LineRule], prefilter: tuple[str, ...], line: str) -> EngineEvent | None:
    """The first rule that matches `line`; a cheap substring prefilter skips most lines."""
    if not any(key in line for key in prefilter):
        return None
    for rule in rules:
        match = rule.pattern.search(line)
        if match:
            return EngineEvent(rule.kind, rule.convert(match), line.strip())
    return None
