"""One error hierarchy and one exit-code table (sysexits-style, for systemd).

Only `cli.main` turns these into exit codes; everything else raises.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes documented in the README; systemd units key restarts on them."""

    OK = 0
    FAILURE = 1  # an unexpected failure of safe-serve itself
    USAGE = 2  # bad command line (click's own code for usage errors)
    DATA = 65  # EX_DATAERR: a model config or checkpoint we cannot read
    NO_INPUT = 66  # EX_NOINPUT: model, file or directory not found
    UNAVAILABLE = 69  # EX_UNAVAILABLE: no GPU / NVML to probe, engine not installed
    SOFTWARE = 70  # EX_SOFTWARE: the engine ended by itself with code 0, unasked (a supervised server must not)
    TEMPFAIL = 75  # EX_TEMPFAIL: GPU busy, lock timeout: try again later
    CONFIG = 78  # EX_CONFIG: will not fit as configured (RestartPreventExitStatus=78)
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C before the engine ran (quiet, no traceback)


class SafeServeError(Exception):
    """An expected failure: one clear line for the operator and an exit code."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(SafeServeError):
    exit_code = ExitCode.USAGE


class ModelNotFound(SafeServeError):
    exit_code = ExitCode.NO_INPUT


class ModelConfigError(SafeServeError):
    """config.json or a checkpoint file is malformed or lacks a field we need."""

    exit_code = ExitCode.DATA


class UnsupportedModel(SafeServeError):
    """We cannot size this model's KV cache faithfully, so we refuse to guess."""

    exit_code = ExitCode.CONFIG


class ProbeError(SafeServeError):
    """No GPU could be read (no driver, NVML missing, nothing visible)."""

    exit_code = ExitCode.UNAVAILABLE


class WontFit(SafeServeError):
    """The model and flags cannot fit the memory at hand; retrying will not help."""

    exit_code = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None, alternatives: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint=hint)
        self.alternatives = alternatives


class TemporarilyUnavailable(SafeServeError):
    """The GPU is busy or locked; the same command may work later."""

    exit_code = ExitCode.TEMPFAIL
