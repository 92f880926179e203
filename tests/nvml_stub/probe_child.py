"""Runs the probe in a fresh interpreter, for tests.

ctypes finds `libnvidia-ml.so.1` through the dynamic loader, which reads LD_LIBRARY_PATH
only when a process starts, and pynvml keeps the library it loaded for the life of the
process: so each probe against a stub fixture needs its own interpreter.

Usage: python probe_child.py '<json env for probe_inventory>'
Prints the pickled GpuInventory on stdout (exit 0), or `ProbeError: <message>` on
stderr with the error's exit code.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

from launcher.common.errors import ProbeError
from launcher.probe import probe_inventory


def main() -> int:
    # The engine's environment: this process's (the stand-in libraries' path, the fixture) with the
    # test's additions; the caller strips CUDA_* from this process's own.
    env = {**os.environ, **json.loads(sys.argv[1])}
    try:
        inventory = probe_inventory(env)
    except ProbeError as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return int(exc.exit_code)
    sys.stdout.buffer.write(pickle.dumps(inventory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
