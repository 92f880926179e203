"""Running instances, visible: each `serve` keeps a small status file in the state directory
(<state>/instances/<name>.json) that `safe-serve ps` lists and `safe-serve status NAME` shows.

The directory is shared (a root service beside users' manual runs), so a file is written to a
temporary name and renamed into place (never half-written, never through a link), read without
following links, size-bounded and validated field by field before anything of it is shown; a
file whose process is gone (dead pid, or a pid reused by another process) is ignored and removed.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

STATUS_SCHEMA = "safe-serve.status/1"
PS_SCHEMA = "safe-serve.ps/1"
MAX_STATUS_BYTES = 64 * 1024
STATES = ("starting", "retuning", "serving", "stopping")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# field -> accepted JSON types (bool is not an int here)
_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (str,), "name": (str,), "model": (str,), "engine": (str,), "engine_version": (str, type(None)),
    "gpus": (list,), "host": (str,), "port": (int,), "pid": (int,), "pid_started": (float, int),
    "planned_kv_tokens": (int,), "engine_kv_tokens": (int, type(None)), "memory_knob": (str,),
    "retunes": (int,), "state": (str,), "engine_phase": (str,), "since": (str,), "started": (str,),
}


def instances_dir(state: Path) -> Path:
    return state / "instances"


def instance_name(model: str, port: int) -> str:
    """`qwen2.5-7b-instruct-8000`: the model's last path part, lower-cased, and the port."""
    base = re.sub(r"[^a-z0-9._-]+", "-", model.rstrip("/").split("/")[-1].lower()).strip("-.") or "model"
    return f"{base[:100]}-{port}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def process_started(pid: int) -> float | None:
    """When `pid` started (psutil), to tell our process from a later one with the same pid."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


# --------------------------------------------------------------------------- writing


def _private_dir(directory: Path) -> Path:
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):  # a link planted where the directory should be
        raise OSError(errno.ENOTDIR, "not a directory (a link?)", str(directory))
    return directory


def write_status(state: Path, status: Mapping[str, Any]) -> Path:
    """Write `status` atomically as <state>/instances/<name>.json (temp file in the same directory,
    then rename: readers see the old file or the new one, and the name is never followed as a link)."""
    directory = _private_dir(instances_dir(state))
    target = directory / f"{status['name']}.json"
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{status['name']}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # no secrets in it; ps by other users can read it
            json.dump(dict(status), handle, indent=1, sort_keys=True)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return target


def remove_status(state: Path, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(instances_dir(state) / f"{name}.json")


# --------------------------------------------------------------------------- reading


def _read_nofollow(path: Path) -> bytes | None:
    """The file's bytes, or None if it is a link, not a regular file, too large or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_STATUS_BYTES:
            return None
        return os.read(fd, MAX_STATUS_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def validate(doc: object) -> dict[str, Any] | None:
    """The status document if every field has its type and sane value, else None (never trusted half)."""
    if not isinstance(doc, dict) or doc.get("schema") != STATUS_SCHEMA:
        return None
    for field, types in _FIELDS.items():
        value = doc.get(field)
        if isinstance(value, bool) or not isinstance(value, types):
            return None
    if not _NAME.match(doc["name"]) or doc["state"] not in STATES or doc["pid"] <= 0 or \
            not 0 < doc["port"] < 65536 or not all(isinstance(g, str) for g in doc["gpus"]):
        return None
    return {field: doc[field] for field in _FIELDS}  # nothing beyond the known fields


def _alive(status: Mapping[str, Any]) -> bool:
    started = process_started(int(status["pid"]))
    return started is not None and abs(started - float(status["pid_started"])) < 2.0


def running(state: Path, *, clean: bool = True) -> Iterator[dict[str, Any]]:
    """The valid status files of live instances, by name; stale ones (dead pid) are removed."""
    directory = instances_dir(state)
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return
    for entry in entries:
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = directory / entry
        raw = _read_nofollow(path)
        try:
            status = validate(json.loads(raw)) if raw is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past Python's stack
            status = None
        if status is None or status["name"] + ".json" != entry:
            continue  # not ours to trust, and not ours to delete either
        if not _alive(status):
            if clean:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            continue
        yield status
