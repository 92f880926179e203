"""What an engine's startup lines mean, as data: the watcher matches, the serve loop decides."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineEvent:
    kind: str  # "kv", "weights", "ready", or "fatal:<name>"
    values: dict[str, Any] = field(default_factory=dict)
    line: str = ""

    @property
    def is_fatal(self) -> bool:
        return self.kind.startswith("fatal:")


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
