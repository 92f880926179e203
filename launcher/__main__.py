"""`python -m launcher` and the `safe-serve` console script.

The CLI's imports (click, structlog, the planner) take a moment; Ctrl-C during them must end
as quietly as Ctrl-C later: exit 130, no traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from launcher.edge.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("safe-serve: interrupted\n")
        sys.exit(130)  # launcher.common.errors.ExitCode.INTERRUPTED (not imported: it may be what was interrupted)
    cli_main()


if __name__ == "__main__":
    main()
