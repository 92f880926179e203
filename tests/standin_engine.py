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
    extends: other.yaml          # start from another scenario (path relative to this file): its
                                 # mappings are merged, other keys replaced; a step {base: [A, B]}
                                 # splices in its steps from the one with `id: A` up to `id: B`
    log_failure: true            # vLLM: false leaves out the failure's logged copy on stdout
    vars: {name: value}          # more ${name} values (e.g. --standin-set vars.go=/tmp/go)

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
    {await_file: "${go}"}                  # wait until the file exists (or a signal comes)
    {orphan: 0.5}                          # leave an orphan that exits after 0.5 s (double fork)

``--record DIR`` appends every byte written to ``DIR/stdout.bin`` / ``DIR/stderr.bin``, so a
test can compare what came out of the supervisor byte for byte. ``--pid-file`` gets
``{"engine": pid, "grandchild": pid, "orphans": [pid, ...]}`` as JSON; ``--env-file`` the environment we got.
``--argv-log FILE`` appends ``{"pid": pid, "argv": [...]}`` (one JSON line per start).

Engine flags
------------
Everything we do not know (the model, ``--max-model-len 4096``, ``--mem-fraction-static=0.8``) is
read like the engines' argparse reads it: the last spelling of a flag wins, ``_`` equals ``-``.
``--standin-set KEY=VALUE`` (repeatable) overrides a scenario value (dotted key, YAML value),
e.g. ``--standin-set vllm.kv_bytes=4294967296``. With a ``vllm:`` or ``sglang:`` section the
stand-in sizes its KV cache from the flags as the engine does, and every ``${name}`` below can
be used in ``text``/``partial``/``fail`` messages::

    vllm:                        # vLLM 0.32 (vllm-memory.md sections 2-4)
      total_bytes | total_gib    # cudaMemGetInfo total
      free_bytes | free_gib      # free at startup (default: total)
      non_kv_bytes | kv_bytes    # KV = ceil(total x utilization) - non_kv, or a fixed KV budget
      bytes_per_token            # KV bytes per token over all layers (block = this x block size)
      max_model_len, gpu_memory_utilization, block_size   # defaults when the flag is absent
      device: cuda:0
    -> ${util} ${total_gib} ${free_gib} ${requested_gib} ${kv_gib} ${check_gib} ${needed_gib}
       ${max_model_len} ${max_model_len_sep} and ${kv_tokens} (1,234 style) ${num_blocks} ${concurrency} (%.2f)
       ${estimated_max_model_len} ${device}

    sglang:                      # SGLang 0.5.23 (sglang-memory.md section 2)
      pre_load_gib               # P, "Load weight begin. avail mem="
      weights_gib                # what the load takes; available after it A = P - weights
      cell_bytes                 # KV bytes per token (K and V, all layers)
      context_length, mem_fraction_static, page_size, chunked_prefill_size   # flag defaults
      local_free_gib             # this rank's free memory, for the tp > 1 balance check
      graphs_gib                 # taken after the pool (CUDA graphs), for available_gpu_mem
    -> ${fraction} ${pre_load_gib} ${avail_gib} ${weights_gib} ${kv_tokens} ${k_gib} ${v_gib}
       ${context_len} ${max_running_requests} ${chunked_prefill_size} ${available_gpu_mem}
       ${minimum} ${suggested}

Always: ${port} ${pid} ${model} ${ts} (SGLang's "%Y-%m-%d %H:%M:%S") ${vts} (vLLM's "%m-%d %H:%M:%S").

More steps::

    {check: startup_free | kv}           # vLLM's checks: fail like vLLM when they do not pass
    {check: balance | pool}              # SGLang's: unbalanced tp ranks; weights leave nothing / no tokens
    {fail: {type: torch.OutOfMemoryError, message: "..."}}   # any error, reported as the engine does
    {serve: starting}                    # /health answers 503 (SGLang before warmup) ...
    {healthy: true}                      # ... and 200 from here on
    {healthy: trickle}                   # 200, one byte a second (a stuck server that never times out)

A failure is reported the engine's way: vLLM logs ``EngineCore failed to start.`` with the
traceback on stdout (``\\r\\n``-joined, one prefix per line), prints the same traceback on
stderr (``Process EngineCore:``), then the API server's ``RuntimeError`` traceback, exit 1;
SGLang logs ``Scheduler hit an exception: <traceback>`` and ``Received sigquit from a child
process. ...`` on stderr, then kills its own process tree with SIGKILL.
"""

from __future__ import annotations

import argparse
import builtins
import http.server
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

import yaml

_STREAM_FDS = {"stdout": 1, "stderr": 2}
_DEFAULT_STREAM = {"vllm": "stdout", "sglang": "stderr"}
_GRANDCHILD = """\
import signal, time
signal.signal(signal.SIGINT, signal.SIG_DFL)  # a worker dies of Ctrl-C quietly, like vLLM's
if {ignore}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)  # the parent goes on once our handlers are in place
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


GiB = 1 << 30
_SUFFIXES = {"k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
             "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# --------------------------------------------------------------------------- engine flags


def parse_engine_flags(tokens: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Positionals and ``--flag value`` pairs as argparse would read them (last one wins)."""
    positionals: list[str] = []
    flags: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            name = "--" + name[2:].replace("_", "-")
            if eq:
                flags[name] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                flags[name] = tokens[i + 1]
                i += 1
            else:
                flags[name] = True
        else:
            positionals.append(token)
        i += 1
    return positionals, flags


def human_int(text: str) -> int:
    """vLLM's human_readable_int: ``16M`` is 16 x 2**20, ``25.6k`` is 25600."""
    text = str(text).strip()
    if text and text[-1] in _SUFFIXES:
        return int(float(text[:-1]) * _SUFFIXES[text[-1]])
    return int(text)


def format_gib(value: float) -> str:
    """vLLM's format_gib: bytes / 2**30 rounded to 2 places, printed with str()."""
    return f"{round(value / GiB, 2)}"


def _size(spec: dict[str, Any], key: str, default: int | None = None) -> int | None:
    if f"{key}_bytes" in spec:
        return int(spec[f"{key}_bytes"])
    if f"{key}_gib" in spec:
        return int(float(spec[f"{key}_gib"]) * GiB)
    return default


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data["a"]["b"] = value`` for ``"a.b"``, creating mappings on the way."""
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


class EngineFailure(Exception):
    """A check did not pass: the engine raises ``exc_type(message)`` and dies its own way."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message


class VllmSizing:
    """vLLM 0.32's startup arithmetic for one uniform full-attention model (vllm-memory.md 2-4)."""

    def __init__(self, spec: dict[str, Any], flags: dict[str, Any]) -> None:
        self.device = str(spec.get("device", "cuda:0"))
        self.util = float(flags.get("--gpu-memory-utilization", spec.get("gpu_memory_utilization", 0.9)))
        self.total = _size(spec, "total") or 0
        self.free = _size(spec, "free", self.total) or 0
        self.requested = math.ceil(self.total * self.util)
        self.block_size = int(flags.get("--block-size", spec.get("block_size", 16)))
        self.bytes_per_block = int(spec["bytes_per_token"]) * self.block_size
        self.max_model_len = int(flags.get("--max-model-len", spec.get("max_model_len", 4096)))
        if flags.get("--kv-cache-memory-bytes") not in (None, True):
            self.kv = human_int(flags["--kv-cache-memory-bytes"])
        elif _size(spec, "kv") is not None:
            self.kv = int(_size(spec, "kv") or 0)
        else:
            self.kv = self.requested - int(_size(spec, "non_kv") or 0)
        self.num_blocks = max(self.kv // self.bytes_per_block, 0)
        self.check_memory = self.kv - self.bytes_per_block  # the null block is held back
        self.blocks_per_request = -(-self.max_model_len // self.block_size)
        self.needed = self.bytes_per_block * self.blocks_per_request
        self.concurrency = self.num_blocks / self.blocks_per_request
        self.tokens = int(self.concurrency * self.max_model_len)
        self.estimate = min(max(self.num_blocks - 1, 0) * self.block_size, self.max_model_len)

    def values(self) -> dict[str, str]:
        return {
            "util": f"{self.util}", "total_gib": format_gib(self.total), "free_gib": format_gib(self.free),
            "requested_gib": format_gib(self.requested), "kv_gib": format_gib(self.kv),
            "check_gib": format_gib(self.check_memory), "needed_gib": format_gib(self.needed),
            "max_model_len": str(self.max_model_len), "max_model_len_sep": f"{self.max_model_len:,}",
            "num_blocks": str(self.num_blocks),
            "kv_tokens": f"{self.tokens:,}", "concurrency": f"{self.concurrency:.2f}",
            "estimated_max_model_len": str(self.estimate), "device": self.device,
        }

    def check(self, name: str) -> None:
        if name == "startup_free" and self.free < self.requested:
            raise EngineFailure("ValueError", (
                f"Free memory on device {self.device} ({format_gib(self.free)}/{format_gib(self.total)} GiB) on "
                f"startup is less than desired GPU memory utilization ({self.util}, {format_gib(self.requested)} "
                "GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."))
        if name == "kv":
            if self.check_memory <= 0:
                raise EngineFailure("ValueError", (
                    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                    "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                    "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
                    "more details."))
            if self.needed > self.check_memory:
                estimated = (f"Based on the available memory, the estimated maximum model length is {self.estimate}. "
                             if self.estimate > 0 else "")
                raise EngineFailure("ValueError", (
                    f"To serve at least one request with the model's max seq len ({self.max_model_len}), "
                    f"({format_gib(self.needed)} GiB KV cache is needed, which is larger than the available KV cache "
                    f"memory ({format_gib(self.check_memory)} GiB). {estimated}Try increasing "
                    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
                    "`max_model_len` when initializing the engine. See "
                    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."))


class SglangSizing:
    """SGLang 0.5.23's pool sizing: KV = f x P - (P - A), in cells (sglang-memory.md 2)."""

    def __init__(self, spec: dict[str, Any], flags: dict[str, Any]) -> None:
        self.fraction = float(flags.get("--mem-fraction-static", spec.get("mem_fraction_static", 0.88)))
        self.tp = int(flags.get("--tp-size", flags.get("--tensor-parallel-size", 1)))
        self.pre_load = float(spec["pre_load_gib"])
        self.weights = float(spec["weights_gib"])
        self.avail = self.pre_load - self.weights
        self.local_free = float(spec.get("local_free_gib", self.pre_load))
        self.cell = int(spec["cell_bytes"])
        self.page = int(flags.get("--page-size", spec.get("page_size", 1)))
        self.context_len = int(flags.get("--context-length", spec.get("context_length", 4096)))
        self.chunked_prefill = int(flags.get("--chunked-prefill-size", spec.get("chunked_prefill_size", 8192)))
        self.rest = self.avail - self.pre_load * (1 - self.fraction)
        self.minimum = 1 - self.avail / self.pre_load
        self.suggested = math.ceil(self.minimum * 1000) / 1000
        tokens = max(int(self.rest * GiB), 0) // self.cell // self.page * self.page
        if flags.get("--max-total-tokens") not in (None, True):
            tokens = min(tokens, int(flags["--max-total-tokens"])) // self.page * self.page
        self.tokens = tokens
        half = (tokens + self.page) * self.cell / 2 / GiB
        self.k_gib = self.v_gib = half
        estimated = min(max(int(tokens / self.context_len * 512), 2048), 4096) if tokens else 0
        self.max_running = min(estimated, tokens // 2)
        self.available_after = max(self.avail - 2 * half - float(spec.get("graphs_gib", 0.5)), 0.0)

    def values(self) -> dict[str, str]:
        return {
            "fraction": f"{self.fraction}", "pre_load_gib": f"{self.pre_load:.2f}", "avail_gib": f"{self.avail:.2f}",
            "weights_gib": f"{self.weights:.2f}", "kv_tokens": str(self.tokens), "k_gib": f"{self.k_gib:.2f}",
            "v_gib": f"{self.v_gib:.2f}", "context_len": str(self.context_len),
            "max_running_requests": str(self.max_running), "chunked_prefill_size": str(self.chunked_prefill),
            "available_gpu_mem": f"{self.available_after:.2f}", "minimum": f"{self.minimum:.4f}",
            "suggested": f"{self.suggested:.3f}",
        }

    def check(self, name: str) -> None:
        if name == "balance" and self.tp > 1 and self.pre_load < self.local_free * 0.9:
            pre_model_load_memory, local_gpu_memory = self.pre_load, self.local_free
            raise EngineFailure("RuntimeError", (
                "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                f"{pre_model_load_memory=}, {local_gpu_memory=}, {local_gpu_memory * 0.9=}"))
        if name == "pool":
            if self.rest <= 0:
                raise EngineFailure("ValueError", (
                    f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={self.fraction}. "
                    f"Raise --mem-fraction-static above {self.suggested:.3f} (minimum viable = 1 - available/pre = "
                    f"{self.minimum:.4f}). If using speculative decoding, draft weights are now counted."))
            if self.tokens <= 0:
                raise EngineFailure("RuntimeError", "Not enough memory. Please try to increase --mem-fraction-static.")


def _exception_class(name: str) -> type[BaseException]:
    """A builtin exception, or a stand-in class printed as ``module.Name`` (torch.OutOfMemoryError)."""
    module, _, short = name.rpartition(".")
    builtin = getattr(builtins, short, None)
    if not module and isinstance(builtin, type) and issubclass(builtin, BaseException):
        return builtin
    return type(short, (RuntimeError,), {"__module__": module or "__main__"})


def _traceback_text(exc_type: str, message: str) -> str:
    try:
        raise _exception_class(exc_type)(message) from None
    except BaseException as exc:  # noqa: BLE001  # we want Python's own traceback text
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


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

    def __init__(self, scenario: dict[str, Any], args: argparse.Namespace,
                 engine_args: list[str] | None = None) -> None:
        self.scenario = scenario
        self.port = args.port
        self.scale = args.time_scale if args.time_scale is not None else float(scenario.get("time_scale", 1.0))
        self.engine = str(scenario.get("engine", "vllm"))
        self.default_stream = _DEFAULT_STREAM.get(self.engine, "stdout")
        positionals, self.flags = parse_engine_flags(list(engine_args or []))
        self.model = str(self.flags.get("--model-path") or self.flags.get("--model")
                         or (positionals[0] if positionals else ""))
        self.sizing: VllmSizing | SglangSizing | None = None
        if isinstance(scenario.get("vllm"), dict):
            self.sizing = VllmSizing(scenario["vllm"], self.flags)
        elif isinstance(scenario.get("sglang"), dict):
            self.sizing = SglangSizing(scenario["sglang"], self.flags)
        self.values = self.sizing.values() if self.sizing is not None else {}
        self.values.update({str(k): str(v) for k, v in (scenario.get("vars") or {}).items()})
        self.health: _Health | None = None
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
            self.grandchild = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GRANDCHILD.format(ignore=ignore)],
                                               stdout=subprocess.PIPE)
            assert self.grandchild.stdout is not None
            self.grandchild.stdout.readline()  # a signal to the group now finds it ready
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
            self.health = _serve_health(self.port, 503 if step["serve"] == "starting" else 200)
        elif "healthy" in step:
            if self.health is not None:
                self.health.status = 200 if step["healthy"] else 503
                self.health.trickle = step["healthy"] == "trickle"
        elif "fatal" in step:
            return self._fatal(step["fatal"])
        elif "check" in step:
            failure = self._check(str(step["check"]))
            if failure is not None:
                return self._engine_failure(failure.exc_type, failure.message)
        elif "fail" in step:
            spec = step["fail"]
            return self._engine_failure(str(spec.get("type", "RuntimeError")),
                                        self._subst(str(spec.get("message", ""))))
        elif "crash" in step:
            self._crash(step["crash"])
        elif "exit" in step:
            return int(step["exit"])
        elif "hang" in step:
            self.stop.wait()
        elif "await_file" in step:
            path = Path(self._subst(str(step["await_file"])))
            while not path.exists() and not self.stop.wait(0.02):
                pass
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

    def _check(self, name: str) -> EngineFailure | None:
        try:
            if self.sizing is not None:
                self.sizing.check(name)
        except EngineFailure as failure:
            return failure
        return None

    def _engine_failure(self, exc_type: str, message: str) -> int:
        """Die of an error the way the engine does (see the module docstring)."""
        text = _traceback_text(exc_type, message)
        if self.engine == "sglang":
            self.out.write("stderr", f"{self._stamp()} Scheduler hit an exception: {text}\n".encode())
            self.out.write("stderr", f"{self._stamp()} Received sigquit from a child process. It usually means the "
                                     "child failed.\n".encode())
            self._crash("SIGKILL")  # kill_process_tree(os.getpid()) ends with itself.kill()
        if self.scenario.get("log_failure", True):
            prefix = f"(EngineCore pid={os.getpid()}) ERROR {time.strftime('%m-%d %H:%M:%S')} [core.py:1510] "
            logged = ["EngineCore failed to start.", *text.rstrip("\n").split("\n")]
            self.out.write("stdout", ("\r\n".join(prefix + line for line in logged) + "\n").encode())
        self.out.write("stderr", f"Process EngineCore:\n{text}".encode())
        self.out.write("stderr", _traceback_text(
            "RuntimeError",
            "Engine core initialization failed. See root cause above. Failed core proc(s): {}").encode())
        self.out.flush()
        return 1

    def _stamp(self) -> str:
        return time.strftime("[%Y-%m-%d %H:%M:%S]")

    def _crash(self, name: str) -> None:
        signum = signal.Signals[name] if isinstance(name, str) else signal.Signals(int(name))
        self.out.flush()
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught, nor reset
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
        """``${name}``: the port, pid, model, timestamps and the sizing's numbers; others stay."""
        if "${" not in text:
            return text
        now = time.time()
        values = {**self.values, "port": str(self.port), "pid": str(os.getpid()), "model": self.model,
                  "ts": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
                  "vts": time.strftime("%m-%d %H:%M:%S", time.localtime(now))}
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def flood_template(width: int) -> bytes:
    """``%``-template of a flood line: a zero-padded number, dots, a newline; ``width`` bytes."""
    rendered_head = len(b"flood 0000000000 ")
    return b"flood %010d " + b"." * (width - rendered_head - 1) + b"\n"


def flood_line(index: int, width: int) -> bytes:
    """Line ``index`` of a flood, exactly ``width`` bytes for indices below 10**10."""
    return flood_template(width) % index


_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


class _Health(http.server.ThreadingHTTPServer):
    status = 200  # what GET /health answers; 503 while "starting"
    trickle = False  # answer one byte a second
    daemon_threads = True


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    server: _Health

    def do_GET(self) -> None:  # http.server's naming
        if self.server.trickle:
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(1.0)
            except OSError:
                pass  # the prober gave up and closed: keep stderr exact
            return
        self.send_response(self.server.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # keep stderr exact
        pass


def _serve_health(port: int | None, status: int = 200) -> _Health | None:
    if port is None:
        return None
    server = _Health(("127.0.0.1", port), _HealthHandler)
    server.status = status
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def load_scenario(source: str) -> dict[str, Any]:
    """Read a scenario from a YAML/JSON file, or from inline JSON; resolve ``extends``."""
    inline = source.lstrip().startswith("{")
    text = source if inline else Path(source).read_text()
    data = yaml.safe_load(text)  # YAML is a superset of JSON
    if not isinstance(data, dict):
        raise SystemExit(f"standin: scenario must be a mapping, got {type(data).__name__}")
    if "extends" in data:
        base_path = Path(str(data.pop("extends")))
        if not base_path.is_absolute():
            base_path = (Path.cwd() if inline else Path(source).resolve().parent) / base_path
        data = _extend(load_scenario(str(base_path)), data)
    return data


def _extend(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``base`` (mappings merged, the rest replaced); ``{base: [FROM, TO]}`` steps
    splice in the base's steps from the one with ``id: FROM`` up to, not including, ``id: TO``
    (null: from the start, to the end)."""
    merged = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    base_steps = list(base.get("steps", []))
    ids = {step.get("id"): index for index, step in enumerate(base_steps) if step.get("id")}
    steps: list[dict[str, Any]] = []
    for step in child.get("steps", base_steps):
        if "base" in step:
            start, stop = step["base"]
            steps.extend(base_steps[ids[start] if start else 0 : ids[stop] if stop else len(base_steps)])
        else:
            steps.append(step)
    merged["steps"] = steps
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--scenario", default=os.environ.get("STANDIN_SCENARIO"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--pid-file", type=Path)
    parser.add_argument("--env-file", type=Path)
    parser.add_argument("--argv-log", type=Path)
    parser.add_argument("--time-scale", type=float)
    parser.add_argument("--standin-set", action="append", default=[], metavar="KEY=VALUE")
    args, engine_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not args.scenario:
        parser.error("--scenario or $STANDIN_SCENARIO is required")
    if args.env_file is not None:
        args.env_file.write_text(json.dumps(dict(os.environ)))
    if args.argv_log is not None:
        with args.argv_log.open("a") as log:
            log.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:] if argv is None else argv}) + "\n")
    scenario = load_scenario(args.scenario)
    for item in args.standin_set:
        key, _, value = item.partition("=")
        set_path(scenario, key, yaml.safe_load(value))
    code = StandinEngine(scenario, args, engine_args).run()
    os._exit(code)  # like a real engine: no interpreter teardown noise, threads or not


if __name__ == "__main__":
    sys.exit(main())
