"""Finding and ending what a test started: processes whose command line names the test's own files."""

from __future__ import annotations

import subprocess

import psutil


def survivors(needle: str, exclude_pid: int) -> list[psutil.Process]:
    """Running processes (not zombies, not `exclude_pid`) with `needle` in their command line."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.pid == exclude_pid or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(needle in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def close(proc: subprocess.Popen[bytes], needle: str) -> None:
    """Kill `proc` if it still runs, then whatever it left that names `needle`."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for process in survivors(needle, proc.pid):
        process.kill()
