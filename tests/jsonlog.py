"""Reading safe-serve's JSON event lines back from a captured stderr file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def json_events(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON events in ``path`` (other lines skipped), only those called ``name`` if given."""
    found = []
    for line in path.read_bytes().split(b"\n"):
        if line.startswith(b'{"'):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if name is None or event.get("event") == name:
                found.append(event)
    return found
