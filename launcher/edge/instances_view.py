"""`safe-serve ps` and `safe-serve status NAME`: the running instances as a table, lines or JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from launcher.common.shown import printable
from launcher.serve.instances import PS_SCHEMA

COLUMNS = ("NAME", "MODEL", "ENGINE", "GPUS", "PORT", "PID", "KV TOKENS (ENGINE/PLAN)", "KNOB", "RETUNES", "STATE",
           "SINCE")


def _row(status: Mapping[str, Any]) -> tuple[str, ...]:
    engine_kv = status["engine_kv_tokens"]
    kv = f"{engine_kv:,}/{status['planned_kv_tokens']:,}" if engine_kv is not None else \
        f"-/{status['planned_kv_tokens']:,}"
    version = f" {status['engine_version']}" if status["engine_version"] else ""
    knob = status["memory_knob"].split() or ["-"]
    cells = (status["name"], status["model"], status["engine"] + version, str(len(status["gpus"])),
             str(status["port"]), str(status["pid"]), kv, knob[-1], str(status["retunes"]),
             status["state"], status["since"])
    return tuple(printable(cell) for cell in cells)  # a model path with a newline or escape: one row, no repaint


def render_ps(instances: Sequence[Mapping[str, Any]]) -> str:
    if not instances:
        return "no safe-serve instance is running (none has a live status file in the state directory)"
    rows = [COLUMNS, *(_row(s) for s in instances)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def render_status(status: Mapping[str, Any]) -> str:
    labels = {"engine_kv_tokens": "engine KV tokens", "planned_kv_tokens": "planned KV tokens",
              "memory_knob": "memory knob", "pid_started": None, "schema": None}
    lines = []
    for key, value in status.items():
        label = labels.get(key, key.replace("_", " "))
        if label is None:
            continue
        shown = ", ".join(value) if isinstance(value, list) else "-" if value is None else \
            f"{value:,}" if isinstance(value, int) and key.endswith("tokens") else str(value)
        lines.append(f"{label + ':':20} {printable(shown)}")
    return "\n".join(lines)


def ps_to_json(instances: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schema": PS_SCHEMA, "instances": [dict(s) for s in instances]}
