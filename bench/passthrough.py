"""Pass-through throughput: N lines of 120 bytes from a generator child, through the supervisor.

Compares, for the same generator (the stand-in engine's flood mode) and the same sink
(``sha256sum`` reading a pipe, which also checks that no byte was lost or reordered):

* generator -> /dev/null                 (the generator's own ceiling)
* generator | cat | sha256sum            (C copy loop)
* generator | python readline loop | sha256sum   (with the same prefilter per line)
* generator -> Supervisor (no hook) -> sha256sum
* generator -> Supervisor (on_line with a ``b"KV cache" in line`` prefilter) -> /dev/null, sha256sum
* generator -> Supervisor (``line_filter=(b"KV cache",)``: no Python call per line) -> sha256sum
* generator -> Supervisor (a hook that decodes every line before matching) -> /dev/null
* StreamPump alone on pre-built chunks -> /dev/null (supervisor-side capacity, no child)

Usage: ``python bench/passthrough.py [N_LINES [REPEAT]]`` (default 2,000,000 lines, best of 3,
variants run round-robin). Prints figures only; "hash ok" means the sink's sha256 matched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import structlog  # noqa: E402
from standin_engine import flood_template  # noqa: E402  (tests/ is put on sys.path above)

from launcher.supervise import EngineCommand, StreamPump, Supervisor, SupervisorOptions  # noqa: E402

WIDTH = 120
_PY_LOOP = """\
import sys
out = sys.stdout.buffer
n = hits = 0
for line in sys.stdin.buffer:
    out.write(line)
    n += 1
    if b"KV cache" in line:
        hits += 1
out.flush()
sys.stderr.write(str(n))
"""


def generator_argv(n_lines: int) -> list[str]:
    scenario = json.dumps({"steps": [{"flood": n_lines, "width": WIDTH}, {"exit": 0}]})
    return [sys.executable, str(REPO / "tests" / "standin_engine.py"), "--scenario", scenario]


def expected_sha256(n_lines: int) -> str:
    digest = hashlib.sha256()
    render = flood_template(WIDTH).__mod__
    for start in range(0, n_lines, 65536):
        digest.update(b"".join(map(render, range(start, min(n_lines, start + 65536)))))
    return digest.hexdigest()


def sink() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sha256sum"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def finish_sink(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait()
    return out.split()[0].decode()


def timed_pipeline(argvs: list[list[str]]) -> tuple[float, str]:
    """Run argv[0] | argv[1] | ... | sha256sum; seconds until the sink is done, and its hash."""
    started = time.perf_counter()
    procs: list[subprocess.Popen[bytes]] = []
    previous = None
    for argv in argvs:
        proc = subprocess.Popen(argv, stdin=previous, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if previous is not None:
            previous.close()
        previous = proc.stdout
        procs.append(proc)
    hasher = subprocess.Popen(["sha256sum"], stdin=previous, stdout=subprocess.PIPE)
    assert previous is not None
    previous.close()
    digest = finish_sink(hasher)
    for proc in procs:
        proc.wait()
    return time.perf_counter() - started, digest


def timed_supervisor(
    n_lines: int,
    on_line: Callable[[str, bytes], None] | None,
    *,
    hashed: bool = True,
    line_filter: tuple[bytes, ...] | None = None,
) -> tuple[float, str | None]:
    """Run the generator under a Supervisor whose stdout goes to sha256sum (or /dev/null)."""
    hasher = sink() if hashed else None
    out_fd = hasher.stdin.fileno() if hasher and hasher.stdin else os.open(os.devnull, os.O_WRONLY)
    command = EngineCommand(tuple(generator_argv(n_lines)), os.environ)
    options = SupervisorOptions(stdout_fd=out_fd, grace_s=5, line_filter=line_filter)
    started = time.perf_counter()
    outcome = Supervisor(command, options, on_line=on_line).run()
    elapsed = time.perf_counter() - started
    assert outcome.engine_returncode == 0, outcome  # exit code 70: the generator ends by itself, unasked
    if hasher is None:
        os.close(out_fd)
        return elapsed, None
    assert hasher.stdin is not None
    hasher.stdin.close()
    return elapsed, finish_sink(hasher)


def pump_only(n_lines: int, needles: tuple[bytes, ...] | None = None) -> float:
    """Seconds for a StreamPump (prefilter hook, output to /dev/null) to take N lines in 64 KiB chunks."""
    render = flood_template(WIDTH).__mod__
    block = min(n_lines, 200_000)
    data = b"".join(map(render, range(block)))
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    count = [0]

    def on_line(stream: str, line: bytes) -> None:
        count[0] += 1
        if b"KV cache" in line:
            pass

    devnull = os.open(os.devnull, os.O_WRONLY)
    pump = StreamPump("stdout", devnull, on_line, needles=needles)
    lines = 0
    started = time.perf_counter()
    while lines < n_lines:
        for chunk in chunks:
            pump.feed(chunk)
        lines += block
    pump.close()
    elapsed = time.perf_counter() - started
    os.close(devnull)
    assert count[0] == (lines if needles is None else 0), (count[0], lines)
    return elapsed * n_lines / lines


Variant = Callable[[], tuple[float, "str | None"]]


def variants(n_lines: int) -> dict[str, tuple[Variant, Callable[[], int] | None]]:
    """Name -> (run once: seconds and sha256 or None, lines the hook saw or None)."""
    gen = generator_argv(n_lines)
    seen = [0]

    def prefilter(stream: str, line: bytes) -> None:
        seen[0] += 1
        if b"KV cache" in line:
            pass

    def decoding(stream: str, line: bytes) -> None:  # a hook without a bytes prefilter
        seen[0] += 1
        if "KV cache" in line.decode("utf-8", errors="replace"):
            pass

    def with_reset(run: Variant) -> Variant:
        def wrapped() -> tuple[float, str | None]:
            seen[0] = 0
            return run()

        return wrapped

    def seen_count() -> int:
        return seen[0]

    def to_devnull(argv: list[str]) -> Variant:
        def run() -> tuple[float, str | None]:
            started = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
            return time.perf_counter() - started, None

        return run

    def to_file(argv: list[str]) -> Variant:
        """The writer into a file, and the same through `safe-serve serve` (the whole CLI, planning
        included, about 1 s): the flood rate an operator gets (issue 14's bench line)."""
        def run() -> tuple[float, str | None]:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "out"
                started = time.perf_counter()
                with path.open("wb") as out:
                    subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=REPO,
                                   env={**os.environ, "SAFE_SERVE_STATE_DIR": tmp, "SAFE_SERVE_LOCK_DIR": tmp})
                seconds = time.perf_counter() - started
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            return seconds, digest

        return run

    safe_serve = [sys.executable, "-m", "launcher", "serve", "qwen2.5-7b", "--device", "cpu", "--log-format", "json",
                  "--engine-cmd", shlex.join(gen), "--health-failures", "0", "--grace", "5", "--", "--port", "9"]
    return {
        "generator > file": (to_file(gen), None),
        "safe-serve serve (CLI) > file": (to_file(safe_serve), None),
        "generator > /dev/null": (to_devnull(gen), None),
        "generator | cat | sha256sum": (lambda: timed_pipeline([gen, ["cat"]]), None),
        "generator | python loop+prefilter | sha256sum": (
            lambda: timed_pipeline([gen, [sys.executable, "-c", _PY_LOOP]]),
            None,
        ),
        "Supervisor, no hook -> sha256sum": (lambda: timed_supervisor(n_lines, None), None),
        "Supervisor, prefilter hook -> sha256sum": (
            with_reset(lambda: timed_supervisor(n_lines, prefilter)),
            seen_count,
        ),
        "Supervisor, prefilter hook > /dev/null": (
            with_reset(lambda: timed_supervisor(n_lines, prefilter, hashed=False)),
            seen_count,
        ),
        "Supervisor, decode-every-line > /dev/null": (
            with_reset(lambda: timed_supervisor(n_lines, decoding, hashed=False)),
            seen_count,
        ),
        "Supervisor, line_filter -> sha256sum": (
            with_reset(lambda: timed_supervisor(n_lines, prefilter, line_filter=(b"KV cache",))),
            seen_count,
        ),
        "StreamPump alone, prefilter hook (1 core)": (lambda: (pump_only(n_lines), None), None),
        "StreamPump alone, line_filter (1 core)": (lambda: (pump_only(n_lines, (b"KV cache",)), None), None),
    }


def main() -> None:
    n_lines = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=open(os.devnull, "w")))  # noqa: SIM115
    load = os.getloadavg()[0]
    print(f"{n_lines:,} lines x {WIDTH} B = {n_lines * WIDTH / 2**20:,.0f} MiB; best of {repeat}; "
          f"{os.cpu_count()} CPUs, load {load:.1f}; Python {sys.version.split()[0]}")
    want = expected_sha256(n_lines)
    table = variants(n_lines)
    best: dict[str, float] = {}
    hashes: dict[str, set[bool]] = {}
    hooked: dict[str, set[int]] = {}
    for _round in range(repeat):  # round-robin, so a noisy neighbour hurts every variant alike
        for name, (run, hook_count) in table.items():
            seconds, digest = run()
            best[name] = min(seconds, best.get(name, seconds))
            if digest is not None:
                hashes.setdefault(name, set()).add(digest == want)
            if hook_count is not None:
                hooked.setdefault(name, set()).add(hook_count())
    for name, seconds in best.items():
        verdict = frozenset(hashes[name]) if name in hashes else None
        note = {None: "", frozenset({True}): "  hash ok"}.get(verdict, "  HASH MISMATCH")
        if name in hooked:
            note += "  hook saw " + "/".join(f"{count:,}" for count in sorted(hooked[name])) + " lines"
        rate = f"{n_lines / seconds / 1e6:6.2f} M lines/s {n_lines * WIDTH / seconds / 2**20:7.1f} MiB/s"
        print(f"{name:<46} {seconds:7.3f} s {rate}{note}")


if __name__ == "__main__":
    main()
