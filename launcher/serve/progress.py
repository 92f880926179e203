"""The live status line while the engine loads: phase, elapsed time, the figures seen so far.

Only on a terminal: never in JSON log mode (a machine reads stderr) and never under systemd
(``NOTIFY_SOCKET``: ``STATUS=`` carries the phase there). Styled with click, no new dependency.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import click


def wanted(stream: Any = None, env: Mapping[str, str] | None = None) -> bool:
    """A TTY, console log lines, not under systemd."""
    import structlog

    stream = sys.stderr if stream is None else stream
    env = os.environ if env is None else env
    if env.get("NOTIFY_SOCKET") or not getattr(stream, "isatty", lambda: False)():
        return False
    processors = structlog.get_config().get("processors") or []
    return not any(isinstance(p, structlog.processors.JSONRenderer) for p in processors)


class Progress:
    """What the line says; `text()` is called from the output thread, about once a second."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.phase = "starting"
        self.figures: dict[str, str] = {}
        self.started = time.monotonic()

    def saw(self, kind: str, values: Mapping[str, Any], phase: str) -> None:
        self.phase = phase
        if kind == "weights" and values.get("gib") is not None:
            self.figures["weights"] = f"{values['gib']:.2f} GiB"
        elif kind == "available_kv" and values.get("gib") is not None:
            self.figures["KV memory"] = f"{values['gib']:.2f} GiB"
        elif kind in ("kv", "kv_alloc") and values.get("tokens") is not None:
            self.figures["KV"] = f"{int(values['tokens']):,} tokens"

    def text(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        seen = "".join(f" · {name} {value}" for name, value in self.figures.items())
        return click.style(f"safe-serve: {self.engine} {self.phase} · {elapsed // 60}:{elapsed % 60:02d}{seen}",
                           dim=True)
