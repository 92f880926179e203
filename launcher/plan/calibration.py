"""What the engine measured at an earlier start, so the next plan for the same key uses it.

Stored as one JSON file under the state directory (`$SAFE_SERVE_STATE_DIR`, systemd's
`$STATE_DIRECTORY`, or the XDG state dir). The key holds everything that changes the
engine's non-KV memory: GPU, model, engine and version, parallelism and the memory flags.

The file is state that anyone with write access to the directory (or a crash, or a full disk)
may have damaged, so nothing in it is trusted before it is checked:

- read through `launcher.common.safefile` (no link, regular file, at most `MAX_FILE_BYTES`);
- a file that is not UTF-8 JSON of this schema is ignored with one warning, and so is an entry
  that is not an object or a figure of the wrong type or outside its range (`FIELDS`; a
  figure above the device's memory is absurd too). Never an exit, never a stopped engine;
- written under a lock (`.calibration.lock`, flock) as read-merge-write, so concurrent
  starts sharing one StateDirectory lose no entry; through a temporary that is removed
  whatever fails; at most `MAX_ENTRIES` entries (the oldest go first);
- a file of another schema version (a newer safe-serve's) is kept as it is: not read, and
  not overwritten (the measurement is not saved, with a warning).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.common.safefile import UnsafeFile, atomic_write, open_dir, open_regular, read_bounded
from launcher.plan.types import Calibration

FILE_NAME = "calibration.json"
LOCK_NAME = ".calibration.lock"
# A CUDA out-of-memory while serving adds this much headroom to the next plan of the same
# setup, up to the cap: a crash loop under Restart=on-failure converges within a few restarts
# instead of repeating, and a bad day cannot shrink the KV cache without bound.
RUNTIME_OOM_STEP_BYTES = 512 << 20
RUNTIME_OOM_CAP_BYTES = 2 << 30
SCHEMA = "safe-serve.calibration/1"
SCHEMA_FAMILY = "safe-serve.calibration/"
MAX_FILE_BYTES = 1 << 20  # a few hundred setups take ~100 KiB
MAX_ENTRIES = 512
MAX_KEY_CHARS = 2048
LOCK_WAIT_S = 2.0  # another start writing (each holds it for milliseconds); the serve loop waits on this
_LOCK_POLL_S = 0.02
# Each figure an entry may hold: its inclusive range. Bytes are also capped by the device's
# memory where the caller knows it (`read_calibration(max_bytes=)`).
FIELDS: dict[str, tuple[int, int]] = {
    "non_kv_bytes": (0, 1 << 50),
    "load_overhead_bytes": (0, 1 << 50),
    "context_bytes": (0, 1 << 50),
    "extra_headroom_bytes": (0, RUNTIME_OOM_CAP_BYTES),
    "runtime_oom_count": (0, 1_000_000),
    "recorded_at": (0, 1 << 40),  # unix seconds: which entries go first when the file is full
}
_BYTE_FIELDS = ("non_kv_bytes", "load_overhead_bytes", "context_bytes", "extra_headroom_bytes")


class CalibrationNotSaved(OSError):
    """A measurement that could not be saved; one line for the operator, the engine runs on."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EAGAIN, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def calibration_key(*, gpu_name: str, model: str, engine: str, engine_version: str,
                    pinned: Mapping[str, Any], key_flags: Sequence[str]) -> str:
    """The setup a measurement belongs to; `key_flags` are the engine's flags that change what it
    allocates besides the KV cache (its adapter's `calibration_key_flags`)."""
    flags = ",".join(f"{k}={pinned[k]}" for k in key_flags if k in pinned)
    return f"{engine} {engine_version} | {gpu_name} | {model} | {flags}"


@dataclass
class _Document:
    """The file as read: the valid entries, what else it held, and what was wrong with it."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other top-level keys, written back as read
    problems: list[str] = field(default_factory=list)
    foreign_schema: str | None = None  # another version's file: neither used nor overwritten
    corrupt: bool = False


def load(state_dir: Path, key: str, *, max_bytes: int | None = None) -> Calibration | None:
    """The calibration of `key`, or None (see `read_calibration` for the warnings)."""
    return read_calibration(state_dir, key, max_bytes=max_bytes)[0]


def read_calibration(state_dir: Path, key: str, *, max_bytes: int | None = None
                     ) -> tuple[Calibration | None, tuple[str, ...]]:
    """The calibration of `key` and at most one warning about what was ignored.

    `max_bytes` (the device's memory) caps every byte figure: a larger one cannot be a
    measurement of this setup.
    """
    path = state_dir / FILE_NAME
    try:
        dir_fd = open_dir(state_dir)
    except FileNotFoundError:
        return None, ()
    except OSError as exc:
        return None, (f"calibration in {state_dir} ignored: {_why(exc)}",)
    try:
        doc = _read(dir_fd, state_dir)
    finally:
        os.close(dir_fd)
    entry = dict(doc.entries.get(key, {}))
    if max_bytes is not None:
        for name in _BYTE_FIELDS:
            if name in entry and entry[name] > max_bytes:
                doc.problems.append(f"entry {_short(key)}: {name} {entry.pop(name)} is more than the "
                                    f"device's {max_bytes} bytes")
    warning = () if not doc.problems else (f"calibration file {path}: {_summary(doc.problems)}",)
    known = {k: v for k, v in entry.items() if k in Calibration.__dataclass_fields__}
    if not known or doc.foreign_schema:
        return None, warning
    return Calibration(**known, key=key), warning


def record(state_dir: Path, key: str, measured: Calibration) -> Path:
    """Merge `measured` into the file under the lock (read, merge, write a temp file, rename)."""
    defaults = {f.name: f.default for f in fields(Calibration)}
    # Only what was measured: a default (None, or 0 headroom) must not erase an earlier figure.
    new = {k: v for k, v in asdict(measured).items() if k != "key" and v != defaults[k]}
    _update(state_dir, key, lambda entry: {**entry, **new})
    return state_dir / FILE_NAME


def record_runtime_oom(state_dir: Path, key: str, *, step_bytes: int = RUNTIME_OOM_STEP_BYTES,
                       cap_bytes: int = RUNTIME_OOM_CAP_BYTES) -> Calibration:
    """Count one CUDA out-of-memory while serving and raise the setup's extra headroom by a step
    (at most `cap_bytes`); returns what the next plan of `key` will load."""
    def count_one(entry: dict[str, Any]) -> dict[str, Any]:
        count = int(entry.get("runtime_oom_count", 0)) + 1
        return {**entry, "runtime_oom_count": count, "extra_headroom_bytes": min(step_bytes * count, cap_bytes)}

    entry = _update(state_dir, key, count_one)
    return Calibration(extra_headroom_bytes=int(entry["extra_headroom_bytes"]), key=key)


# --------------------------------------------------------------------------- reading


def _read(dir_fd: int, where: Path) -> _Document:
    """The file in `dir_fd`, validated; a missing file is an empty document."""
    try:
        raw = read_bounded(FILE_NAME, dir_fd=dir_fd, where=where, limit=MAX_FILE_BYTES)
    except OSError as exc:
        return _Document(problems=[f"ignored: {_why(exc)}"], corrupt=True)
    return _Document() if raw is None else _parse(raw)


def _parse(raw: bytes) -> _Document:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _Document(problems=["ignored: not UTF-8 text"], corrupt=True)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; nesting too deep
        return _Document(problems=[f"ignored: not JSON ({str(exc)[:80] or type(exc).__name__})"], corrupt=True)
    if not isinstance(data, dict):
        return _Document(problems=[f"ignored: a JSON {type(data).__name__}, not an object"], corrupt=True)
    schema = data.get("schema")
    if schema != SCHEMA:
        if isinstance(schema, str) and schema.startswith(SCHEMA_FAMILY) and len(schema) < 64:
            return _Document(problems=[f"schema {schema!r} is not {SCHEMA!r} (another safe-serve version's "
                                       "file): not used, kept as it is"], foreign_schema=schema)
        return _Document(problems=[f"ignored: schema {str(schema)[:40]!r}, not {SCHEMA!r}"], corrupt=True)
    entries = data.get("entries", {})
    if not isinstance(entries, dict):
        return _Document(problems=[f"ignored: entries is a JSON {type(entries).__name__}, not an object"],
                         corrupt=True)
    doc = _Document(extra={k: v for k, v in data.items() if k not in ("schema", "entries")})
    for key, entry in entries.items():
        checked = _entry(key, entry, doc.problems)
        if checked is not None:
            doc.entries[key] = checked
    return doc


def _entry(key: str, entry: object, problems: list[str]) -> dict[str, Any] | None:
    """The entry with every figure checked; bad figures dropped, each with a problem."""
    if len(key) > MAX_KEY_CHARS:
        problems.append(f"an entry key of {len(key)} characters ignored")
        return None
    if not isinstance(entry, dict):
        problems.append(f"entry {_short(key)} ignored: a JSON {type(entry).__name__}, not an object")
        return None
    checked: dict[str, Any] = {}
    for name, value in entry.items():
        bounds = FIELDS.get(name)
        if bounds is None:
            checked[name] = value  # a field of a later minor revision: kept, never used
        elif not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"entry {_short(key)}: {name} {_shown(value)} is not a whole number; ignored")
        elif not bounds[0] <= value <= bounds[1]:
            problems.append(f"entry {_short(key)}: {name} {value} is outside {bounds[0]}..{bounds[1]}; ignored")
        else:
            checked[name] = value
    return checked


def _short(key: str) -> str:
    return repr(key if len(key) <= 80 else key[:77] + "...")


def _shown(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _summary(problems: Sequence[str]) -> str:
    return problems[0] if len(problems) == 1 else f"{problems[0]} (and {len(problems) - 1} more problems)"


def _why(exc: OSError) -> str:
    return str(exc) if isinstance(exc, UnsafeFile) else f"{exc.strerror or exc}"


# --------------------------------------------------------------------------- writing


def _update(state_dir: Path, key: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Apply `change` to the entry of `key` under the lock; returns the entry as written.

    Raises:
        OSError: the state directory or file cannot be used, or another version's file is
            there (`CalibrationNotSaved`, `UnsafeFile`); nothing is left behind.
    """
    if len(key) > MAX_KEY_CHARS:
        raise CalibrationNotSaved(f"a calibration key of {len(key)} characters")
    try:
        dir_fd = open_dir(state_dir, create_mode=0o755, parents=True)
    except OSError as exc:
        raise CalibrationNotSaved(f"{state_dir}: {_why(exc)}") from None
    try:
        with _locked(dir_fd, state_dir):
            doc = _read(dir_fd, state_dir)
            if doc.foreign_schema:
                raise CalibrationNotSaved(f"{state_dir / FILE_NAME} has schema {doc.foreign_schema!r} (another "
                                          "safe-serve version's): kept as it is, this measurement not saved")
            if doc.corrupt:
                _set_aside(dir_fd)
            entry = {**change(doc.entries.get(key, {})), "recorded_at": int(time.time())}
            doc.entries[key] = entry
            atomic_write(dir_fd, FILE_NAME, _serialize(doc, keep_first=key), mode=0o644)
            return entry
    finally:
        os.close(dir_fd)


def _set_aside(dir_fd: int) -> None:
    """A damaged file is kept for a look (one copy), then replaced."""
    with contextlib.suppress(OSError):
        os.replace(FILE_NAME, FILE_NAME + ".corrupt", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _serialize(doc: _Document, *, keep_first: str) -> bytes:
    """The document as JSON, the oldest entries dropped beyond `MAX_ENTRIES` or `MAX_FILE_BYTES`
    (never `keep_first`, the entry just written: recorded_at has whole seconds, so ties happen)."""
    entries = dict(sorted(doc.entries.items(), key=lambda item: (item[0] == keep_first,
                                                                 item[1].get("recorded_at", 0)), reverse=True))
    keep = list(entries)[:MAX_ENTRIES]
    while True:
        data = {**doc.extra, "schema": SCHEMA, "entries": {k: entries[k] for k in sorted(keep)}}
        text = json.dumps(data, indent=2, sort_keys=True).encode()
        if len(text) <= MAX_FILE_BYTES or len(keep) <= 1:
            return text
        keep = keep[:max(1, len(keep) * 3 // 4)]


@contextlib.contextmanager
def _locked(dir_fd: int, where: Path) -> Iterator[None]:
    """Hold `.calibration.lock` (flock) in the state directory, waiting at most `LOCK_WAIT_S`."""
    fd = open_regular(LOCK_NAME, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, where=where, mode=0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CalibrationNotSaved(f"{where / LOCK_NAME} held by another start for "
                                              f"{LOCK_WAIT_S:g} s") from None
                time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock
