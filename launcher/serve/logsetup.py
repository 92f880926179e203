"""How safe-serve's own log lines look, where operators read them.

* a terminal: structlog's console renderer, in colour unless NO_COLOR is set (no-color.org);
* anything else (a pipe, a file, journald) without --log-format: JSON lines;
* --log-format console off a terminal: the same readable lines, never ANSI colour codes
  (journald would store them as byte arrays);
* journald (stderr is the stream systemd names in $JOURNAL_STREAM): each line starts with the
  syslog priority `<N>`, which systemd's SyslogLevelPrefix= (on by default) turns into the
  entry's PRIORITY, so `journalctl -p warning` finds safe-serve's warnings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any, TextIO

# syslog(3) priorities by structlog level name (sd-daemon(3): SD_ERR "<3>", SD_WARNING "<4>", ...).
PRIORITY = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}

Renderer = Callable[[Any, str, MutableMapping[str, Any]], 'str | bytes']


def colour_wanted(stream: IO[str], env: Mapping[str, str]) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything non-empty."""
    return bool(stream.isatty()) and not env.get("NO_COLOR")


def to_journald(stream: IO[str], env: Mapping[str, str]) -> bool:
    """True when `stream` is the journal stream systemd connected ($JOURNAL_STREAM is "dev:inode")."""
    device, _, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def with_priority(render: Renderer) -> Renderer:
    """`render`, each line prefixed with its syslog priority (`<4>{...}`)."""
    def rendered(logger: Any, name: str, event: MutableMapping[str, Any]) -> str:
        level = str(event.get("level") or name).lower()
        line = render(logger, name, event)
        text = line.decode() if isinstance(line, bytes) else line
        return f"<{PRIORITY.get(level, 6)}>{text}"

    return rendered


def renderer_for(log_format: str | None, stream: IO[str], env: Mapping[str, str]) -> Renderer:
    import structlog

    as_json = log_format == "json" or (log_format is None and not stream.isatty())
    render: Renderer
    if as_json:
        render = structlog.processors.JSONRenderer()
    else:
        render = structlog.dev.ConsoleRenderer(colors=colour_wanted(stream, env))
    return with_priority(render) if to_journald(stream, env) else render


def configure_logging(log_format: str | None, env: Mapping[str, str] | None = None,
                      stream: TextIO | None = None) -> None:
    """structlog for safe-serve's own events (the engine's lines pass through untouched)."""
    import structlog

    out = stream if stream is not None else sys.stderr
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                                    renderer_for(log_format, out, os.environ if env is None else env)],
                        logger_factory=structlog.PrintLoggerFactory(out))
