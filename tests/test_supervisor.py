"""The Supervisor loop against real processes: the stand-in engine and a driver.

Most tests run the supervisor in a *driver* subprocess (this file run as a script, see
``_driver`` at the bottom), so that real signals can be sent to it and it can be SIGKILLed.
The driver's stdout/stderr are files, compared byte for byte with what the stand-in recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this file also runs as the driver script (see _driver)
    sys.path.insert(0, str(REPO))

from launcher.common.errors import ExitCode  # noqa: E402
from launcher.supervise import (  # noqa: E402
    EngineCommand,
    EngineSpawnError,
    HealthCheck,
    Supervisor,
    SupervisorOptions,
)

STANDIN = REPO / "tests" / "standin_engine.py"

# Lines quoted in /work/shared/reference/vllm-memory.md (§1 table and rendered examples, §7, §8)
# and uvicorn's own startup/shutdown lines; the lead adds full real logs from startup-logs.yaml.
VLLM_SERVER = "Starting vLLM server on http://0.0.0.0:${port}"
VLLM_KV = "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x"
VLLM_FREE_MEMORY = (
    "Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU memory utilization "
    "(0.8, 12.39 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
VLLM_CORE_FAILED = "EngineCore failed to start."
UVICORN_START = [
    "INFO:     Started server process [${pid}]",
    "INFO:     Waiting for application startup.",
    "INFO:     Application startup complete.",
]
UVICORN_STOP = [
    "INFO:     Shutting down",
    "INFO:     Waiting for application shutdown.",
    "INFO:     Application shutdown complete.",
    "INFO:     Finished server process [${pid}]",
]


def serving_steps(*, kv: bool = True) -> list[dict[str, Any]]:
    """Steps of a vLLM-like start that reaches serving: KV line (stdout), uvicorn (stderr), /health."""
    steps: list[dict[str, Any]] = [{"text": VLLM_KV, "delay": 0.05}] if kv else []
    steps.append({"text": VLLM_SERVER})
    steps += [{"text": line, "stream": "stderr"} for line in UVICORN_START]
    steps.append({"serve": True})
    return steps


def graceful(**extra: Any) -> dict[str, Any]:
    """Scenario keys of an engine that stops like uvicorn on SIGTERM."""
    return {
        "engine": "vllm",
        "shutdown_lines": [{"stream": "stderr", "text": line} for line in UVICORN_STOP],
        "sigterm_exit_delay": 0.1,
        **extra,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def normalized_lines(data: bytes) -> bytes:
    """What the on_line hook should have seen, each line re-terminated with ``\\n``."""
    return data if not data or data.endswith(b"\n") else data + b"\n"


class Engine:
    """Paths of one stand-in invocation: its scenario, record dir and pid file."""

    def __init__(self, tmp: Path, name: str, scenario: dict[str, Any], port: int | None = None) -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        self.scenario_path = self.dir / "scenario.json"
        self.scenario_path.write_text(json.dumps(scenario))
        self.record = self.dir / "record"
        self.pid_file = self.dir / "pids.json"
        self.env_file = self.dir / "env.json"
        self.port = port

    @property
    def argv(self) -> list[str]:
        argv = [sys.executable, str(STANDIN), "--scenario", str(self.scenario_path), "--record", str(self.record)]
        argv += ["--pid-file", str(self.pid_file), "--env-file", str(self.env_file)]
        return argv + (["--port", str(self.port)] if self.port else [])

    def pids(self) -> dict[str, Any]:
        """The pids the stand-in wrote: engine, grandchild, orphans."""
        pids: dict[str, Any] = wait_for(lambda: self.pid_file.exists() and json.loads(self.pid_file.read_text()),
                                        what="pid file")
        return pids

    def recorded(self, stream: str) -> bytes:
        path = self.record / f"{stream}.bin"
        return path.read_bytes() if path.exists() else b""


class Driver:
    """The supervisor in a subprocess (this file as a script) with files for its output."""

    def __init__(self, tmp: Path, engine: Engine, env: dict[str, str] | None = None, **config: Any) -> None:
        self.tmp = tmp
        self.result_path = tmp / "result.json"
        self.log_path = tmp / "supervisor.log"
        self.stdout_path, self.stderr_path = tmp / "driver.stdout", tmp / "driver.stderr"
        config = {"argv": engine.argv, "result": str(self.result_path), "log": str(self.log_path), **config}
        if engine.port and "health_port" not in config:
            config["health_port"] = engine.port
        (tmp / "driver.json").write_text(json.dumps(config))
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(tmp / "driver.json")],
                stdout=out,
                stderr=err,
                env={**os.environ, **(env or {})},
            )

    def wait(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def result(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.result_path.read_text())
        return result

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr(self) -> bytes:
        return self.stderr_path.read_bytes()


@pytest.fixture(autouse=True)
def _no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test talks to a real systemd or inherits a watchdog."""
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(key, raising=False)


# --------------------------------------------------------------------------- pass-through


class TestPassThrough:
    def test_output_is_byte_exact_and_every_line_reaches_the_hook(self, tmp_path: Path) -> None:
        """Invalid UTF-8, CRLF, a 4 MiB line written in slow pieces and an unterminated last line
        come out unchanged per stream, and the hook sees each line once."""
        scenario = graceful(
            steps=[
                {"text": VLLM_KV},
                {"raw_hex": "ff fe c3 28 80 0a", "stream": "stdout"},
                {"raw_hex": "e2 82 0d 0a", "stream": "stderr"},
                {"text": UVICORN_START[0], "stream": "stderr"},
                {"long_line": 4 << 20, "chunk": 65536, "pause": 0.002, "stream": "stdout"},
                {"text": VLLM_SERVER},
                {"partial": "last words without newline", "stream": "stderr"},
                {"exit": 0},
            ]
        )
        engine = Engine(tmp_path, "engine", scenario)
        driver = Driver(tmp_path, engine)
        assert 70 == driver.wait()  # the engine stopped by itself: a failure, whatever its code
        result = driver.result()
        for stream, captured in (("stdout", driver.stdout()), ("stderr", driver.stderr())):
            emitted = engine.recorded(stream)
            assert emitted == captured
            assert normalized_lines(emitted).count(b"\n") == result["lines"][stream]["count"]
            assert hashlib.sha256(normalized_lines(emitted)).hexdigest() == result["lines"][stream]["sha256"]
        assert result["lines"]["stdout"]["longest"] == 4 << 20
        assert (result["outcome"]["exit_code"], result["outcome"]["engine_returncode"]) == (70, 0)

    def test_line_filter_passes_everything_but_hands_over_only_matches(self, tmp_path: Path) -> None:
        """With line_filter the flood still passes byte for byte but the hook sees only the KV line."""
        steps = [{"flood": 50_000}, {"text": VLLM_KV}, {"flood": 50_000}, {"exit": 0}]
        engine = Engine(tmp_path, "engine", graceful(steps=steps))
        driver = Driver(tmp_path, engine, line_filter=["KV cache"])
        assert 70 == driver.wait(60)
        assert engine.recorded("stdout") == driver.stdout()
        stdout_seen = driver.result()["lines"]["stdout"]
        expected = (1, hashlib.sha256(VLLM_KV.encode() + b"\n").hexdigest())
        assert expected == (stdout_seen["count"], stdout_seen["sha256"])

    def test_unterminated_output_is_flushed_while_the_engine_runs(self, tmp_path: Path, cleanup: list[int]) -> None:
        """Text without a newline (a progress bar) shows up within a fraction of a second, not at EOF."""
        engine = Engine(tmp_path, "engine", graceful(steps=[{"partial": VLLM_SERVER}, {"hang": True}]))
        driver = Driver(tmp_path, engine)
        cleanup.append(driver.proc.pid)
        wait_for(lambda: driver.stdout() == engine.recorded("stdout") != b"", 3.0, "partial line on our stdout")
        assert driver.proc.poll() is None
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()

    def test_flood_loses_and_reorders_nothing(self, tmp_path: Path) -> None:
        """200,000 lines on stdout interleaved with stderr lines all pass, in order, to output and hook."""
        scenario = graceful(
            steps=[
                {"flood": 100_000, "width": 120},
                {"text": UVICORN_START[0], "stream": "stderr"},
                {"flood": 100_000, "width": 120},
                {"text": UVICORN_START[1], "stream": "stderr"},
                {"exit": 0},
            ]
        )
        engine = Engine(tmp_path, "engine", scenario)
        driver = Driver(tmp_path, engine)
        assert 70 == driver.wait(60)
        result = driver.result()
        assert engine.recorded("stdout") == driver.stdout()
        assert 200_000 == result["lines"]["stdout"]["count"]
        assert hashlib.sha256(engine.recorded("stdout")).hexdigest() == result["lines"]["stdout"]["sha256"]
        assert 2 == result["lines"]["stderr"]["count"]


# --------------------------------------------------------------------------- signals


class TestSignals:
    def _serving(self, tmp_path: Path, cleanup: list[int]) -> tuple[Engine, Driver, dict[str, Any]]:
        engine = Engine(tmp_path, "engine", graceful(grandchild=True, steps=serving_steps()), port=free_port())
        driver = Driver(tmp_path, engine, grace_s=30.0)
        pids = engine.pids()
        cleanup += [pids["engine"], pids["grandchild"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="uvicorn startup line")
        return engine, driver, pids

    def test_sigterm_stops_the_engine_and_its_whole_group(self, tmp_path: Path, cleanup: list[int]) -> None:
        """SIGTERM is forwarded to the engine's group; the engine exits 0, we exit 0, nothing is left."""
        engine, driver, pids = self._serving(tmp_path, cleanup)
        started = time.monotonic()
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        assert time.monotonic() - started < 10
        assert gone(pids["engine"]) and gone(pids["grandchild"])
        result = driver.result()["outcome"]
        assert 0 == result["engine_returncode"]
        assert "stopped on SIGTERM" in result["reason"]
        assert b"INFO:     Application shutdown complete.\n" in driver.stderr()
        assert engine.recorded("stderr") == driver.stderr()

    @pytest.mark.parametrize(
        ("signum", "exit_code", "engine_returncode"),
        [
            pytest.param(signal.SIGINT, 0, 0, id="SIGINT-graceful"),
            pytest.param(signal.SIGHUP, 0, -signal.SIGHUP, id="SIGHUP-default-death-is-clean"),
            pytest.param(signal.SIGQUIT, 0, -signal.SIGQUIT, id="SIGQUIT-default-death-is-clean"),
        ],
    )
    def test_other_stop_signals_are_forwarded(self, tmp_path: Path, cleanup: list[int], signum: int, exit_code: int,
                                              engine_returncode: int) -> None:
        """SIGINT, SIGHUP and SIGQUIT reach the engine's group; death by a forwarded INT/HUP/QUIT counts as clean."""
        _engine, driver, pids = self._serving(tmp_path, cleanup)
        driver.proc.send_signal(signum)
        assert exit_code == driver.wait()
        outcome = driver.result()["outcome"]
        assert engine_returncode == outcome["engine_returncode"]
        assert f"stopped on {signal.Signals(signum).name}" in outcome["reason"]
        assert gone(pids["engine"]) and gone(pids["grandchild"])

    def test_engine_ignoring_sigterm_is_killed_after_the_grace(self, tmp_path: Path, cleanup: list[int]) -> None:
        """An engine that ignores SIGTERM is SIGKILLed (group) once grace_s have passed: exit 137."""
        behaviour = graceful(on_sigterm="ignore", grandchild=True, grandchild_ignores_sigterm=True,
                             steps=serving_steps())
        engine = Engine(tmp_path, "engine", behaviour, port=free_port())
        driver = Driver(tmp_path, engine, grace_s=1.0)
        pids = engine.pids()
        cleanup += [pids["engine"], pids["grandchild"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="startup")
        started = time.monotonic()
        driver.proc.send_signal(signal.SIGTERM)
        assert 137 == driver.wait()
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 8.0
        outcome = driver.result()["outcome"]
        assert ("SIGKILL", -9) == (outcome["signal_name"], outcome["engine_returncode"])
        assert "grace period" in outcome["reason"]
        assert gone(pids["engine"]) and gone(pids["grandchild"])

    def test_second_sigint_kills_at_once(self, tmp_path: Path, cleanup: list[int]) -> None:
        """A second SIGINT escalates to SIGKILL without waiting for the 30 s grace."""
        engine = Engine(tmp_path, "engine", graceful(on_sigterm="ignore", steps=serving_steps()), port=free_port())
        driver = Driver(tmp_path, engine, grace_s=30.0)
        pids = engine.pids()
        cleanup += [pids["engine"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="startup")
        started = time.monotonic()
        driver.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert driver.proc.poll() is None
        driver.proc.send_signal(signal.SIGINT)
        assert 137 == driver.wait()
        assert time.monotonic() - started < 5.0
        assert "second SIGINT" in driver.result()["outcome"]["reason"]
        assert gone(pids["engine"])

    def test_sigkill_of_the_supervisor_kills_engine_and_grandchild(self, tmp_path: Path, cleanup: list[int]) -> None:
        """PDEATHSIG kills the engine and the group guard kills the rest of its process group."""
        _engine, driver, pids = self._serving(tmp_path, cleanup)
        driver.proc.kill()
        driver.wait()
        wait_for(lambda: gone(pids["engine"]), 5.0, "engine death (PDEATHSIG)")
        wait_for(lambda: gone(pids["grandchild"]), 5.0, "grandchild death (group guard)")

    def test_without_the_guard_a_grandchild_outlives_a_sigkilled_supervisor(self, tmp_path: Path,
                                                                            cleanup: list[int]) -> None:
        """PDEATHSIG alone reaches only the direct child: this is why the group guard exists."""
        engine = Engine(tmp_path, "engine", graceful(grandchild=True, steps=serving_steps()), port=free_port())
        driver = Driver(tmp_path, engine, group_guard=False)
        pids = engine.pids()
        cleanup += [pids["engine"], pids["grandchild"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="startup")
        driver.proc.kill()
        driver.wait()
        wait_for(lambda: gone(pids["engine"]), 5.0, "engine death (PDEATHSIG)")
        time.sleep(0.5)
        assert not gone(pids["grandchild"])


# --------------------------------------------------------------------------- exit codes


class TestExitCodes:
    def test_engine_error_exit_code_and_traceback_pass_through(self, tmp_path: Path) -> None:
        """A vLLM-like startup error (traceback on stderr, exit 1) makes us exit 70 (never the engine's 1, our
        internal error) with the text intact."""
        scenario = graceful(
            steps=[
                {"text": VLLM_CORE_FAILED},
                {"fatal": {"type": "ValueError", "message": VLLM_FREE_MEMORY, "exit": 1}},
            ]
        )
        engine = Engine(tmp_path, "engine", scenario)
        driver = Driver(tmp_path, engine)
        assert 70 == driver.wait()
        assert f"ValueError: {VLLM_FREE_MEMORY}\n".encode() in driver.stderr()
        assert driver.stderr().startswith(b"Traceback (most recent call last):\n")
        assert driver.result()["outcome"]["reason"].startswith("engine exited with code 1 unasked")

    @pytest.mark.parametrize(
        ("steps", "phase"),
        [
            pytest.param([{"text": VLLM_SERVER}, {"crash": "SIGSEGV"}], "starting", id="while-loading"),
            pytest.param([*serving_steps(), {"delay": 1.0, "crash": "SIGSEGV"}], "ready", id="after-ready"),
        ],
    )
    def test_engine_killed_by_sigsegv_is_70(self, tmp_path: Path, steps: list[dict[str, Any]], phase: str) -> None:
        """Death by signal 11 unasked gives 70, names the signal and the phase reached."""
        engine = Engine(tmp_path, "engine", graceful(steps=steps), port=free_port())
        driver = Driver(tmp_path, engine)
        assert 70 == driver.wait()
        outcome = driver.result()["outcome"]
        assert ("SIGSEGV", -11, phase) == (outcome["signal_name"], outcome["engine_returncode"], outcome["phase"])

    def test_request_stop_exit_code_wins(self, tmp_path: Path, cleanup: list[int]) -> None:
        """request_stop(reason, 78) from the line hook stops the engine group and we exit 78."""
        engine = Engine(tmp_path, "engine", graceful(grandchild=True, steps=serving_steps()), port=free_port())
        trigger = {"match": "KV cache size", "action": "stop", "code": int(ExitCode.CONFIG),
                   "reason": "KV smaller than planned"}
        driver = Driver(tmp_path, engine, triggers=[trigger])
        pids = engine.pids()
        cleanup += [pids["engine"], pids["grandchild"], driver.proc.pid]
        assert 78 == driver.wait()
        outcome = driver.result()["outcome"]
        assert outcome["reason"].startswith("KV smaller than planned; engine exited with code 0")
        assert gone(pids["engine"]) and gone(pids["grandchild"])

    def test_group_leftovers_are_killed_when_the_engine_exits_alone(self, tmp_path: Path, cleanup: list[int]) -> None:
        """An engine that exits leaving a child behind (holding our pipes) still ends supervision."""
        engine = Engine(tmp_path, "engine", graceful(grandchild=True, steps=[{"text": VLLM_KV}, {"exit": 3}]))
        driver = Driver(tmp_path, engine)
        pids = engine.pids()
        cleanup += [pids["engine"], pids["grandchild"], driver.proc.pid]
        assert 70 == driver.wait(10)
        assert gone(pids["grandchild"])

    def test_exception_in_a_hook_stops_the_engine_and_propagates(self, tmp_path: Path) -> None:
        """A bug in on_line is not swallowed: the engine group is stopped and the exception re-raised."""
        engine = Engine(tmp_path, "engine", graceful(grandchild=True, steps=[{"text": VLLM_KV}, {"hang": True}]))
        out = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT)

        def on_line(stream: str, line: bytes) -> None:
            raise RuntimeError("parser bug")

        options = SupervisorOptions(stdout_fd=out, stderr_fd=out, handle_signals=False)
        sup = Supervisor(EngineCommand(tuple(engine.argv), os.environ), options, on_line=on_line)
        with pytest.raises(RuntimeError, match="parser bug"):
            sup.run()
        os.close(out)
        pids = engine.pids()
        assert gone(pids["engine"]) and gone(pids["grandchild"])
        assert (tmp_path / "out.bin").read_bytes().startswith(VLLM_KV.encode() + b"\n")

    def test_orphans_are_reaped_but_only_the_engine_counts(self, tmp_path: Path, cleanup: list[int]) -> None:
        """As PID 1 (here: a child subreaper with reap_orphans) an orphan's exit is reaped, not taken for the
        engine's."""
        steps = [{"orphan": 0.3}, *serving_steps()]
        engine = Engine(tmp_path, "engine", graceful(steps=steps), port=free_port())
        driver = Driver(tmp_path, engine, subreaper=True, ready_file=str(tmp_path / "ready"))
        cleanup.append(driver.proc.pid)
        orphan = wait_for(lambda: engine.pids()["orphans"], what="orphan pid")[0]
        wait_for(lambda: f"reaped an orphaned process     pid={orphan}" in driver.log_path.read_text(),
                 what="orphan reaped")
        wait_for((tmp_path / "ready").exists, what="ready file")
        assert driver.proc.poll() is None
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        outcome = driver.result()["outcome"]
        assert (0, "ready") == (outcome["engine_returncode"], outcome["phase"])

    def test_missing_executable_raises_spawn_error(self) -> None:
        """An engine that is not installed is EngineSpawnError with exit code 69."""
        sup = Supervisor(EngineCommand(("/nonexistent/vllm", "serve"), {}), SupervisorOptions(handle_signals=False))
        with pytest.raises(EngineSpawnError) as info:
            sup.run()
        assert ExitCode.UNAVAILABLE == info.value.exit_code
        assert "/nonexistent/vllm" in str(info.value)


# --------------------------------------------------------------------------- restart, readiness, watches


class TestRestart:
    def test_restart_stops_the_first_engine_before_starting_the_second(self, tmp_path: Path,
                                                                       cleanup: list[int]) -> None:
        """request_restart stops engine 1 gracefully (group included), then runs engine 2."""
        first = Engine(tmp_path, "first", graceful(grandchild=True, steps=[{"text": VLLM_KV}, {"hang": True}]))
        second = Engine(tmp_path, "second",
                        graceful(steps=[{"text": UVICORN_START[0], "stream": "stderr"}, {"exit": 0}]))
        trigger = {"match": "KV cache size", "action": "restart", "argv": second.argv}
        driver = Driver(tmp_path, first, triggers=[trigger])
        pids1 = first.pids()
        cleanup += [pids1["engine"], pids1["grandchild"], driver.proc.pid]
        assert 70 == driver.wait()
        pids2 = second.pids()
        assert pids1["engine"] != pids2["engine"]
        assert gone(pids1["engine"]) and gone(pids1["grandchild"])
        outcome = driver.result()["outcome"]
        assert (1, "engine exited with code 0 unasked (a server must not stop by itself)") == (
            outcome["restarts"], outcome["reason"])
        stderr = driver.stderr()
        assert stderr == first.recorded("stderr") + second.recorded("stderr")
        started = b"Started server process [%d]" % pids2["engine"]
        assert stderr.index(b"Application shutdown complete") < stderr.index(started)


    def test_fatal_line_restart_while_the_engine_dies(self, tmp_path: Path, cleanup: list[int]) -> None:
        """A restart asked for on the engine's last error line still happens though the engine exits by itself."""
        steps = [{"text": VLLM_FREE_MEMORY}, {"fatal": {"type": "ValueError", "message": VLLM_FREE_MEMORY, "exit": 1}}]
        first = Engine(tmp_path, "first", graceful(steps=steps))
        second = Engine(tmp_path, "second", graceful(steps=[{"text": VLLM_KV}, {"exit": 0}]))
        trigger = {"match": "Free memory on device", "action": "restart", "argv": second.argv}
        driver = Driver(tmp_path, first, triggers=[trigger])
        cleanup.append(driver.proc.pid)
        assert 70 == driver.wait()
        assert (1, 0) == (driver.result()["outcome"]["restarts"], driver.result()["outcome"]["engine_returncode"])
        assert driver.stdout() == first.recorded("stdout") + second.recorded("stdout")

    def test_on_exit_hook_can_restart(self, tmp_path: Path, cleanup: list[int]) -> None:
        """on_exit gets the engine's return code after its last line and may start another command."""
        first = Engine(tmp_path, "first", graceful(steps=[{"crash": "SIGSEGV"}]))
        second = Engine(tmp_path, "second", graceful(steps=[{"exit": 4}]))
        driver = Driver(tmp_path, first, on_exit_restart=second.argv)
        cleanup.append(driver.proc.pid)
        assert 70 == driver.wait()
        result = driver.result()
        assert ([-11, 4], 1) == (result["exits_seen"], result["outcome"]["restarts"])


class TestReadiness:
    def test_health_200_writes_the_ready_file_and_exit_removes_it(self, tmp_path: Path, cleanup: list[int]) -> None:
        """Once /health answers 200 the ready file holds the engine pid; it is gone after the stop."""
        engine = Engine(tmp_path, "engine", graceful(steps=serving_steps()), port=free_port())
        ready = tmp_path / "ready"
        driver = Driver(tmp_path, engine, ready_file=str(ready))
        pids = engine.pids()
        cleanup += [pids["engine"], driver.proc.pid]
        text = wait_for(lambda: ready.exists() and ready.read_text(), what="ready file")
        assert f"{pids['engine']}\n" == text
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        assert not ready.exists()
        assert "ready" == driver.result()["outcome"]["phase"]

    def test_on_ready_hook_decides(self, tmp_path: Path, cleanup: list[int]) -> None:
        """With an on_ready hook that does not call mark_ready, health alone writes no ready file."""
        engine = Engine(tmp_path, "engine", graceful(steps=serving_steps()), port=free_port())
        ready = tmp_path / "ready"
        driver = Driver(tmp_path, engine, ready_file=str(ready), on_ready="ignore")
        pids = engine.pids()
        cleanup += [pids["engine"], driver.proc.pid]
        wait_for(lambda: (tmp_path / "driver.on_ready").exists(), what="on_ready hook")
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        assert ("healthy", False) == (driver.result()["outcome"]["phase"], ready.exists())


class TestWatch:
    def test_missing_kv_line_fires_the_watch_timeout(self, tmp_path: Path, cleanup: list[int]) -> None:
        """When the KV line never comes, on_watch_timeout runs and its stop code is our exit code."""
        engine = Engine(tmp_path, "engine", graceful(steps=[{"text": VLLM_SERVER}, {"hang": True}]))
        driver = Driver(tmp_path, engine, watch_timeouts_s={"kv": 0.5}, on_watch_timeout={"code": 75})
        cleanup.append(driver.proc.pid)
        started = time.monotonic()
        assert 75 == driver.wait()
        assert time.monotonic() - started >= 0.5
        assert "watch kv timed out" in driver.result()["outcome"]["reason"]

    def test_marked_event_disarms_the_watch(self, tmp_path: Path, cleanup: list[int]) -> None:
        """mark_event('kv') from the line hook prevents the timeout."""
        engine = Engine(tmp_path, "engine", graceful(steps=[{"text": VLLM_KV}, {"delay": 1.0, "exit": 0}]))
        trigger = {"match": "KV cache size", "action": "mark", "event": "kv"}
        driver = Driver(tmp_path, engine, watch_timeouts_s={"kv": 0.5}, on_watch_timeout={"code": 75},
                        triggers=[trigger])
        cleanup.append(driver.proc.pid)
        assert 70 == driver.wait()  # not 75: the watch was disarmed; the engine then exited 0 unasked


class TestNotify:
    def test_notify_protocol_and_clean_child_env(self, tmp_path: Path, cleanup: list[int]) -> None:
        """systemd gets STATUS, EXTEND_TIMEOUT_USEC while loading, READY=1, STOPPING=1; the engine no NOTIFY_SOCKET."""
        address = os.path.join(tempfile.mkdtemp(prefix="ssn"), "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(address)
        sock.settimeout(0.1)
        steps = [{"text": VLLM_SERVER, "delay": 0.6}, *serving_steps()]
        engine = Engine(tmp_path, "engine", graceful(steps=steps), port=free_port())
        ready = tmp_path / "ready"
        driver = Driver(tmp_path, engine, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1"}, ready_file=str(ready),
                        extend_every_s=0.2)
        pids = engine.pids()
        cleanup += [pids["engine"], driver.proc.pid]
        wait_for(ready.exists, what="ready file")
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        messages: list[str] = []
        with sock:
            while True:
                try:
                    messages.append(sock.recv(4096).decode())
                except TimeoutError:
                    break
        assert f"STATUS=engine starting (pid {pids['engine']})" == messages[0]
        assert sum(m == "EXTEND_TIMEOUT_USEC=30000000" for m in messages) >= 2
        ready_at = messages.index(f"READY=1\nSTATUS=engine ready (pid {pids['engine']})")
        assert all(not m.startswith("EXTEND") for m in messages[ready_at + 1 : -1])
        assert messages[-1].startswith("STOPPING=1\n")
        child_env = json.loads(engine.env_file.read_text())
        assert ("NOTIFY_SOCKET" in child_env, "WATCHDOG_USEC" in child_env, child_env["PATH"]) == (
            False, False, os.environ["PATH"])


class TestStateHook:
    def test_stop_signal_runs_stopping_then_finished(self, tmp_path: Path, cleanup: list[int]) -> None:
        """SIGTERM while serving: on_state sees RUNNING, STOPPING, FINISHED, nothing else."""
        engine = Engine(tmp_path, "engine", graceful(steps=serving_steps()), port=free_port())
        driver = Driver(tmp_path, engine)
        cleanup += [engine.pids()["engine"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="uvicorn startup line")
        driver.proc.send_signal(signal.SIGTERM)
        assert 0 == driver.wait()
        assert ["RUNNING", "STOPPING", "FINISHED"] == driver.result()["states_seen"]

    def test_a_second_stop_signal_is_no_new_state(self, tmp_path: Path, cleanup: list[int]) -> None:
        """A SIGTERM while already stopping (the engine ignores the first) is not reported again."""
        engine = Engine(tmp_path, "engine", graceful(on_sigterm="ignore", steps=serving_steps()), port=free_port())
        driver = Driver(tmp_path, engine, grace_s=1.0)
        cleanup += [engine.pids()["engine"], driver.proc.pid]
        wait_for(lambda: b"Application startup complete" in driver.stderr(), what="uvicorn startup line")
        driver.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        driver.proc.send_signal(signal.SIGTERM)
        assert 137 == driver.wait()  # killed after the grace: the second SIGTERM came while stopping
        assert ["RUNNING", "STOPPING", "FINISHED"] == driver.result()["states_seen"]

    def test_restart_runs_restarting_then_running_again(self, tmp_path: Path, cleanup: list[int]) -> None:
        """request_restart: RUNNING, RESTARTING, RUNNING (engine 2), then FINISHED when it exits."""
        first = Engine(tmp_path, "first", graceful(steps=[{"text": VLLM_KV}, {"hang": True}]))
        second = Engine(tmp_path, "second", graceful(steps=[{"exit": 0}]))
        trigger = {"match": "KV cache size", "action": "restart", "argv": second.argv}
        driver = Driver(tmp_path, first, triggers=[trigger])
        cleanup.append(driver.proc.pid)
        assert 70 == driver.wait()
        assert ["RUNNING", "RESTARTING", "RUNNING", "FINISHED"] == driver.result()["states_seen"]


# --------------------------------------------------------------------------- devlock

# --------------------------------------------------------------------------- the driver


def _driver(config_path: str) -> int:
    """Run a Supervisor as configured in JSON; write the outcome and what the hook saw."""
    import structlog

    cfg = json.loads(Path(config_path).read_text())
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=open(cfg["log"], "a")))  # noqa: SIM115
    health = HealthCheck("127.0.0.1", cfg["health_port"], interval_s=0.1) if cfg.get("health_port") else None
    if cfg.get("subreaper"):  # stand in for PID 1: orphans of the engine get reparented to us
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    options = SupervisorOptions(
        reap_orphans=bool(cfg.get("subreaper")),
        grace_s=cfg.get("grace_s", 5.0),
        health=health,
        ready_file=Path(cfg["ready_file"]) if cfg.get("ready_file") else None,
        watch_timeouts_s=cfg.get("watch_timeouts_s", {}),
        group_guard=cfg.get("group_guard", True),
        extend_every_s=cfg.get("extend_every_s", 10.0),
        line_filter=tuple(n.encode() for n in cfg["line_filter"]) if cfg.get("line_filter") else None,
    )
    triggers: list[dict[str, Any]] = cfg.get("triggers", [])
    hashes = {name: hashlib.sha256() for name in ("stdout", "stderr")}
    stats = {name: {"count": 0, "longest": 0} for name in ("stdout", "stderr")}
    sup: Supervisor

    def on_line(stream: str, line: bytes) -> None:
        hashes[stream].update(line + b"\n")
        entry = stats[stream]
        entry["count"] += 1
        entry["longest"] = max(entry["longest"], len(line))
        for trigger in triggers:
            if not trigger.get("fired") and trigger["match"].encode() in line:
                trigger["fired"] = True
                if trigger["action"] == "stop":
                    sup.request_stop(trigger["reason"], trigger["code"])
                elif trigger["action"] == "restart":
                    sup.request_restart(EngineCommand(tuple(trigger["argv"]), os.environ))
                elif trigger["action"] == "mark":
                    sup.mark_event(trigger["event"])

    def on_ready() -> None:
        Path(config_path).with_name("driver.on_ready").touch()

    def on_watch_timeout(name: str) -> None:
        sup.request_stop(f"watch {name} timed out", cfg["on_watch_timeout"]["code"])

    exits_seen: list[int] = []
    states_seen: list[str] = []

    def on_exit(returncode: int) -> None:
        exits_seen.append(returncode)
        if len(exits_seen) == 1:
            sup.request_restart(EngineCommand(tuple(cfg["on_exit_restart"]), os.environ), reason="crashed")

    sup = Supervisor(
        EngineCommand(tuple(cfg["argv"]), os.environ),
        options,
        on_line=on_line,
        on_ready=on_ready if cfg.get("on_ready") == "ignore" else None,
        on_watch_timeout=on_watch_timeout if cfg.get("on_watch_timeout") else None,
        on_exit=on_exit if cfg.get("on_exit_restart") else None,
        on_state=lambda state: states_seen.append(state.name),
    )
    outcome = sup.run()
    result = {
        "outcome": {**asdict(outcome), "phase": outcome.phase.name.lower()},
        "lines": {name: {**stats[name], "sha256": hashes[name].hexdigest()} for name in hashes},
        "exits_seen": exits_seen,
        "states_seen": states_seen,
    }
    Path(cfg["result"]).write_text(json.dumps(result))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(_driver(sys.argv[1]))
