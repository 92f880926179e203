"""The fault suite: safe-serve against a misbehaving stand-in engine, one scenario per fault.

Each scenario runs `safe-serve` as a real process (`--device cpu`, vLLM rules, the stand-in as
`--engine-cmd`) and asserts the documented exit code, that no engine process is left, and that
no byte the engine wrote was lost or changed on the way (stdout compared with what the stand-in
recorded; stderr with our own JSON lines taken out). Timings are compressed (grace 2 s, health
probes every 0.3 s) so the suite stays within a few minutes on two cores.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import processes
from tests.jsonlog import json_events

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin_engine.py"
TIMEOUT = 30.0
MiB = 1 << 20

# vLLM 0.32.0's own lines (vllm/v1/engine/core.py:1512, v1/engine/exceptions.py:16, torch's OOM
# message, distributed/device_communicators/pynccl_wrapper.py:448) and uvicorn's.
STARTUP = "INFO:     Application startup complete."
CORE_FATAL = "(EngineCore pid=${pid}) ERROR ${vts} [core.py:1512] EngineCore encountered a fatal error."
TRACEBACK = ["Traceback (most recent call last):", '  File "vllm/v1/engine/core.py", line 1505, in run_engine_core']
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.19 GiB of which 1.06 GiB is free.")
# As the real engine logs it (tests/data/vllm_cpu_truth.json): an ERROR record of the API server.
ENGINE_DEAD = ("(APIServer pid=${pid}) ERROR ${vts} [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
               "EngineCore encountered an issue. See stack trace (above) for the root cause.")
# logger.exception puts the header on every line of the traceback (vllm/logging_utils/formatter.py:74).
LOGGED_OOM = f"(EngineCore pid=${{pid}}) ERROR ${{vts}} [core.py:1512] {OOM}"
NCCL = "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
UVICORN_STOP = ["INFO:     Shutting down", "INFO:     Application shutdown complete."]


@functools.cache
def cpu_plan() -> dict[str, Any]:
    """The plan safe-serve makes for the scenarios' command (the stand-in reports it back)."""
    with tempfile.TemporaryDirectory() as state:
        done = subprocess.run([sys.executable, "-m", "launcher", "plan", "qwen2.5-7b", "--device", "cpu", "--json"],
                              cwd=REPO, env={**os.environ, "SAFE_SERVE_STATE_DIR": state}, capture_output=True,
                              check=True)
    return dict(json.loads(done.stdout))


def kv_line(scale: float = 1.0) -> str:
    plan = cpu_plan()
    tokens, length = int(plan["kv_cache_tokens"] * scale), plan["max_model_len"]
    return (f"(EngineCore pid=${{pid}}) INFO ${{vts}} [kv_cache_utils.py:1] CPU KV cache size: {tokens:,} tokens, "
            f"Maximum concurrency for {length:,} tokens per request: {tokens / length:.2f}x")


def text(*lines: str, stream: str = "stdout") -> list[dict[str, Any]]:
    return [{"text": line, "stream": stream} for line in lines]


def loading() -> list[dict[str, Any]]:
    return text("INFO ${vts} [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 3.1 seconds")


def kv(scale: float = 1.0) -> list[dict[str, Any]]:
    return [{"text": kv_line(scale)}]


def healthy() -> list[dict[str, Any]]:
    return [{"serve": True}, *text("INFO:     Started server process [${pid}]", STARTUP, stream="stderr")]


def serving() -> list[dict[str, Any]]:
    return [*loading(), *kv(), *healthy()]


def go() -> dict[str, Any]:
    return {"await_file": "${go}"}


def scenario(steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"engine": "vllm", "sigterm_exit_delay": 0.05, "steps": steps,
            "shutdown_lines": [{"stream": "stderr", "text": line} for line in UVICORN_STOP], **extra}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Run:
    """One safe-serve process with a stand-in engine; output to files (or a pipe for stdout)."""

    def __init__(self, tmp: Path, spec: dict[str, Any], *, options: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, stdout_pipe: bool = False, engine_cmd: str | None = None) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.dir, self.port, self.go = tmp, free_port(), tmp / "go"
        self.ready_file, self.record, self.marker = tmp / "ready", tmp / "record", tmp / "argv.jsonl"
        self.state, self.out, self.err = tmp / "state", tmp / "stdout", tmp / "stderr"
        spec = {**spec, "vars": {"go": str(self.go), **spec.get("vars", {})}}
        (tmp / "scenario.json").write_text(json.dumps(spec))
        standin = [sys.executable, str(STANDIN), "--scenario", str(tmp / "scenario.json"), "--record", str(self.record),
                   "--argv-log", str(self.marker), "--pid-file", str(tmp / "pids.json")]
        argv = [sys.executable, "-m", "launcher", "qwen2.5-7b", "--engine", "vllm", "--device", "cpu",
                "--engine-cmd", engine_cmd if engine_cmd is not None else shlex.join(standin),
                "--log-format", "json", "--ready-file", str(self.ready_file), "--grace", "2",
                "--health-interval", "0.3", *options, "--", "--port", str(self.port)]
        self.env = {**os.environ, "SAFE_SERVE_STATE_DIR": str(self.state), "SAFE_SERVE_LOCK_DIR": str(tmp / "locks"),
                    **(env or {})}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            if key not in (env or {}):
                self.env.pop(key, None)
        with self.err.open("wb") as err:
            if stdout_pipe:
                self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=self.env)
            else:
                with self.out.open("wb") as out:
                    self.proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO, env=self.env)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return json_events(self.err, name)

    def tail(self) -> str:
        return self.err.read_bytes()[-4000:].decode(errors="replace")

    def recorded(self, stream: str) -> bytes:
        path = self.record / f"{stream}.bin"
        return path.read_bytes() if path.exists() else b""

    def wait_for(self, predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None and not predicate():
                break
            time.sleep(0.03)
        raise AssertionError(f"timed out or exited ({self.proc.poll()}):\n{self.tail()}")

    def wait_ready(self) -> None:
        self.wait_for(self.ready_file.exists)

    def wait_line(self, needle: bytes) -> None:
        self.wait_for(lambda: needle in self.recorded("stdout") + self.recorded("stderr"))

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"safe-serve still running after {timeout} s:\n{self.tail()}") from None

    def survivors(self) -> list[psutil.Process]:
        return processes.survivors(str(self.marker), self.proc.pid)

    def close(self) -> None:
        processes.close(self.proc, str(self.marker))


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def start(spec: dict[str, Any], **kwargs: Any) -> Run:
        made.append(Run(tmp_path / f"run{len(made)}", spec, **kwargs))
        return made[-1]

    yield start
    for one in made:
        one.close()


def finished(served: Run, code: int) -> dict[str, Any]:
    """Exit `code`, said in the `exit` event; no engine process left; ready file gone; no byte lost;
    no traceback of ours."""
    assert served.wait() == code, served.tail()
    final = served.events("exit")[-1] if served.events("exit") else {}
    if served.recorded("stdout") or served.marker.exists():
        assert final.get("code") == code, served.tail()
    deadline = time.monotonic() + 3
    while served.survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not served.survivors()
    assert not served.ready_file.exists()
    if served.out.exists():
        assert served.out.read_bytes() == served.recorded("stdout")
    err = served.err.read_bytes()
    ours_removed = b"".join(line + b"\n" for line in err.split(b"\n") if not line.startswith(b'{"'))
    assert served.recorded("stderr") in ours_removed
    assert b"Traceback" not in err.replace(served.recorded("stderr"), b"")
    return final


# --------------------------------------------------------------------------- the engine dies


@pytest.mark.parametrize(("steps", "returncode", "engine_phase"), [
    pytest.param([{"crash": "SIGKILL"}], -9, "starting", id="sigkill-before-any-line"),
    pytest.param([{"exit": 3}], 3, "starting", id="exit-3-before-any-line"),
    pytest.param([*loading(), {"crash": "SIGSEGV"}], -11, "weights loaded", id="sigsegv-loading"),
    pytest.param([*loading(), *kv(), {"exit": 1}], 1, "KV cache sized", id="exit-1-after-kv"),
    pytest.param([*loading(), *kv(), {"crash": "SIGKILL"}], -9, "KV cache sized", id="sigkill-after-kv"),
    pytest.param([*serving(), go(), {"crash": "SIGABRT"}], -6, "serving", id="sigabrt-after-ready"),
    pytest.param([*serving(), go(), {"exit": 2}], 2, "serving", id="exit-2-after-ready"),
    pytest.param([*serving(), go(), {"exit": 78}], 78, "serving", id="exit-78-after-ready"),
])
def test_engine_death_is_70_whatever_its_code(run: Callable[..., Run], steps: list[dict[str, Any]], returncode: int,
                                              engine_phase: str) -> None:
    """An engine that dies by itself, in every phase: 70, never its own code (1 is our internal error, 2 a bad
    command line, 78 "will not fit"); its code or signal is in the exit event, logged at error."""
    served = run(scenario(steps))
    if any("await_file" in step for step in steps):
        served.wait_ready()
        served.go.touch()
    final = finished(served, 70)
    assert final["engine_phase"] == engine_phase and final["restarts"] == 0
    assert final["engine_returncode"] == returncode and final["level"] == "error"


@pytest.mark.parametrize(("steps", "ready"), [
    pytest.param([{"exit": 0}], False, id="before-any-line"),
    pytest.param([*loading(), *kv(), {"exit": 0}], False, id="after-kv"),
    pytest.param([*serving(), go(), {"exit": 0}], True, id="after-ready"),
    pytest.param([*serving(), go(), *text(ENGINE_DEAD, stream="stderr"), {"exit": 0}], True,
                 id="engine-dead-then-exit-0"),
])
def test_exit_0_unasked_is_70(run: Callable[..., Run], steps: list[dict[str, Any]], ready: bool) -> None:
    """A server that stops by itself has failed: 70 (EX_SOFTWARE), so Restart=on-failure restarts it."""
    served = run(scenario(steps))
    if ready:
        served.wait_ready()
        served.go.touch()
    final = finished(served, 70)
    assert "exited with code 0" in final["reason"]


# --------------------------------------------------------------------------- readiness


def test_no_kv_line_never_ready_and_times_out_with_75(run: Callable[..., Run]) -> None:
    """/health answers but the KV report never comes: never announced ready; 75 at --watch-timeout."""
    served = run(scenario([*loading(), *healthy(), {"hang": True}]), options=("--watch-timeout", "2"))
    final = finished(served, 75)
    assert not served.events("ready") and final["phase"] == "HEALTHY"


def test_no_kv_line_waived_by_warn_is_ready_and_says_so(run: Callable[..., Run]) -> None:
    """--on-divergence warn waives the KV check: ready on /health, with a kv-check-waived line."""
    served = run(scenario([*loading(), *healthy(), {"hang": True}]),
                 options=("--watch-timeout", "3", "--on-divergence", "warn"))
    served.wait_ready()
    assert "--on-divergence warn" in served.events("kv-check-waived")[0]["reason"]
    time.sleep(3.2)  # past the watch timeout: the waived watch does not fire
    served.signal(signal.SIGTERM)
    finished(served, 0)


def test_ready_only_after_the_kv_line_is_checked(run: Callable[..., Run]) -> None:
    """/health first, the KV line later: the ready file appears only after the KV line."""
    served = run(scenario([*loading(), *healthy(), go(), *kv(), {"hang": True}]))
    served.wait_line(STARTUP.encode())
    time.sleep(1.0)  # several health probes have passed
    assert not served.ready_file.exists() and not served.events("ready")
    served.go.touch()
    served.wait_ready()
    assert served.events("ready")[0]["kv_tokens"] == cpu_plan()["kv_cache_tokens"]
    served.signal(signal.SIGTERM)
    finished(served, 0)


@pytest.mark.parametrize(("mode", "code"), [
    pytest.param("abort", 78, id="abort-78"),
    pytest.param("warn", 0, id="warn-serves"),
    pytest.param("retune", 0, id="retune-restarts-with-a-shorter-length"),
])
def test_diverging_kv(run: Callable[..., Run], mode: str, code: int) -> None:
    """20 % fewer KV tokens than planned: abort stops with 78; warn serves (said); retune restarts once
    with the length the engine's tokens hold (0.91 requests of 32,768) and then serves."""
    served = run(scenario([*loading(), *kv(0.8), *healthy(), {"hang": True}]), options=("--on-divergence", mode))
    if code == 0:
        served.wait_ready()
        assert served.events("retune" if mode == "retune" else "divergence")
        served.signal(signal.SIGTERM)
    final = finished(served, code)
    assert (final["phase"] == "READY") == (code == 0)


# --------------------------------------------------------------------------- output


@pytest.mark.parametrize("steps", [
    pytest.param([{"flood": 100_000, "width": 120}, *serving()], id="flood-100k-lines"),
    pytest.param([{"raw_hex": "ff fe c3 28 80 0a e2 82 0d 0a 00 1b 5b 33 31 6d 0a"}, *serving()], id="invalid-utf8"),
    pytest.param([{"long_line": 17 * MiB, "chunk": 1 * MiB}, *serving()], id="17MiB-line-stdout"),
    pytest.param([{"long_line": 17 * MiB, "chunk": 1 * MiB, "stream": "stderr"}, *serving()], id="17MiB-line-stderr"),
    pytest.param([*serving(), {"partial": "a progress bar without newline\r"}, {"hang": True}], id="partial-line"),
])
def test_output_passes_through_and_the_kv_line_is_found(run: Callable[..., Run], steps: list[dict[str, Any]]) -> None:
    """Floods, invalid UTF-8, 17 MiB lines and a partial line pass whole; the KV line is still checked."""
    served = run(scenario(steps))
    served.wait_ready()
    time.sleep(0.3)
    served.signal(signal.SIGTERM)
    finished(served, 0)


def test_stalled_stdout_reader_does_not_block_signals(run: Callable[..., Run]) -> None:
    """Nobody reads our stdout while the engine floods: SIGTERM still reaches the engine at once
    (the engine is paused by back-pressure, said once), and when the reader comes back every byte arrives."""
    served = run(scenario([*serving(), go(), {"flood": 300_000, "width": 120}, {"hang": True}]), stdout_pipe=True)
    assert served.proc.stdout is not None
    reader = served.proc.stdout
    # read up to the ready file (the pipe holds only 64 KiB), then stall
    got = bytearray()
    os.set_blocking(reader.fileno(), False)
    deadline = time.monotonic() + TIMEOUT
    while not served.ready_file.exists() and time.monotonic() < deadline:
        got += reader.read() or b""
        time.sleep(0.02)
    served.go.touch()
    served.wait_for(lambda: bool(served.events("our output is not being read: pausing the engine's output until it "
                                               "is (back-pressure; nothing is dropped)")))
    started = time.monotonic()
    served.signal(signal.SIGTERM)
    served.wait_line(b"Application shutdown complete")  # the engine got SIGTERM while stdout is stalled
    assert time.monotonic() - started < 3.0
    os.set_blocking(reader.fileno(), True)
    got += reader.read()
    assert served.wait() == 0, served.tail()
    assert bytes(got) == served.recorded("stdout")  # the engine stopped flooding at SIGTERM; all it wrote came
    assert len(served.events("our output is not being read: pausing the engine's output until it is "
                             "(back-pressure; nothing is dropped)")) == 1
    assert not served.survivors()


# --------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["loading", "kv-seen", "ready"])
def test_stop_signal_in_each_phase_is_0(run: Callable[..., Run], signum: signal.Signals, phase: str) -> None:
    """SIGTERM/SIGINT/SIGHUP/SIGQUIT to safe-serve while loading, after the KV line or while serving: a clean 0."""
    steps = {"loading": [*loading(), {"hang": True}], "kv-seen": [*loading(), *kv(), {"hang": True}],
             "ready": [*serving(), {"hang": True}]}[phase]
    served = run(scenario(steps, grandchild=True))
    if phase == "ready":
        served.wait_ready()
    else:
        served.wait_line(b"KV cache size" if phase == "kv-seen" else b"Model loading took")
    served.signal(signum)
    final = finished(served, 0)
    assert f"stopped on {signum.name}" in final["reason"]


def test_engine_ignoring_sigterm_is_killed_after_the_grace(run: Callable[..., Run]) -> None:
    """An engine (and its worker) ignoring SIGTERM: SIGKILLed after --grace 2, exit 137."""
    served = run(scenario(serving(), on_sigterm="ignore", grandchild=True, grandchild_ignores_sigterm=True))
    served.wait_ready()
    started = time.monotonic()
    served.signal(signal.SIGTERM)
    final = finished(served, 137)
    assert 2.0 <= time.monotonic() - started < 8.0 and "grace period" in final["reason"]


@pytest.mark.parametrize("extra", [
    pytest.param({"grandchild": True}, id="worker-in-group"),
    pytest.param({"grandchild": True, "grandchild_ignores_sigterm": True}, id="worker-ignoring-sigterm"),
])
def test_workers_are_stopped_with_the_engine(run: Callable[..., Run], extra: dict[str, Any]) -> None:
    """Workers in the engine's group (like vLLM's EngineCore) never outlive a stop."""
    served = run(scenario([*serving(), {"hang": True}], **extra))
    served.wait_ready()
    pids = json.loads((served.dir / "pids.json").read_text())
    served.signal(signal.SIGTERM)
    finished(served, 0)
    assert not psutil.pid_exists(pids["grandchild"]) or psutil.Process(pids["grandchild"]).status() == "zombie"


def test_forked_orphan_and_crash_leave_nothing(run: Callable[..., Run]) -> None:
    """A double-forked helper and a worker, then the engine crashes: nothing survives, 70."""
    served = run(scenario([{"orphan": 0.5}, *serving(), go(), {"crash": "SIGSEGV"}], grandchild=True))
    served.wait_ready()
    served.go.touch()
    finished(served, 70)


def test_second_sigint_kills_at_once(run: Callable[..., Run]) -> None:
    """An impatient second Ctrl-C SIGKILLs the engine's group without waiting for the grace: 137."""
    served = run(scenario(serving(), on_sigterm="ignore"), options=("--grace", "30"))
    served.wait_ready()
    served.signal(signal.SIGINT)
    time.sleep(0.3)
    served.signal(signal.SIGINT)
    final = finished(served, 137)
    assert "second SIGINT" in final["reason"]


# --------------------------------------------------------------------------- after ready


@pytest.mark.parametrize(("lines", "kind"), [
    pytest.param([CORE_FATAL, *TRACEBACK, OOM, ENGINE_DEAD], "crash:engine_core", id="cuda-oom"),
    pytest.param([*TRACEBACK, OOM], "fatal:cuda_oom", id="cuda-oom-alone"),
    pytest.param([CORE_FATAL, *TRACEBACK, NCCL], "crash:engine_core", id="nccl-after-core-fatal"),
    pytest.param([*TRACEBACK, NCCL], "crash:nccl", id="nccl"),
    pytest.param([ENGINE_DEAD], "crash:engine_dead", id="engine-dead-hangs"),
])
def test_fatal_error_while_serving_is_70(run: Callable[..., Run], lines: list[str], kind: str) -> None:
    """A known fatal error after ready: its lines pass through, then the engine is stopped, exit 70."""
    served = run(scenario([*serving(), go(), *text(*lines), {"hang": True}]))
    served.wait_ready()
    served.go.touch()
    final = finished(served, 70)
    failure = served.events("engine-failure")[0]
    assert failure["kind"] == kind and "failed while serving" in final["reason"]
    assert all(line.split("${")[0].encode() in served.out.read_bytes() for line in lines)


def test_runtime_oom_is_remembered_with_bounded_headroom(run: Callable[..., Run], tmp_path: Path) -> None:
    """Each CUDA OOM while serving adds 512 MiB of headroom to the setup's calibration, up to 2 GiB."""
    from launcher.plan.calibration import RUNTIME_OOM_CAP_BYTES, RUNTIME_OOM_STEP_BYTES, record_runtime_oom

    served = run(scenario([*serving(), go(), *text(CORE_FATAL, LOGGED_OOM), {"exit": 1}]))
    served.wait_ready()
    served.go.touch()
    finished(served, 70)
    entries = json.loads((served.state / "calibration.json").read_text())["entries"]
    (key, entry), = entries.items()
    assert (entry["runtime_oom_count"], entry["extra_headroom_bytes"]) == (1, RUNTIME_OOM_STEP_BYTES)
    assert served.events("runtime-oom")[0]["next_extra_headroom_bytes"] == RUNTIME_OOM_STEP_BYTES
    for _ in range(6):
        last = record_runtime_oom(served.state, key)
    assert last.extra_headroom_bytes == RUNTIME_OOM_CAP_BYTES


def test_health_failing_after_ready_is_70(run: Callable[..., Run]) -> None:
    """/health stops answering 200 while serving: 3 failures in a row (0.3 s apart) stop the engine, 70."""
    served = run(scenario([*serving(), go(), {"healthy": False}, {"hang": True}]))
    served.wait_ready()
    served.go.touch()
    final = finished(served, 70)
    assert "/health failed 3 times in a row" in final["reason"]
    assert len(served.events("engine health check failed")) == 3


def test_health_check_off_keeps_serving(run: Callable[..., Run]) -> None:
    """--health-failures 0: a failing /health after ready is not acted on."""
    served = run(scenario([*serving(), go(), {"healthy": False}, {"hang": True}]), options=("--health-failures", "0"))
    served.wait_ready()
    served.go.touch()
    time.sleep(1.5)
    assert served.proc.poll() is None
    served.signal(signal.SIGTERM)
    finished(served, 0)


def test_watchdog_pings_only_while_healthy(run: Callable[..., Run], tmp_path: Path) -> None:
    """With WATCHDOG_USEC, WATCHDOG=1 goes out after READY=1 while /health answers, and stops when it fails."""
    address = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.05)
    served = run(scenario([*serving(), go(), {"healthy": False}, {"hang": True}]),
                 env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"}, options=("--health-failures", "6"))
    messages: list[str] = []

    def drain() -> None:
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return

    served.wait_ready()
    time.sleep(1.3)
    drain()
    ready_at = next(i for i, m in enumerate(messages) if m.startswith("READY=1"))
    assert messages[ready_at + 1:].count("WATCHDOG=1") >= 2
    served.go.touch()
    served.wait()
    drain()
    sock.close()
    failed_at = len(messages) - 1 - messages[::-1].index("WATCHDOG=1")
    assert not any(m == "WATCHDOG=1" for m in messages[failed_at + 1:])
    assert served.proc.returncode == 70


# --------------------------------------------------------------------------- bad input, locks


def test_engine_cmd_with_an_unclosed_quote_is_a_usage_error(run: Callable[..., Run]) -> None:
    """One line and exit 2, no traceback, nothing started."""
    served = run(scenario(serving()), engine_cmd='python -m "vllm')
    assert served.wait() == 2
    err = served.err.read_bytes().decode()
    assert "--engine-cmd" in err and "No closing quotation" in err and "Traceback" not in err


def test_missing_engine_is_69(run: Callable[..., Run]) -> None:
    """An engine executable that does not exist: 69 with one line."""
    served = run(scenario(serving()), engine_cmd="/nonexistent/vllm serve")
    assert served.wait() == 69
    assert "cannot start the engine" in served.err.read_bytes().decode()


def test_cpu_launches_take_the_host_lock(run: Callable[..., Run], tmp_path: Path) -> None:
    """A second CPU launch waits for the first one's KV line: with --lock-timeout 1 it gives up with 75."""
    locks = str(tmp_path / "shared-locks")
    first = run(scenario([*loading(), go(), *kv(), *healthy(), {"hang": True}]), env={"SAFE_SERVE_LOCK_DIR": locks})
    first.wait_line(b"Model loading took")
    second = run(scenario(serving()), env={"SAFE_SERVE_LOCK_DIR": locks}, options=("--lock-timeout", "1"))
    assert second.wait() == 75
    assert "this host's memory is being started by pid" in second.err.read_bytes().decode()
    first.go.touch()
    first.wait_ready()  # the first launch released the lock at its KV line
    third = run(scenario(serving()), env={"SAFE_SERVE_LOCK_DIR": locks}, options=("--lock-timeout", "5"))
    third.wait_ready()
    for served in (first, third):
        served.signal(signal.SIGTERM)
        finished(served, 0)


def test_errors_the_engine_logs_while_it_stops_keep_the_stop_clean(run: Callable[..., Run]) -> None:
    """vLLM logs "AsyncLLM output_handler failed" while SIGTERM shuts it down (seen on the real CPU
    engine): the stop asked for stays exit 0; the line still passes through."""
    handler = "(APIServer pid=${pid}) ERROR ${vts} [async_llm.py:906] AsyncLLM output_handler failed."
    served = run(scenario(serving(), shutdown_lines=[{"stream": "stdout", "text": handler}]))
    served.wait_ready()
    served.signal(signal.SIGTERM)
    finished(served, 0)
    assert b"AsyncLLM output_handler failed." in served.out.read_bytes()
    assert served.events("engine-error-while-stopping")


# --------------------------------------------------------------------------- hostile input


def test_prompts_quoting_fatal_words_stop_nothing(run: Callable[..., Run]) -> None:
    """Request logs (vLLM's own format) quoting every fatal and crash message while serving: the
    server keeps serving, a SIGTERM stops it cleanly, and no runtime OOM headroom is recorded."""
    from tests.hostile_lines import SAMPLES, quoted

    words = [s.message for s in SAMPLES if s.engine == "vllm" and s.kind.startswith(("fatal:", "crash:"))]
    lines = [line.replace("pid=8", "pid=${pid}") for text in words for seq in quoted("vllm", text) for line in seq]
    served = run(scenario([*serving(), go(), *text(*lines), {"hang": True}]))
    served.wait_ready()
    served.go.touch()
    served.wait_line(lines[-1].encode())
    time.sleep(0.5)
    assert served.proc.poll() is None and not served.events("engine-failure")
    served.signal(signal.SIGTERM)
    finished(served, 0)
    calibration = served.state / "calibration.json"
    entries = json.loads(calibration.read_text())["entries"] if calibration.exists() else {}
    assert not any(entry.get("runtime_oom_count") for entry in entries.values())


# --------------------------------------------------------------------------- signals in every phase


def _waiting_for_the_lock(run: Callable[..., Run], tmp_path: Path) -> tuple[Run, Run]:
    """A first CPU launch holds the host lock while it loads; a second one waits for it."""
    locks = str(tmp_path / "shared-locks")
    first = run(scenario([*loading(), go(), *kv(), *healthy(), {"hang": True}]), env={"SAFE_SERVE_LOCK_DIR": locks})
    first.wait_line(b"Model loading took")
    second = run(scenario(serving()), env={"SAFE_SERVE_LOCK_DIR": locks}, options=("--lock-timeout", "60"))
    time.sleep(2.0)  # planned and polling the lock (an engine would have written its argv by now)
    assert second.proc.poll() is None and not second.marker.exists()
    return first, second


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
def test_stop_signal_while_waiting_for_the_start_lock_is_0(run: Callable[..., Run], tmp_path: Path,
                                                          signum: signal.Signals) -> None:
    """SIGTERM/SIGHUP/SIGQUIT during the lock wait: one line and 0, as in every other phase (was 143/129/131)."""
    first, second = _waiting_for_the_lock(run, tmp_path)
    second.signal(signum)
    assert second.wait() == 0, second.tail()
    err = second.err.read_bytes().decode()
    assert f"stopped on {signum.name} before the engine started" in err and "Traceback" not in err
    first.go.touch()
    first.wait_ready()
    first.signal(signal.SIGTERM)
    finished(first, 0)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["lock-wait", "loading", "ready", "stopping"])
def test_other_signals_are_ignored_in_every_phase(run: Callable[..., Run], tmp_path: Path, signum: signal.Signals,
                                                  phase: str) -> None:
    """SIGUSR1/SIGUSR2/SIGALRM never end safe-serve (their default action would, silently, leaving the ready
    file behind): said and ignored; the serve goes on and a later SIGTERM is still a clean 0."""
    first = None
    if phase == "lock-wait":
        first, served = _waiting_for_the_lock(run, tmp_path)
    else:
        served = run(scenario([*loading(), go(), *kv(), *healthy(), {"hang": True}],
                              on_sigterm="ignore" if phase == "stopping" else "exit"),
                     options=("--grace", "3"))
        served.wait_line(b"Model loading took")
    if phase in ("ready", "stopping"):
        served.go.touch()
        served.wait_ready()
    if phase == "stopping":
        served.signal(signal.SIGTERM)
        served.wait_for(lambda: bool(served.events("forwarding signal to the engine's process group")))
    served.signal(signum)
    time.sleep(0.5)
    if phase != "stopping":
        assert served.proc.poll() is None, served.tail()
        assert served.ready_file.exists() == (phase == "ready")
    if first is not None:
        first.go.touch()
        first.wait_ready()
        first.signal(signal.SIGTERM)
        finished(first, 0)
    if phase == "stopping":
        finished(served, 137)  # the engine ignores SIGTERM: SIGKILLed after the grace, as without the signal
    else:
        if phase == "lock-wait":
            served.wait_ready()
        served.signal(signal.SIGTERM)
        finished(served, 0)
    assert any(e.get("signal") == signum.name for e in served.events("signal ignored: it does not stop safe-serve"))


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_second_stop_signal_while_stopping_keeps_the_stop(run: Callable[..., Run], signum: signal.Signals) -> None:
    """Another stop signal while the engine shuts down: still the one clean stop, 0."""
    served = run(scenario(serving(), sigterm_exit_delay=1.0))
    served.wait_ready()
    served.signal(signal.SIGTERM)
    served.wait_for(lambda: bool(served.events("forwarding signal to the engine's process group")))
    served.signal(signum)
    final = finished(served, 0)
    assert "stopped on SIGTERM" in final["reason"]


# --------------------------------------------------------------------------- stalled reader, liveness


def test_sigterm_with_a_stalled_stdout_reader_exits_within_grace_plus_flush(run: Callable[..., Run]) -> None:
    """Nobody ever reads our stdout again: after SIGTERM safe-serve still exits within --grace plus the bounded
    flush (5 s), saying how many bytes could not be written."""
    served = run(scenario([*serving(), go(), {"flood": 300_000, "width": 120}, {"hang": True}]), stdout_pipe=True)
    assert served.proc.stdout is not None
    reader = served.proc.stdout
    os.set_blocking(reader.fileno(), False)
    deadline = time.monotonic() + TIMEOUT
    while not served.ready_file.exists() and time.monotonic() < deadline:
        reader.read()
        time.sleep(0.02)
    served.go.touch()
    served.wait_for(lambda: bool(served.events("our output is not being read: pausing the engine's output until it "
                                               "is (back-pressure; nothing is dropped)")))
    started = time.monotonic()
    served.signal(signal.SIGTERM)
    assert served.wait(timeout=2 + 5 + 6) == 0, served.tail()  # --grace 2, flush 5, drain and slack
    took = time.monotonic() - started
    dropped = served.events("engine output dropped: our output was not read in time (bytes that could not be "
                            "written)")
    assert dropped and dropped[0]["stdout_bytes"] > 0, served.tail()
    assert took < 2 + 5 + 6
    reader.close()


def test_trickling_health_counts_as_failing_and_stops_the_watchdog(run: Callable[..., Run], tmp_path: Path) -> None:
    """A /health that answers one byte a second fails each probe at its total deadline: WATCHDOG=1 stops, and
    after --health-failures probes the engine is stopped with 70."""
    import threading

    address = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.05)
    messages: list[str] = []
    done = threading.Event()

    def receive() -> None:  # as systemd does: always reading
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                pass

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    served = run(scenario([*serving(), go(), {"healthy": "trickle"}, {"hang": True}]),
                 env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"}, options=("--health-failures", "2"))
    served.wait_ready()
    served.go.touch()
    final = finished(served, 70)
    time.sleep(0.2)
    done.set()
    receiver.join()
    sock.close()
    assert "/health failed 2 times in a row" in final["reason"]
    failed = [e for e in served.events("engine health check failed")]
    assert len(failed) == 2
    last_ping = len(messages) - 1 - messages[::-1].index("WATCHDOG=1")
    assert not any(m == "WATCHDOG=1" for m in messages[last_ping + 1:]) and "STOPPING=1" in "".join(
        messages[last_ping + 1:])
