"""Pass-through throughput: N lines of 120 bytes from a generator child, through the supervisor.

Compares, for the same generator (the stand-in engine's flood mode) and the same sink
(``sha256sum`` reading a pipe, which also checks that no byte was lost or reordered):

* generator -> /dev/null                 (the generator's own ceiling)
* generator | cat | sha256sum            (C copy loop)
* generator | python readline loop | sha256sum   (with the same prefilter per line)
* generator -> Supervisor (no hook) -> sha256sum
* generator -> Supervisor (on_line with a ``b"KV cache" in line`` prefilter) -> sha256sum
* StreamPump alone on pre-built chunks -> /dev/null (supervisor-side capacity, no child)

Usage: ``python bench/passthrough.py [N_LINES]`` (default 2,000,000). Prints figures only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import structlog  # noqa: E402

from launcher.supervisor import EngineCommand, StreamPump, Supervisor, SupervisorOptions  # noqa: E402
from standin_engine import flood_template  # noqa: E402

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
    return subprocess.Popen(["sha256sum"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # noqa: S607


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
        proc = subprocess.Popen(argv, stdin=previous, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # noqa: S603
        if previous is not None:
            previous.close()
        previous = proc.stdout
        procs.append(proc)
    hasher = subprocess.Popen(["sha256sum"], stdin=previous, stdout=subprocess.PIPE)  # noqa: S607
    assert previous is not None
    previous.close()
    digest = finish_sink(hasher)
    for proc in procs:
        proc.wait()
    return time.perf_counter() - started, digest


def timed_supervisor(n_lines: int, on_line: Callable[[str, bytes], None] | None, *, hashed: bool = True) -> tuple[float, str | None]:
    """Run the generator under a Supervisor whose stdout goes to sha256sum (or /dev/null)."""
    hasher = sink() if hashed else None
    out_fd = hasher.stdin.fileno() if hasher and hasher.stdin else os.open(os.devnull, os.O_WRONLY)
    command = EngineCommand(tuple(generator_argv(n_lines)), os.environ)
    options = SupervisorOptions(stdout_fd=out_fd, grace_seconds=5)
    started = time.perf_counter()
    outcome = Supervisor(command, options, on_line=on_line).run()
    elapsed = time.perf_counter() - started
    assert outcome.exit_code == 0, outcome
    if hasher is None:
        os.close(out_fd)
        return elapsed, None
    assert hasher.stdin is not None
    hasher.stdin.close()
    return elapsed, finish_sink(hasher)


def pump_only(n_lines: int) -> float:
    """Feed pre-built 64 KiB chunks to a StreamPump with the prefilter hook, output to /dev/null."""
    render = flood_template(WIDTH).__mod__
    data = b"".join(map(render, range(min(n_lines, 200_000))))
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    count = [0]

    def on_line(stream: str, line: bytes) -> None:
        count[0] += 1
        if b"KV cache" in line:
            pass

    devnull = os.open(os.devnull, os.O_WRONLY)
    pump = StreamPump("stdout", devnull, on_line)
    lines = 0
    started = time.perf_counter()
    while lines < n_lines:
        for chunk in chunks:
            pump.feed(chunk)
        lines += min(n_lines, 200_000)
    pump.close()
    elapsed = time.perf_counter() - started
    os.close(devnull)
    assert count[0] == lines, (count[0], lines)
    return lines / elapsed


def main() -> None:
    n_lines = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=open(os.devnull, "w")))  # noqa: SIM115
    print(f"{n_lines:,} lines x {WIDTH} B = {n_lines * WIDTH / 2**20:,.0f} MiB; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
    want = expected_sha256(n_lines)

    def report(name: str, seconds: float, digest: str | None = None, extra: str = "") -> None:
        check = "" if digest is None else ("  hash ok" if digest == want else "  HASH MISMATCH")
        print(f"{name:<44} {seconds:7.3f} s  {n_lines / seconds / 1e6:6.2f} M lines/s  {n_lines * WIDTH / seconds / 2**20:7.1f} MiB/s{check}{extra}")

    started = time.perf_counter()
    subprocess.run(generator_argv(n_lines), stdout=subprocess.DEVNULL, check=True)  # noqa: S603
    report("generator -> /dev/null", time.perf_counter() - started)
    started = time.perf_counter()
    gen = subprocess.Popen(generator_argv(n_lines), stdout=subprocess.PIPE)  # noqa: S603
    subprocess.run(["cat"], stdin=gen.stdout, stdout=subprocess.DEVNULL, check=True)  # noqa: S607
    gen.wait()
    report("generator | cat > /dev/null", time.perf_counter() - started)
    report("generator | cat | sha256sum", *timed_pipeline([generator_argv(n_lines), ["cat"]]))
    report("generator | python loop+prefilter | sha256sum", *timed_pipeline([generator_argv(n_lines), [sys.executable, "-c", _PY_LOOP]]))
    report("generator -> Supervisor (no hook) -> sha256sum", *timed_supervisor(n_lines, None))

    seen = [0, 0]

    def on_line(stream: str, line: bytes) -> None:
        seen[0] += 1
        if b"KV cache" in line:
            seen[1] += 1

    elapsed, _ = timed_supervisor(n_lines, on_line, hashed=False)
    report("generator -> Supervisor (prefilter) > /dev/null", elapsed, None, f"  hook saw {seen[0]:,} lines")
    assert seen[0] == n_lines, f"hook saw {seen[0]} of {n_lines} lines"
    seen[0] = 0
    elapsed, digest = timed_supervisor(n_lines, on_line)
    report("generator -> Supervisor (prefilter hook)", elapsed, digest, f"  hook saw {seen[0]:,} lines")
    assert seen[0] == n_lines, f"hook saw {seen[0]} of {n_lines} lines"
    print(f"{'StreamPump alone, prefilter hook, /dev/null':<44} {pump_only(n_lines) / 1e6:6.2f} M lines/s (no child, one core)")


if __name__ == "__main__":
    main()
