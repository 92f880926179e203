"""Hostile input, part 2: the calibration file is state anyone may have damaged.

Bad files and bad entries are ignored with one warning (never exit 1, never a stopped engine),
absurd figures are not trusted, concurrent writers lose nothing, a full disk leaves nothing
behind, and another version's file is neither used nor overwritten.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.common.units import GiB
from launcher.plan import calibration
from launcher.plan.calibration import (
    FIELDS,
    FILE_NAME,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    RUNTIME_OOM_STEP_BYTES,
    SCHEMA,
    load,
    read_calibration,
    record,
    record_runtime_oom,
)
from launcher.plan.planner import make_plan
from launcher.plan.request import PlanOptions, build_request, calibration_key_for
from launcher.plan.types import Calibration
from tests.hostile import NOBODY, needs_root, shared_dir, small_tmpfs_command

REPO = Path(__file__).resolve().parent.parent
# vLLM 0.33: the last release whose KV cache is the request less the non-KV figure a calibration holds
# (0.34's extensible KV cache uses none: tests/engines/vllm/test_extensible_kv_cache.py).
OPTIONS = PlanOptions(model="qwen2.5-7b", gpu_specs=("rtx4090",), engine_version="0.33.0")


def _key_and_request(state: Path) -> tuple[str, Any]:
    env = {"SAFE_SERVE_STATE_DIR": str(state)}
    request = build_request(OPTIONS, env)
    key = calibration_key_for(OPTIONS.engine, request.engine_version, request.gpus, request.model.name,
                              request.pinned)
    return key, env


def _write(state: Path, doc: object) -> None:
    state.mkdir(exist_ok=True)
    (state / FILE_NAME).write_text(json.dumps(doc))


def _plan(env: dict[str, str]) -> Any:
    return make_plan(build_request(OPTIONS, env))


class TestFiguresAreChecked:
    def test_negative_non_kv_bytes_is_not_trusted(self, tmp_path: Path) -> None:
        """Before: -40 GiB of non-KV memory planned 61.6 GiB of KV on a 24 GiB card."""
        key, env = _key_and_request(tmp_path)
        plain = _plan(env)
        _write(tmp_path, {"schema": SCHEMA, "entries": {key: {"non_kv_bytes": -40 * GiB}}})
        plan = _plan(env)
        assert plan.kv_cache_bytes == plain.kv_cache_bytes < 24 * GiB
        [warning] = [w for w in plan.warnings if "calibration" in w]
        assert "non_kv_bytes -42949672960 is outside" in warning

    def test_figure_above_the_device_memory_is_not_trusted(self, tmp_path: Path) -> None:
        key, env = _key_and_request(tmp_path)
        _write(tmp_path, {"schema": SCHEMA, "entries": {key: {"non_kv_bytes": 100 * GiB}}})
        plan = _plan(env)
        assert plan.item("kv").source != "calibrated"
        assert any("is more than the device's" in w for w in plan.warnings)

    @pytest.mark.parametrize("value", ["5368709120", 5.5 * GiB, True, None, [1], {"a": 1}])
    def test_wrong_type_is_ignored_with_a_warning(self, tmp_path: Path, value: object) -> None:
        """Before: a string reached the planner (TypeError, exit 1); a float or bool was used as bytes."""
        key, env = _key_and_request(tmp_path)
        plain = _plan(env)
        _write(tmp_path, {"schema": SCHEMA, "entries": {key: {"non_kv_bytes": value}}})
        plan = _plan(env)
        assert plan.kv_cache_bytes == plain.kv_cache_bytes
        assert 1 == sum("is not a whole number" in w for w in plan.warnings)

    def test_valid_entry_is_still_used(self, tmp_path: Path) -> None:
        key, env = _key_and_request(tmp_path)
        _write(tmp_path, {"schema": SCHEMA, "entries": {key: {"non_kv_bytes": 16 * GiB}, "other": 7}})
        plan = _plan(env)
        assert plan.kv_cache_bytes == plan.item("requested").bytes - 16 * GiB
        assert any("entry 'other' ignored: a JSON int, not an object" in w for w in plan.warnings)


_BAD_FILES: dict[str, bytes] = {
    "invalid-utf8": b'{"schema": "safe-serve.calibration/1", "entries": {"\xff\xfe": {}}}',
    "entries-list": json.dumps({"schema": SCHEMA, "entries": []}).encode(),
    "deep-nesting": b"[" * 200_000 + b"]" * 200_000,
    "deep-nesting-object": b'{"schema": "safe-serve.calibration/1", "entries": {"k": ' + b'{"a":' * 50_000
    + b"1" + b"}" * 50_001 + b"}",
    "not-an-object": b"[1, 2, 3]",
    "truncated": b'{"schema": "safe-serve.calibration/1", "entr',
    "too-large": b" " * (MAX_FILE_BYTES + 1) + b"{}",
}


@pytest.mark.parametrize("name", sorted(_BAD_FILES))
def test_bad_file_is_one_warning_not_exit_1(tmp_path: Path, name: str) -> None:
    """Before: every `plan` and `serve` exited 1 until someone edited the file (a crash loop)."""
    (tmp_path / FILE_NAME).write_bytes(_BAD_FILES[name])
    env = {**os.environ, "SAFE_SERVE_STATE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "launcher", "plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert 0 == result.returncode, result.stderr
    warnings = [w for w in json.loads(result.stdout)["warnings"] if "calibration" in w]
    assert 1 == len(warnings) and "ignored" in warnings[0], warnings


@pytest.mark.parametrize("name", sorted(_BAD_FILES))
def test_record_over_a_bad_file_keeps_a_copy_and_writes_a_good_one(tmp_path: Path, name: str) -> None:
    (tmp_path / FILE_NAME).write_bytes(_BAD_FILES[name])
    record(tmp_path, "k", Calibration(non_kv_bytes=5))
    assert Calibration(non_kv_bytes=5, key="k") == load(tmp_path, "k")
    assert _BAD_FILES[name] == (tmp_path / (FILE_NAME + ".corrupt")).read_bytes()


class TestEntryNotAnObject:
    @pytest.mark.parametrize("entry", [5, "x", [], None])
    def test_runtime_oom_over_a_bad_entry(self, tmp_path: Path, entry: object) -> None:
        """Before: AttributeError inside the watch loop's callback stopped a healthy engine."""
        _write(tmp_path, {"schema": SCHEMA, "entries": {"k": entry}})
        assert RUNTIME_OOM_STEP_BYTES == record_runtime_oom(tmp_path, "k").extra_headroom_bytes

    @pytest.mark.parametrize("entry", [5, "x", [1, 2]])
    def test_measurement_over_a_bad_entry(self, tmp_path: Path, entry: object) -> None:
        _write(tmp_path, {"schema": SCHEMA, "entries": {"k": entry, "good": {"non_kv_bytes": 9}}})
        record(tmp_path, "k", Calibration(non_kv_bytes=3))
        assert 3 == load(tmp_path, "k").non_kv_bytes and 9 == load(tmp_path, "good").non_kv_bytes

    def test_runtime_oom_count_of_the_wrong_type(self, tmp_path: Path) -> None:
        _write(tmp_path, {"schema": SCHEMA, "entries": {"k": {"runtime_oom_count": "9"}}})
        assert RUNTIME_OOM_STEP_BYTES == record_runtime_oom(tmp_path, "k").extra_headroom_bytes


class TestOtherSchemaVersions:
    def test_newer_schema_is_neither_used_nor_overwritten(self, tmp_path: Path) -> None:
        """Before: the next start replaced a newer safe-serve's file with its own."""
        newer = json.dumps({"schema": "safe-serve.calibration/2", "setups": [{"key": "k", "bytes": 1}]}).encode()
        (tmp_path / FILE_NAME).write_bytes(newer)
        found, warnings = read_calibration(tmp_path, "k")
        assert found is None and "another safe-serve version" in warnings[0]
        with pytest.raises(OSError, match="kept as it is, this measurement not saved"):
            record(tmp_path, "k", Calibration(non_kv_bytes=1))
        with pytest.raises(OSError, match="kept as it is"):
            record_runtime_oom(tmp_path, "k")
        assert newer == (tmp_path / FILE_NAME).read_bytes()
        assert [FILE_NAME, ".calibration.lock"] == sorted(os.listdir(tmp_path), reverse=True)

    def test_unknown_fields_and_keys_are_kept(self, tmp_path: Path) -> None:
        _write(tmp_path, {"schema": SCHEMA, "note": "by hand", "entries": {"k": {"future_field": [1]}}})
        record(tmp_path, "k", Calibration(non_kv_bytes=2))
        doc = json.loads((tmp_path / FILE_NAME).read_text())
        assert "by hand" == doc["note"] and [1] == doc["entries"]["k"]["future_field"]


class TestBounded:
    def test_entries_are_capped_oldest_first(self, tmp_path: Path) -> None:
        entries = {f"old-{i}": {"non_kv_bytes": i, "recorded_at": i} for i in range(MAX_ENTRIES)}
        _write(tmp_path, {"schema": SCHEMA, "entries": entries})
        record(tmp_path, "new", Calibration(non_kv_bytes=1))
        kept = json.loads((tmp_path / FILE_NAME).read_text())["entries"]
        assert MAX_ENTRIES == len(kept) and "new" in kept and "old-0" not in kept and "old-1" in kept

    def test_file_stays_under_its_size_limit(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(calibration, "MAX_FILE_BYTES", 4096)
        for i in range(200):
            record(tmp_path, f"setup {i:03}", Calibration(non_kv_bytes=i + 1))
        assert (tmp_path / FILE_NAME).stat().st_size <= 4096
        assert 200 == load(tmp_path, "setup 199").non_kv_bytes


class TestLinksAndOwners:
    def test_linked_file_is_not_read(self, tmp_path: Path) -> None:
        """Before: a link was followed and whatever it pointed at was read as calibration."""
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps({"schema": SCHEMA, "entries": {"k": {"non_kv_bytes": 1}}}))
        state = tmp_path / "state"
        state.mkdir()
        (state / FILE_NAME).symlink_to(elsewhere)
        found, warnings = read_calibration(state, "k")
        assert found is None and "is a symbolic link" in warnings[0]

    @needs_root
    def test_state_dir_another_user_controls_is_not_used(self, public_tmp: Path) -> None:
        planted = shared_dir(public_tmp, "state", mode=0o1777, uid=NOBODY)
        (planted / FILE_NAME).write_text(json.dumps({"schema": SCHEMA, "entries": {"k": {"non_kv_bytes": 1}}}))
        found, warnings = read_calibration(planted, "k")
        assert found is None and "world-writable and owned by another user" in warnings[0]
        with pytest.raises(OSError, match="world-writable and owned by another user"):
            record(planted, "k", Calibration(non_kv_bytes=2))

    def test_created_state_dir_is_0755(self, tmp_path: Path) -> None:
        old = os.umask(0o077)
        try:
            record(tmp_path / "a" / "state", "k", Calibration(non_kv_bytes=1))
        finally:
            os.umask(old)
        assert 0o755 == (tmp_path / "a" / "state").stat().st_mode & 0o7777


def _writer(state: str, name: str, rounds: int, barrier: Any) -> None:
    for round_ in range(rounds):
        barrier.wait()
        record(Path(state), f"{name} round {round_}", Calibration(non_kv_bytes=round_ + 1))
        barrier.wait()


def test_eight_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    """Before: 8 template units sharing one StateDirectory lost entries in 3 of 5 rounds."""
    writers, rounds = 8, 5
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(writers)
    procs = [context.Process(target=_writer, args=(str(tmp_path), f"unit@{i}", rounds, barrier))
             for i in range(writers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert all(proc.exitcode == 0 for proc in procs)
    entries = json.loads((tmp_path / FILE_NAME).read_text())["entries"]
    assert writers * rounds == len(entries)
    assert all(load(tmp_path, f"unit@{i} round {r}").non_kv_bytes == r + 1
               for i in range(writers) for r in range(rounds))
    assert sorted(os.listdir(tmp_path)) == [".calibration.lock", FILE_NAME]


def test_full_disk_leaves_the_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every start on a full disk left a `.calibration.*` temporary behind."""
    record(tmp_path, "k", Calibration(non_kv_bytes=1))
    before = (tmp_path / FILE_NAME).read_bytes()

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        record(tmp_path, "k2", Calibration(non_kv_bytes=2))
    monkeypatch.undo()
    assert before == (tmp_path / FILE_NAME).read_bytes()
    assert sorted(os.listdir(tmp_path)) == [".calibration.lock", FILE_NAME]


_FILL_AND_RECORD = """
import os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from launcher.plan.calibration import record, load
from launcher.plan.types import Calibration
disk = Path({disk!r})
record(disk, "k", Calibration(non_kv_bytes=1))
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 512)
except OSError:
    os.close(fd)
try:
    record(disk, "k2", Calibration(non_kv_bytes=2))
except OSError as exc:
    print("not saved:", exc)
print(sorted(os.listdir(disk)), load(disk, "k").non_kv_bytes)
"""


def test_real_full_disk(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    command = small_tmpfs_command(64, disk, [sys.executable, "-c", _FILL_AND_RECORD.format(repo=str(REPO),
                                                                                           disk=str(disk))])
    if command is None:
        pytest.skip("no private tmpfs here (needs root and unshare); the simulated ENOSPC test covers it")
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert 0 == result.returncode, result.stderr
    lines = result.stdout.strip().splitlines()
    assert "No space left on device" in lines[0]
    assert "['.calibration.lock', 'calibration.json', 'filler'] 1" == lines[-1]


# --------------------------------------------------------------------------- any file at all

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=20)
_field_values = st.one_of(st.integers(min_value=-(1 << 62), max_value=1 << 62), _json)
_entry = st.dictionaries(st.sampled_from([*FIELDS, "other"]), _field_values, max_size=5) | _json
_documents = st.fixed_dictionaries({"schema": st.sampled_from([SCHEMA, "safe-serve.calibration/9", 3, None]),
                                    "entries": st.dictionaries(st.sampled_from(["k", "j"]), _entry, max_size=2)
                                    | _json}) | _json
_contents = st.one_of(_documents.map(lambda doc: json.dumps(doc).encode()), st.binary(max_size=200))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=_contents)
def test_any_file_is_read_safely_and_recorded_over(tmp_path: Path, content: bytes) -> None:
    """Whatever the file holds: load gives a checked figure or nothing, with at most one warning;
    a record either saves (the file is then valid) or says why (another version's file)."""
    (tmp_path / FILE_NAME).write_bytes(content)
    found, warnings = read_calibration(tmp_path, "k", max_bytes=80 * GiB)
    assert len(warnings) <= 1
    if found is not None:
        for name in ("non_kv_bytes", "load_overhead_bytes", "extra_headroom_bytes"):
            value = getattr(found, name)
            assert value is None or (type(value) is int and FIELDS[name][0] <= value <= min(FIELDS[name][1], 80 * GiB))
    try:
        record(tmp_path, "k", Calibration(non_kv_bytes=7))
    except OSError as exc:
        assert "another safe-serve version" in str(exc)
        assert content == (tmp_path / FILE_NAME).read_bytes()
    else:
        doc = json.loads((tmp_path / FILE_NAME).read_bytes())
        assert SCHEMA == doc["schema"] and 7 == doc["entries"]["k"]["non_kv_bytes"]
        assert 7 == read_calibration(tmp_path, "k")[0].non_kv_bytes
    (tmp_path / (FILE_NAME + ".corrupt")).unlink(missing_ok=True)
