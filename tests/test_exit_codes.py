"""Exit codes that mean one thing: our own output failing (EPIPE, a full disk) and stop signals
before any engine (a fresh `safe-serve` process each time)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAFE = [sys.executable, "-m", "launcher"]


def test_a_reader_that_goes_away_is_a_quiet_141() -> None:
    """`safe-serve models | head -1`: the reader left; 141 (128 + SIGPIPE), no "internal error" (was 1)."""
    proc = subprocess.Popen([*SAFE, "models"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before it writes: its first write meets EPIPE
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == b""


@pytest.mark.parametrize(("argv", "closed"), [
    pytest.param(["plan", "qwen2.5-7b", "--gpu", "nosuchgpu"], "stderr", id="usage-line-on-stderr"),
    pytest.param(["plan", "qwen2.5-7b", "--gpu", "nosuchgpu", "--json"], "stderr", id="json-usage-line"),
    pytest.param(["plan", "qwen2.5-7b", "--gpu", "nosuchgpu", "--json"], "stdout", id="json-error-object"),
])
def test_a_failure_whose_reader_went_away_is_a_quiet_141(argv: list[str], closed: str) -> None:
    """`safe-serve plan ... 2>&1 | head -0`: saying the failure meets EPIPE; 141 like a result's output,
    not a BrokenPipeError traceback and exit 1 (was 1)."""
    proc = subprocess.Popen([*SAFE, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    getattr(proc, closed).close()  # before it writes
    said = (proc.stderr if closed == "stdout" else proc.stdout).read().decode()
    assert proc.wait(timeout=60) == 141, said
    assert "Traceback" not in said


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_json_error_object_on_a_full_disk_is_one_line_and_74() -> None:
    """`safe-serve plan --gpu nosuchgpu --json > /dev/full`: the usage line, then one line and 74 (was an
    OSError traceback and exit 1)."""
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*SAFE, "plan", "qwen2.5-7b", "--gpu", "nosuchgpu", "--json"], cwd=REPO,
                              stdout=full, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 74
    lines = done.stderr.decode().splitlines()
    assert lines[0].startswith("safe-serve: --gpu 'nosuchgpu': not a GPU in the catalog")
    assert lines[1:] == ["safe-serve: cannot write the output: No space left on device"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_output_is_one_line_and_74() -> None:
    """`safe-serve plan ... > /dev/full`: one clear line and 74 (EX_IOERR), not an internal error (was 1)."""
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*SAFE, "plan", "qwen2.5-7b", "--gpu", "h100"], cwd=REPO, stdout=full,
                              stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 74
    err = done.stderr.decode()
    assert err.strip() == "safe-serve: cannot write the output: No space left on device"


def _wait_for_handlers(pid: int, timeout_s: float = 30.0) -> None:
    """Until the process catches SIGTERM and SIGUSR1 (its SigCgt mask in /proc): on a loaded machine
    the interpreter alone can take longer than any fixed delay."""
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGUSR1 - 1))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return  # already gone: the caller reads its code
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        if caught & wanted == wanted:
            return
        time.sleep(0.002)


@pytest.mark.parametrize(("argv", "code"), [
    pytest.param(["qwen2.5-7b", "--gpu", "h100", "--dry-run"], 0, id="serve-is-0"),
    pytest.param(["plan", "qwen2.5-7b", "--gpu", "h100"], 128 + signal.SIGTERM, id="plan-is-143"),
])
def test_sigterm_before_any_engine(argv: list[str], code: int) -> None:
    """A stop signal while safe-serve starts (imports, probe, plan): one line and the documented code, never a
    death by default action; SIGUSR1 on the way is ignored. (The command takes ~0.3 s: the signals are sent
    as soon as its handlers are installed, during the imports; tests/test_faults.py covers the start-lock wait.)"""
    for _attempt in range(3):
        proc = subprocess.Popen([*SAFE, *argv], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for_handlers(proc.pid)  # a signal before Python runs our code dies by default action, by design
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        returncode = proc.wait(timeout=60)
        if "stopped on" in err or returncode < 0:
            break
    assert returncode == code, err
    assert "stopped on SIGTERM before the engine started" in err and "Traceback" not in err
