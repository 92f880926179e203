"""How safe-serve's own log lines look: structlog, readable on a TTY, JSON lines otherwise."""

from __future__ import annotations

import sys


def configure_logging(log_format: str | None) -> None:
    """structlog: readable on a TTY, JSON lines otherwise or with --log-format json."""
    import structlog

    as_json = log_format == "json" or (log_format is None and not sys.stderr.isatty())
    renderer = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                                    renderer],
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
