"""Running instances visible: status files written safely, validated before trusted, stale ones cleaned;
`safe-serve ps` / `status NAME` against a real serve on the stand-in engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from launcher.serve.instances import (
    STATUS_SCHEMA,
    instance_name,
    instances_dir,
    process_started,
    running,
    validate,
    write_status,
)
from tests.test_serve_standin import VLLM, Served, nvml_stub, plan_json, serve, vllm_agrees  # noqa: F401

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


def status_doc(name: str = "qwen-8000", pid: int | None = None, **changes: Any) -> dict[str, Any]:
    pid = pid or os.getpid()
    return {"schema": STATUS_SCHEMA, "name": name, "model": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm",
            "engine_version": "0.32.0", "gpus": ["GPU-1"], "host": "127.0.0.1", "port": 8000, "pid": pid,
            "pid_started": process_started(pid) or 0.0, "planned_kv_tokens": 100, "engine_kv_tokens": None,
            "memory_knob": "--gpu-memory-utilization 0.92", "retunes": 0, "state": "starting",
            "engine_phase": "starting", "since": "2026-01-01T00:00:00+00:00",
            "started": "2026-01-01T00:00:00+00:00", **changes}


def cli(*argv: str, state: Path) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SAFE_SERVE_STATE_DIR": str(state)})
    return proc.returncode, proc.stdout, proc.stderr


def test_name_from_model_and_port() -> None:
    assert instance_name("Qwen/Qwen2.5-7B-Instruct", 8000) == "qwen2.5-7b-instruct-8000"
    assert instance_name("/srv/models/My Model/", 30000) == "my-model-30000"


def test_live_listed_stale_removed_bad_ignored(tmp_path: Path) -> None:
    write_status(tmp_path, status_doc())
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_status(tmp_path, status_doc("dead-8001", pid=dead.pid, pid_started=1.0))
    reused = status_doc("reused-8002", pid_started=1.0)  # our pid, another start time: a reused pid
    write_status(tmp_path, reused)
    directory = instances_dir(tmp_path)
    (directory / "evil-8003.json").write_text(json.dumps(status_doc("evil-8003", port=0)))  # invalid: kept, ignored
    (directory / "other.json").write_text(json.dumps(status_doc("not-its-name")))  # name/file mismatch
    os.symlink("/etc/passwd", directory / "link-8004.json")  # a planted link is never followed
    (directory / "deep-8005.json").write_text("[" * 5_000)  # nested past Python's stack: RecursionError
    names = [s["name"] for s in running(tmp_path)]
    assert names == ["qwen-8000"]
    left = sorted(os.listdir(directory))
    assert "dead-8001.json" not in left and "reused-8002.json" not in left
    assert {"evil-8003.json", "other.json", "link-8004.json", "deep-8005.json"} <= set(left)


def test_validation_is_field_by_field() -> None:
    assert validate(status_doc()) is not None
    assert validate({**status_doc(), "pid": True}) is None
    assert validate({**status_doc(), "state": "hacked"}) is None
    assert validate({**status_doc(), "name": "../../etc/x"}) is None
    assert "extra" not in (validate({**status_doc(), "extra": "x"}) or {})


def test_write_is_atomic_and_refuses_a_linked_directory(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, tmp_path / "instances")
    with pytest.raises(OSError):
        write_status(tmp_path, status_doc())
    assert list(target.iterdir()) == []


def test_ps_and_status_commands(tmp_path: Path) -> None:
    write_status(tmp_path, status_doc(engine_kv_tokens=98, state="serving"))
    code, out, _ = cli("ps", state=tmp_path)
    assert code == 0 and "qwen-8000" in out and "98/100" in out and "serving" in out
    code, out, _ = cli("ps", "--json", state=tmp_path)
    jsonschema.validate(json.loads(out), json.loads((SCHEMAS / "ps.schema.json").read_text()))
    code, out, _ = cli("status", "qwen", "--json", state=tmp_path)  # a unique prefix
    assert code == 0 and json.loads(out)["engine_kv_tokens"] == 98
    code, out, err = cli("status", "nope", "--json", state=tmp_path)
    assert code == 66 and json.loads(out)["schema"] == "safe-serve.error/1" and "qwen-8000" in err


def test_status_of_a_prefix_of_two_names_is_a_usage_error_naming_both(tmp_path: Path) -> None:
    write_status(tmp_path, status_doc(name="qwen-8000"))
    write_status(tmp_path, status_doc(name="qwen-8001", port=8001))
    code, _, err = cli("status", "q", state=tmp_path)
    assert code == 2 and "'q' matches 2 running instances: qwen-8000, qwen-8001" in err
    code, out, _ = cli("status", "qwen-8001", "--json", state=tmp_path)  # the whole name still picks one
    assert code == 0 and json.loads(out)["port"] == 8001


def test_ps_and_status_print_a_hostile_model_path_escaped(tmp_path: Path) -> None:
    """A model directory named with a newline and terminal escapes (served as ./NAME) was printed raw by
    `ps` and `status`: it could forge a row or repaint the terminal. Escaped as the plan prints it;
    the JSON keeps the real name."""
    model = "./evil\n\x1b]0;owned\x07\x1b[2J"
    write_status(tmp_path, status_doc(model=model, memory_knob="--gpu-memory-utilization 0.9\x1b[1A"))
    for argv in (("ps",), ("status", "qwen-8000")):
        code, out, _ = cli(*argv, state=tmp_path)
        assert code == 0 and "\x1b" not in out and "\x07" not in out, out
        assert "./evil\\n\\x1b]0;owned\\x07\\x1b[2J" in out
    assert len(cli("ps", state=tmp_path)[1].splitlines()) == 2  # the header and one row
    assert json.loads(cli("ps", "--json", state=tmp_path)[1])["instances"][0]["model"] == model
    write_status(tmp_path, status_doc(memory_knob=""))  # valid by type: was an IndexError, exit 1
    code, out, _ = cli("ps", state=tmp_path)
    assert code == 0 and out.splitlines()[1].split()[8] == "-"  # after "vllm 0.32.0", GPUS, PORT, PID, KV


def test_a_running_serve_is_listed_then_gone(serve: Callable[..., Served]) -> None:  # noqa: F811
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets=vllm_agrees(plan), options=("--name", "chat"))
    served.wait_ready()
    code, out, _ = cli("status", "chat", "--json", state=served.state)
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((SCHEMAS / "status.schema.json").read_text()))
    assert code == 0 and doc["state"] == "serving" and doc["pid"] == served.proc.pid and doc["port"] == served.port
    assert doc["engine_kv_tokens"] == doc["planned_kv_tokens"] == plan["kv_cache_tokens"]
    assert served.stop() == 0
    code, out, _ = cli("ps", "--json", state=served.state)
    assert json.loads(out)["instances"] == [] and not (instances_dir(served.state) / "chat.json").exists()


def _status_while_stopping(served: Served, name: str) -> dict[str, Any]:
    """`status NAME --json` polled until it says `stopping` (the stand-in takes 3 s to exit)."""
    seen: list[dict[str, Any]] = []

    def stopping() -> bool:
        code, out, _ = cli("status", name, "--json", state=served.state)
        if code == 0:
            seen.append(json.loads(out))
        return bool(seen) and seen[-1]["state"] == "stopping"

    served.wait_for(stopping, timeout=10)
    return seen[-1]


def test_a_signalled_stop_is_stopping_until_the_engine_exits(serve: Callable[..., Served]) -> None:  # noqa: F811
    """SIGTERM to safe-serve: while the engine takes its time to exit, `status` says `stopping`; then no file."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets={**vllm_agrees(plan), "sigterm_exit_delay": 3}, options=("--name", "chat"))
    served.wait_ready()
    served.proc.send_signal(signal.SIGTERM)
    doc = _status_while_stopping(served, "chat")
    jsonschema.validate(doc, json.loads((SCHEMAS / "status.schema.json").read_text()))
    assert doc["pid"] == served.proc.pid and served.proc.poll() is None  # still running: the engine is stopping
    assert doc["engine_kv_tokens"] == plan["kv_cache_tokens"]
    assert served.wait() == 0, served.tail()
    assert not (instances_dir(served.state) / "chat.json").exists()
    assert cli("status", "chat", "--json", state=served.state)[0] == 66
    assert served.event("exit")["level"] == "info"  # the exit event's level follows the outcome


def test_an_aborted_start_is_stopping_until_the_engine_exits(serve: Callable[..., Served]) -> None:  # noqa: F811
    """--on-divergence abort: the stop safe-serve asks for itself is `stopping` too, then exit 78 and no file."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    fewer = {**vllm_agrees(plan), "vllm.kv_bytes": int(plan["kv_cache_bytes"] * 0.8), "sigterm_exit_delay": 3}
    served = serve(VLLM, sets=fewer, options=("--name", "chat", "--on-divergence", "abort"))
    doc = _status_while_stopping(served, "chat")
    assert doc["state"] == "stopping" and doc["engine_phase"] == "KV cache sized" and served.proc.poll() is None
    assert served.wait() == 78, served.tail()
    assert not (instances_dir(served.state) / "chat.json").exists()
    assert served.event("exit")["level"] == "error"  # journald: priority 3 (err), not 6
