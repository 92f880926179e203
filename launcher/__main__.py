"""`python -m launcher` and the `safe-serve` console script.

The CLI's imports (click, structlog, the planner) take a moment; Ctrl-C during them must end
as quietly as Ctrl-C later: exit 130, no traceback. A stop signal (SIGTERM, SIGHUP, SIGQUIT)
from the first line on ends with the documented code, never by default action
(``launcher.common.stopsignals``).
"""

from __future__ import annotations

import sys

OTHER_COMMANDS = ("plan", "fit", "gpus", "models", "--help", "-h", "--version")


def main() -> None:
    from launcher.common import stopsignals  # signal and types only: light

    serving = not (len(sys.argv) > 1 and sys.argv[1] in OTHER_COMMANDS)  # `safe-serve MODEL` is serve
    stopsignals.install(serving=serving)  # from here on a stop signal is never a death by default action
    try:
        from launcher.edge.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("safe-serve: interrupted\n")
        sys.exit(130)  # launcher.common.errors.ExitCode.INTERRUPTED (not imported: it may be what was interrupted)
    except stopsignals.StopSignal as stop:
        sys.stderr.write(f"safe-serve: stopped on {stop.name} before the engine started\n")
        sys.exit(stopsignals.exit_code(stop))
    cli_main()


if __name__ == "__main__":
    main()
