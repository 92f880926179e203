"""What the engine measured at an earlier start, so the next plan for the same key uses it.

Stored as one JSON file under the state directory (`$SAFE_SERVE_STATE_DIR`, systemd's
`$STATE_DIRECTORY`, or the XDG state dir). The key holds everything that changes the
engine's non-KV memory: GPU, model, engine and version, parallelism and the memory flags.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from launcher.plan.types import Calibration

FILE_NAME = "calibration.json"
# A CUDA out-of-memory while serving adds this much headroom to the next plan of the same
# setup, up to the cap: a crash loop under Restart=on-failure converges within a few restarts
# instead of repeating, and a bad day cannot shrink the KV cache without bound.
RUNTIME_OOM_STEP_BYTES = 512 << 20
RUNTIME_OOM_CAP_BYTES = 2 << 30
SCHEMA = "safe-serve.calibration/1"
def calibration_key(*, gpu_name: str, model: str, engine: str, engine_version: str,
                    pinned: Mapping[str, Any], key_flags: Sequence[str]) -> str:
    """The setup a measurement belongs to; `key_flags` are the engine's flags that change what it
    allocates besides the KV cache (its adapter's `calibration_key_flags`)."""
    flags = ",".join(f"{k}={pinned[k]}" for k in key_flags if k in pinned)
    return f"{engine} {engine_version} | {gpu_name} | {model} | {flags}"


def load(state_dir: Path, key: str) -> Calibration | None:
    try:
        data = json.loads((state_dir / FILE_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    entry = data.get("entries", {}).get(key) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return None
    known = {k: v for k, v in entry.items() if k in Calibration.__dataclass_fields__ and isinstance(v, (int, str))}
    return Calibration(**{**known, "key": key})  # type: ignore[arg-type]


def record(state_dir: Path, key: str, measured: Calibration) -> Path:
    """Merge `measured` into the file atomically (write a temp file, then rename)."""
    path = state_dir / FILE_NAME
    data = _read(path)
    defaults = {f.name: f.default for f in fields(Calibration)}
    # Only what was measured: a default (None, or 0 headroom) must not erase an earlier figure.
    entry = {k: v for k, v in asdict(measured).items() if k != "key" and v != defaults[k]}
    data["entries"][key] = {**data["entries"].get(key, {}), **entry}
    _write(state_dir, data)
    return path


def record_runtime_oom(state_dir: Path, key: str, *, step_bytes: int = RUNTIME_OOM_STEP_BYTES,
                       cap_bytes: int = RUNTIME_OOM_CAP_BYTES) -> Calibration:
    """Count one CUDA out-of-memory while serving and raise the setup's extra headroom by a step
    (at most `cap_bytes`); returns what the next plan of `key` will load."""
    data = _read(state_dir / FILE_NAME)
    entry = data["entries"].get(key, {})
    count = int(entry.get("runtime_oom_count", 0)) + 1 if isinstance(entry.get("runtime_oom_count"), int) else 1
    headroom = min(step_bytes * count, cap_bytes)
    data["entries"][key] = {**entry, "runtime_oom_count": count, "extra_headroom_bytes": headroom}
    _write(state_dir, data)
    return Calibration(extra_headroom_bytes=headroom, key=key)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
        data = {"schema": SCHEMA, "entries": {}}
    return data


def _write(state_dir: Path, data: dict[str, Any]) -> None:
    """Atomically: a temp file in the same directory, then rename."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".calibration.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, state_dir / FILE_NAME)
