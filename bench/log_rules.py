"""The engines' log rules against hostile lines: the worst time per rule on a 1 MB line.

Every rule of both engines (tests/hostile_lines.py: its genuine record) is fed adversarial lines
of about 1 MB in several shapes (its message repeated, runs of the characters its pattern reads,
1 MB numbers, 1 MB process or file names, colour codes, invalid bytes); the figure is the
slowest shape per rule, through the same reader the watch uses (bounded prefix, anchored rules).

Usage: ``python bench/log_rules.py [SIZE_BYTES]`` (default 1 MiB). Prints figures only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.engines import adapter  # noqa: E402
from tests.hostile_lines import MB, SAMPLES, adversarial  # noqa: E402


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else MB
    rows = []
    for sample in SAMPLES:
        reader = adapter(sample.engine).log_reader({})
        worst, worst_shape, shapes = 0.0, "", 0
        for shape, line in adversarial(sample, size):
            for before in sample.lines[:-1]:
                reader.read("stdout", before)
            started = time.perf_counter()
            reader.read("stdout", line)
            took = time.perf_counter() - started
            shapes += 1
            if took > worst:
                worst, worst_shape = took, shape
        rows.append((worst, f"{sample.engine:7} {sample.kind:28} {shapes:3} shapes  worst {worst * 1e3:7.3f} ms"
                            f"  ({worst_shape})"))
    for _, text in rows:
        print(text)
    print(f"worst rule time on a {size:,}-byte line: {max(rows)[0] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
