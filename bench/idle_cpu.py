"""CPU used by the supervisor while the engine idles after ready (target: under 1 %).

Starts the stand-in engine under a Supervisor in this process (health polling, group guard,
systemd keep-alives all on), waits until it is ready, then samples this process's
``psutil.Process().cpu_times()`` over a window (default 20 s) and prints the share of one
core. The measuring thread sleeps for the whole window, so nearly all CPU counted is the
supervision loop's. The engine's and the guard's CPU are printed separately.

Usage: ``python bench/idle_cpu.py [SECONDS]``
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import structlog  # noqa: E402

from launcher.supervise import (  # noqa: E402
    EngineCommand,
    HealthCheck,
    Supervisor,
    SupervisorOptions,
)

# Lines quoted in /work/shared/reference/vllm-memory.md (§1) and uvicorn's startup lines.
SCENARIO = {
    "engine": "vllm",
    "steps": [
        {"text": "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x"},
        {"text": "Starting vLLM server on http://0.0.0.0:${port}"},
        {"text": "INFO:     Started server process [${pid}]", "stream": "stderr"},
        {"text": "INFO:     Application startup complete.", "stream": "stderr"},
        {"serve": True},
    ],
}


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=open(os.devnull, "w")))  # noqa: SIM115
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = (sys.executable, str(REPO / "tests" / "standin_engine.py"), "--scenario", json.dumps(SCENARIO),
            "--port", str(port))
    lines = [0]

    def on_line(stream: str, line: bytes) -> None:
        lines[0] += 1
        if b"KV cache" in line:
            pass

    ready = threading.Event()
    devnull = os.open(os.devnull, os.O_WRONLY)
    options = SupervisorOptions(health=HealthCheck("127.0.0.1", port), stdout_fd=devnull, stderr_fd=devnull)
    sup: Supervisor

    def on_ready() -> None:
        sup.mark_ready()
        ready.set()

    sup = Supervisor(EngineCommand(argv, os.environ), options, on_line=on_line, on_ready=on_ready)
    report: dict[str, float] = {}

    def measure() -> None:
        if not ready.wait(30):
            sup.request_stop("engine never became ready", 1)
            return
        time.sleep(1.0)  # let the health thread finish
        me = psutil.Process()
        engine = psutil.Process(sup.engine_pid)
        guard = [child for child in me.children() if child.pid != engine.pid]
        t0, c0, e0 = time.monotonic(), cpu_seconds(me), cpu_seconds(engine)
        g0 = sum(cpu_seconds(g) for g in guard)
        time.sleep(window)
        t1, c1, e1 = time.monotonic(), cpu_seconds(me), cpu_seconds(engine)
        g1 = sum(cpu_seconds(g) for g in guard)
        report.update(wall=t1 - t0, ours=c1 - c0, engine=e1 - e0, guard=g1 - g0, threads=me.num_threads())
        sup.request_stop("measurement done", 0)

    threading.Thread(target=measure, daemon=True).start()
    outcome = sup.run()
    os.close(devnull)
    if not report:
        raise SystemExit(f"no measurement: {outcome.reason}")
    print(f"idle window {report['wall']:.1f} s after ready ({lines[0]} engine lines seen, "
          f"{report['threads']:.0f} threads)")
    print(f"supervisor process: {report['ours']:.3f} CPU s = {100 * report['ours'] / report['wall']:.3f} % of one core")
    print(f"group guard:        {report['guard']:.3f} CPU s")
    print(f"stand-in engine:    {report['engine']:.3f} CPU s (its own idle cost, not ours)")
    print(f"outcome: exit {outcome.exit_code}, {outcome.reason}")


if __name__ == "__main__":
    main()
