"""Cold-process wall time of `safe-serve plan qwen2.5-7b --gpu rtx4090 --json` (target <= 0.25 s median)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 15
COMMAND = [sys.executable, "-m", "launcher", "plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json"]


def main() -> None:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(COMMAND, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    print(f"plan cold start over {RUNS} runs: median {statistics.median(times):.3f} s, "
          f"min {min(times):.3f} s, max {max(times):.3f} s (target <= 0.25 s median)")


if __name__ == "__main__":
    main()
