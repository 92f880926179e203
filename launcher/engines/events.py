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


# Rules read at most this much of a line: every record a rule knows is far shorter (the longest,
# SGLang's max_total_num_tokens line, is ~250 characters), and a bound keeps any one line's cost
# fixed however long a hostile line is (the pass-through itself is never cut).
MAX_RULE_CHARS = 4096
MAX_RULE_BYTES = 4 * MAX_RULE_CHARS  # bytes decoded for the rules (UTF-8: at most 4 per character)
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
TRACEBACK = "Traceback (most recent call last):"
# uvicorn logs an exception raised while serving a request with this message, the traceback after
# it (uvicorn/protocols/http/h11_impl.py and httptools_impl.py): a request's error, not the engine's.
REQUEST_ERROR = "Exception in ASGI application"
# "module.Type: text", the last line of a Python traceback (and vLLM's logged tracebacks). A plain
# character class and one fixed ": " separator: linear, nothing to backtrack into.
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]{0,200}): ")
_JUNK = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, 0xFFFD))
_LEADING_JUNK = re.compile("[\x00-\x08\x0b-\x1f\x7f\ufffd]{1,64} ?")
_SGR = re.compile(r"\x1b\[[0-9;]{0,32}m")  # colour codes a forced-colour formatter puts in the header


WEB = "web"  # a record of the engine's web server (uvicorn), not of the engine's own logger


@dataclass(frozen=True)
class Record:
    """One line as the engine's own log format reads it.

    ``source``: who wrote the header the line starts with: the engine's logger (the record's
    ``file:line`` where the format prints one, else ``"engine"``), ``WEB`` for its web server,
    or ``""`` for raw output without a header (a traceback, a progress bar, a print).
    ``level`` is the header's level (None when the format has none, as SGLang's). ``message``
    is the text after the header. ``raised``: the exception type (short name) when the message
    is the last line of a traceback (``module.Type: text``), ``text`` then what follows the type.
    """

    source: str
    level: str | None
    message: str
    raised: str | None = None
    text: str = ""

    @property
    def headed(self) -> bool:
        return bool(self.source)


@dataclass(frozen=True)
class LineRule:
    """One kind of line: ``pattern`` is matched at the start of the record's message, never
    searched inside it, so text a record quotes (a prompt, a request) cannot match.

    Figure and ready rules (``kind`` without ``fatal:``/``crash:``) read the engine logger's
    records (and the web server's, with ``web``). Fatal and crash rules read the engine's error
    reports only: a record of its logger at ERROR or CRITICAL (in a format without levels, any
    record of its logger) whose message is ``pattern`` (when ``logged``), or an exception of one
    of the types in ``raised`` (short names) whose text is ``pattern``, from such a record or at
    the end of a traceback.
    """

    kind: str
    pattern: re.Pattern[str]
    convert: Callable[[re.Match[str]], dict[str, Any]]
    raised: frozenset[str] = frozenset()
    logged: bool = True
    web: bool = False

    @property
    def severe(self) -> bool:
        return self.kind.startswith((FATAL, CRASH))


def number(text: str) -> float:
    return float(text.replace(",", ""))


def field_after(match: re.Match[str], pattern: re.Pattern[str]) -> re.Match[str] | None:
    """A later ``key=value`` of the same record (patterns start with a literal: linear search)."""
    return pattern.search(match.string, match.end())


HeaderParser = Callable[[str], tuple[str, "str | None", str]]  # line -> (source, level, message)


class LogReader:
    """Reads one engine's lines in order, per stream, as its own records (see ``LineRule``).

    Keeps, per stream, whether a traceback is open: a raw ``Traceback (most recent call last):``
    line (or an error record ending with it) opens one; the next raw ``Type: text`` line is its
    exception; a headed record closes it. A traceback after the web server's "Exception in ASGI
    application" is a request's, and its exception is never the engine's. Records from
    ``quoting`` source files (the engine's request logger) are never read by any rule.
    """

    def __init__(self, rules: Sequence[LineRule], prefilter: tuple[str, ...], header: HeaderParser,
                 *, levelled: bool = True, quoting: frozenset[str] = frozenset()) -> None:
        self._rules = rules
        self._prefilter = prefilter
        self._header = header
        self._levelled = levelled  # False: the format prints no level (every record of its logger may report)
        self._quoting = quoting
        self._traceback: set[str] = set()
        self._request_error: set[str] = set()  # streams where the next traceback is a request's

    def record(self, stream: str, line: str) -> Record:
        """Classify one line (at most ``MAX_RULE_CHARS`` of it are read)."""
        head = line[:MAX_RULE_CHARS].rstrip("\r\n")
        if "\x1b" in head[:256]:
            head = _SGR.sub("", head[:256]) + head[256:]
        if head[:1] in _JUNK:  # stray bytes (invalid UTF-8, controls) before a header cannot spell one
            head = _LEADING_JUNK.sub("", head, count=1)
        source, level, message = self._header(head)
        opened = stream in self._traceback
        if source:
            self._traceback.discard(stream)
            self._request_error.discard(stream)
            if level in ERROR_LEVELS and message.startswith(REQUEST_ERROR):
                self._request_error.add(stream)
        if message.endswith(TRACEBACK) and (not source or self._reports(source, level)):
            if stream in self._request_error:
                return Record(source, level, message)  # its exception is the request's, never the engine's
            self._traceback.add(stream)
        # An exception line: a raw line in an open traceback, or a record at an explicit ERROR level.
        severe = level in ERROR_LEVELS and source != WEB if source else opened
        exception = _EXCEPTION_LINE.match(message) if severe and message[:1] not in (" ", "\t") else None
        if exception is None:
            return Record(source, level, message)
        if not source:
            self._traceback.discard(stream)
        return Record(source, level, message, exception.group(1).rpartition(".")[2], message[exception.end():])

    def _reports(self, source: str, level: str | None) -> bool:
        """A record of the engine's own logger that may report an error."""
        if source == WEB or source.partition(":")[0] in self._quoting:
            return False
        return level in ERROR_LEVELS or (level is None and not self._levelled)

    def read(self, stream: str, line: str) -> EngineEvent | None:
        """The event of the first rule that accepts this line, or None."""
        head = line[:MAX_RULE_CHARS]
        if not any(key in head for key in self._prefilter):
            if stream in self._traceback and head[:1] not in ("", " ", "\t") and not head.startswith("During"):
                self.record(stream, line)  # a raw exception line no rule knows still ends its traceback
            return None
        record = self.record(stream, line)
        if record.source.partition(":")[0] in self._quoting:
            return None
        for rule in self._rules:
            match = self._match(rule, record)
            if match is not None:
                return EngineEvent(rule.kind, rule.convert(match), head.strip())
        return None

    def _match(self, rule: LineRule, record: Record) -> re.Match[str] | None:
        if not rule.severe:
            readable = record.headed and (rule.web or record.source != WEB) and record.raised is None
            return rule.pattern.match(record.message) if readable else None
        if record.raised is not None:
            return rule.pattern.match(record.text) if record.raised in rule.raised else None
        if rule.logged and record.headed and self._reports(record.source, record.level):
            return rule.pattern.match(record.message)
        return None
