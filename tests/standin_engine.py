"""A stand-in for ``vllm serve`` / ``sglang.launch_server``: replays a scenario of log lines.

Usage::

    python tests/standin_engine.py --scenario FILE.{yaml,json} [--port N] [--record DIR]
                                   [--pid-file FILE] [--env-file FILE] [--time-scale F]

The scenario may also come from ``$STANDIN_SCENARIO`` (a path, or inline JSON starting with
``{``). It holds the log text; this script invents none. Top-level keys::

    engine: vllm | sglang        # default stream: vllm logs to stdout, sglang to stderr
    time_scale: 1.0              # multiplies every step delay (compress real timings)
    on_sigterm: graceful | ignore   # SIGTERM and SIGINT alike
    sigterm_exit_delay: 0.2      # seconds (unscaled) between the signal and the exit
    sigterm_exit_code: 0
    shutdown_lines: [{stream, text}]   # printed on a graceful stop
    grandchild: false            # spawn a child in our process group (like vLLM's EngineCore)
    grandchild_ignores_sigterm: false
    steps: [...]                 # run in order, then idle until a signal

Steps (each may carry ``delay: seconds`` before it and ``stream: stdout|stderr``)::

    {text: "a log line"}                   # + "\\n"; ${port} and ${pid} are substituted
    {raw_hex: "ff fe 0a"}                  # exact bytes (invalid UTF-8, no implied newline)
    {partial: "no newline"}                # text without "\\n" (e.g. a last line at EOF)
    {long_line: 4194304, chunk: 65536, pause: 0.01, fill: "x"}   # one long line, in pieces
    {flood: 100000, width: 120}            # N numbered ASCII lines of `width` bytes each
    {serve: true}                          # start answering GET /health with 200 on --port
    {fatal: {type: ValueError, message: "...", exit: 1}}   # traceback on stderr, exit code
    {crash: SIGSEGV}                       # die of a signal (core dumps disabled)
    {exit: 0}
    {hang: true}                           # wait for a signal (e.g. the KV line never comes)
    {orphan: 0.5}                          # leave an orphan that exits after 0.5 s (double fork)

``--record DIR`` appends every byte written to ``DIR/stdout.bin`` / ``DIR/stderr.bin``, so a
test can compare what came out of the supervisor byte for byte. ``--pid-file`` gets
``{"engine": pid, "grandchild": pid, "orphans": [pid, ...]}`` as JSON; ``--env-file`` the environment we got.
"""

from __future__ import annotations

import argparse
import builtins
import http.server
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, BinaryIO

import yaml

_STREAM_FDS = {"stdout": 1, "stderr": 2}
_DEFAULT_STREAM = {"vllm": "stdout", "sglang": "stderr"}
_GRANDCHILD = """\
import signal, time
if {ignore}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(3600)
"""

_ORPHAN = """\
import os, time
pid = os.fork()
if pid == 0:
    time.sleep({lifetime})
    os._exit(0)
print(pid)
"""


class Emitter:
    """Writes to fd 1/2 unbuffered and keeps an exact copy of each stream when recording."""

    def __init__(self, record_dir: Path | None) -> None:
        self._copies: dict[str, BinaryIO] = {}
        if record_dir is not None:
            record_dir.mkdir(parents=True, exist_ok=True)
            self._copies = {name: open(record_dir / f"{name}.bin", "ab") for name in _STREAM_FDS}  # noqa: SIM115

    def write(self, stream: str, data: bytes) -> None:
        view = memoryview(data)
        fd = _STREAM_FDS[stream]
        while view:
            view = view[os.write(fd, view) :]
        if self._copies:
            self._copies[stream].write(data)

    def flush(self) -> None:
        for copy in self._copies.values():
            copy.flush()


class StandinEngine:
    """Plays one scenario; SIGTERM/SIGINT set an event that every wait watches."""

    def __init__(self, scenario: dict[str, Any], args: argparse.Namespace) -> None:
        self.scenario = scenario
        self.port = args.port
        self.scale = args.time_scale if args.time_scale is not None else float(scenario.get("time_scale", 1.0))
        self.default_stream = _DEFAULT_STREAM.get(scenario.get("engine", "vllm"), "stdout")
        self.out = Emitter(args.record)
        self.stop = threading.Event()
        self.pid_file: Path | None = args.pid_file
        self.grandchild: subprocess.Popen[bytes] | None = None
        self.orphans: list[int] = []

    def run(self) -> int:
        self._install_signals()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSEGV/SIGQUIT tests leave no core files
        if self.scenario.get("grandchild"):
            ignore = bool(self.scenario.get("grandchild_ignores_sigterm"))
            self.grandchild = subprocess.Popen([sys.executable, "-c", _GRANDCHILD.format(ignore=ignore)])
        self._write_pids()
        for step in self.scenario.get("steps", []):
            if self._wait(float(step.get("delay", 0.0)) * self.scale):
                return self._graceful_exit()
            code = self._step(step)
            self.out.flush()
            if code is not None:
                return code
            if self.stop.is_set():
                return self._graceful_exit()
        self.stop.wait()
        return self._graceful_exit()

    def _step(self, step: dict[str, Any]) -> int | None:
        stream = step.get("stream", self.default_stream)
        if "text" in step:
            self.out.write(stream, self._subst(step["text"]).encode() + b"\n")
        elif "raw_hex" in step:
            self.out.write(stream, bytes.fromhex(step["raw_hex"]))
        elif "partial" in step:
            self.out.write(stream, self._subst(step["partial"]).encode())
        elif "long_line" in step:
            self._long_line(stream, int(step["long_line"]), step)
        elif "flood" in step:
            self._flood(stream, int(step["flood"]), int(step.get("width", 120)))
        elif "serve" in step:
            _serve_health(self.port)
        elif "fatal" in step:
            return self._fatal(step["fatal"])
        elif "crash" in step:
            self._crash(step["crash"])
        elif "exit" in step:
            return int(step["exit"])
        elif "hang" in step:
            self.stop.wait()
        elif "orphan" in step:
            self._orphan(float(step["orphan"]))
        return None

    def _write_pids(self) -> None:
        if self.pid_file is not None:
            grandchild = self.grandchild.pid if self.grandchild else None
            pids = {"engine": os.getpid(), "grandchild": grandchild, "orphans": self.orphans}
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids))
            tmp.replace(self.pid_file)

    def _orphan(self, lifetime: float) -> None:
        code = _ORPHAN.format(lifetime=lifetime)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        self.orphans.append(int(done.stdout))
        self._write_pids()

    def _long_line(self, stream: str, size: int, step: dict[str, Any]) -> None:
        chunk = int(step.get("chunk", 65536))
        piece = str(step.get("fill", "x")).encode()[:1] * chunk
        pause = float(step.get("pause", 0.0))
        left = size
        while left > 0:
            self.out.write(stream, piece[: min(chunk, left)])
            left -= chunk
            if pause and self.stop.wait(pause):
                return
        if step.get("newline", True):
            self.out.write(stream, b"\n")

    def _flood(self, stream: str, count: int, width: int) -> None:
        render = flood_template(width).__mod__
        for start in range(0, count, 4096):
            self.out.write(stream, b"".join(map(render, range(start, min(count, start + 4096)))))
            if self.stop.is_set():
                return

    def _fatal(self, spec: dict[str, Any]) -> int:
        exc_type = getattr(builtins, str(spec.get("type", "RuntimeError")), RuntimeError)
        try:
            raise exc_type(self._subst(str(spec.get("message", ""))))
        except BaseException as exc:  # noqa: BLE001  # we want Python's own traceback text
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.out.write("stderr", text.encode())
        self.out.flush()
        return int(spec.get("exit", 1))

    def _crash(self, name: str) -> None:
        signum = signal.Signals[name] if isinstance(name, str) else signal.Signals(int(name))
        self.out.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _graceful_exit(self) -> int:
        for line in self.scenario.get("shutdown_lines", []):
            self.out.write(line.get("stream", self.default_stream), self._subst(line["text"]).encode() + b"\n")
        self.out.flush()
        threading.Event().wait(float(self.scenario.get("sigterm_exit_delay", 0.2)))
        if self.grandchild is not None and self.grandchild.poll() is None:
            self.grandchild.terminate()  # a tidy engine stops its children; the group kill covers the rest
        return int(self.scenario.get("sigterm_exit_code", 0))

    def _wait(self, seconds: float) -> bool:
        return self.stop.wait(seconds) if seconds > 0 else self.stop.is_set()

    def _install_signals(self) -> None:
        handler: Any = signal.SIG_IGN if self.scenario.get("on_sigterm") == "ignore" else self._on_signal
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop.set()

    def _subst(self, text: str) -> str:
        return text.replace("${port}", str(self.port)).replace("${pid}", str(os.getpid()))


def flood_template(width: int) -> bytes:
    """``%``-template of a flood line: a zero-padded number, dots, a newline; ``width`` bytes."""
    rendered_head = len(b"flood 0000000000 ")
    return b"flood %010d " + b"." * (width - rendered_head - 1) + b"\n"


def flood_line(index: int, width: int) -> bytes:
    """Line ``index`` of a flood, exactly ``width`` bytes for indices below 10**10."""
    return flood_template(width) % index


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's naming
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # keep stderr exact
        pass


def _serve_health(port: int | None) -> None:
    if port is None:
        return
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _HealthHandler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()


def load_scenario(source: str) -> dict[str, Any]:
    """Read a scenario from a YAML/JSON file, or from inline JSON."""
    text = source if source.lstrip().startswith("{") else Path(source).read_text()
    data = yaml.safe_load(text)  # YAML is a superset of JSON
    if not isinstance(data, dict):
        raise SystemExit(f"standin: scenario must be a mapping, got {type(data).__name__}")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=os.environ.get("STANDIN_SCENARIO"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--pid-file", type=Path)
    parser.add_argument("--env-file", type=Path)
    parser.add_argument("--time-scale", type=float)
    args = parser.parse_args(argv)
    if not args.scenario:
        parser.error("--scenario or $STANDIN_SCENARIO is required")
    if args.env_file is not None:
        args.env_file.write_text(json.dumps(dict(os.environ)))
    code = StandinEngine(load_scenario(args.scenario), args).run()
    os._exit(code)  # like a real engine: no interpreter teardown noise, threads or not


if __name__ == "__main__":
    sys.exit(main())
