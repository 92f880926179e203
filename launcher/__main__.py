"""`python -m launcher` and the `safe-serve` console script.

The CLI's imports (click, structlog, the planner) take a moment; Ctrl-C during them must end
as quietly as Ctrl-C later: exit 130, no traceback. A stop signal (SIGTERM, SIGHUP, SIGQUIT)
from the first line on ends with the documented code, never by default action
(``launcher.common.stopsignals``).
"""

from __future__ import annotations

import sys

OTHER_COMMANDS = ("plan", "fit", "gpus", "models", "--help", "-h", "--version")


def _reopen_closed_std_fds() -> set[int]:
    """Descriptors 0-2 on /dev/null where the caller closed them, before anything else opens a
    file: otherwise the first file opened (the start lock) becomes stdout and gets the engine's
    output, and a closed stderr turns every clean stop into an error. Returns those reopened."""
    import os

    reopened = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            reopened.add(fd)
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        name = ("stdin", "stdout", "stderr")[fd]
        if getattr(sys, name) is None:  # Python found it closed at start-up and set None
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115
    return reopened


def main() -> None:
    from launcher.common import stopsignals  # signal and types only: light

    serving = not (len(sys.argv) > 1 and sys.argv[1] in OTHER_COMMANDS)  # `safe-serve MODEL` is serve
    stopsignals.install(serving=serving)  # from here on a stop signal is never a death by default action
    reopened = _reopen_closed_std_fds()  # before anything opens a file that stays open (the import's files are closed)
    if 1 in reopened and not serving:
        # plan, fit, gpus, models: the result is the output, and with stdout closed (`>&-`) it would go
        # nowhere with exit 0. A supervisor (serve) keeps running: its caller discarded the engine's output.
        sys.stderr.write("safe-serve: cannot write the output: standard output is closed\n")
        sys.exit(74)  # launcher.common.errors.ExitCode.IO_ERROR (not imported: light start)
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
