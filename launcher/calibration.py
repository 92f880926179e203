"""What the engine measured at an earlier start, so the next plan for the same key uses it.

Stored as one JSON file under the state directory (`$SAFE_SERVE_STATE_DIR`, systemd's
`$STATE_DIRECTORY`, or the XDG state dir). The key holds everything that changes the
engine's non-KV memory: GPU, model, engine and version, parallelism and the memory flags.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.plan import Calibration

FILE_NAME = "calibration.json"
SCHEMA = "safe-serve.calibration/1"
# Flags that change what the engine allocates besides the KV cache.
_KEY_FLAGS = ("--max-num-batched-tokens", "--max-num-seqs", "--enforce-eager", "--dtype", "--kv-cache-dtype",
              "--tensor-parallel-size", "--pipeline-parallel-size", "--chunked-prefill-size", "--tp-size",
              "--pp-size", "--cuda-graph-max-bs-decode", "--disable-cuda-graph", "--max-running-requests",
              "--no-enable-chunked-prefill", "--cpu-offload-gb", "--block-size")


def calibration_key(*, gpu_name: str, model: str, engine: str, engine_version: str,
                    pinned: Mapping[str, Any]) -> str:
    flags = ",".join(f"{k}={pinned[k]}" for k in _KEY_FLAGS if k in pinned)
    return f"{engine} {engine_version} | {gpu_name} | {model} | {flags}"


def load(state_dir: Path, key: str) -> Calibration | None:
    try:
        data = json.loads((state_dir / FILE_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    entry = data.get("entries", {}).get(key) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return None
    fields = {k: v for k, v in entry.items() if k in Calibration.__dataclass_fields__ and isinstance(v, (int, str))}
    return Calibration(**{**fields, "key": key})


def record(state_dir: Path, key: str, measured: Calibration) -> Path:
    """Merge `measured` into the file atomically (write a temp file, then rename)."""
    path = state_dir / FILE_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        data = {"schema": SCHEMA, "entries": {}}
    entry = {k: v for k, v in asdict(measured).items() if v is not None and k != "key"}
    data["entries"][key] = {**data["entries"].get(key, {}), **entry}
    state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".calibration.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path
