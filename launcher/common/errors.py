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
    SOFTWARE = 70  # EX_SOFTWARE: the engine ended unasked (any code or signal) or failed while serving
    TEMPFAIL = 75  # EX_TEMPFAIL: GPU busy, lock timeout: try again later
    CONFIG = 78  # EX_CONFIG: will not fit as configured (RestartPreventExitStatus=78)
    IO_ERROR = 74  # EX_IOERR: our own output cannot be written (a full disk, /dev/full)
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C before the engine ran (quiet, no traceback)
    KILLED_AFTER_GRACE = 137  # 128 + SIGKILL: the engine did not stop within --grace (or a second Ctrl-C)
    BROKEN_PIPE = 141  # 128 + SIGPIPE: whoever read our output went away (`safe-serve models | head -1`)


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


class InstanceNotFound(SafeServeError):
    """`safe-serve status NAME`: no live instance of that name."""

    exit_code = ExitCode.NO_INPUT


class ModelConfigError(SafeServeError):
    """config.json or a checkpoint file is malformed or lacks a field we need."""

    exit_code = ExitCode.DATA


class UnsizedWeights(ModelConfigError):
    """The checkpoint's weight bytes cannot be read without loading it (no safetensors, no
    index, no .bin to measure): 65, or with --trust-engine a launch the engine sizes."""


class UnsupportedModel(SafeServeError):
    """We cannot size this model's KV cache faithfully, so we refuse to guess."""

    exit_code = ExitCode.CONFIG


class ProbeError(SafeServeError):
    """No GPU could be read (no driver, NVML missing, nothing visible)."""

    exit_code = ExitCode.UNAVAILABLE


class Alternative(str):
    """One configuration that was planned and fits, offered when the asked one does not.

    It reads as its one-line description (a `str`), and carries what automation needs:
    the engine flags that replace the operator's, the checkpoint and GPU count if they
    change, and the KV figures the plan gave.
    """

    engine_args: tuple[str, ...]
    model: str | None
    gpu_count: int | None
    kv_cache_tokens: int
    max_model_len: int

    def __new__(cls, text: str, *, engine_args: tuple[str, ...], kv_cache_tokens: int, max_model_len: int,
                model: str | None = None, gpu_count: int | None = None) -> Alternative:
        self = super().__new__(cls, text)
        self.engine_args, self.model, self.gpu_count = engine_args, model, gpu_count
        self.kv_cache_tokens, self.max_model_len = kv_cache_tokens, max_model_len
        return self

    def to_json(self) -> dict[str, object]:
        return {"description": str(self), "engine_args": list(self.engine_args), "model": self.model,
                "gpu_count": self.gpu_count, "kv_cache_tokens": self.kv_cache_tokens,
                "max_model_len": self.max_model_len}


class WontFit(SafeServeError):
    """The model and flags cannot fit the memory at hand; retrying will not help.

    `rule` names the engine rule or budget line that refuses (e.g. "tp-divides-heads",
    "kv-capacity"), `source` where that rule lives (engine file:line) and `figures` the
    numbers behind the refusal, so `--json` can print the refusal as data.
    """

    exit_code = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None, alternatives: tuple[str, ...] = (),
                 rule: str = "budget", source: str | None = None,
                 figures: dict[str, object] | None = None) -> None:
        super().__init__(message, hint=hint)
        self.alternatives = alternatives
        self.rule, self.source, self.figures = rule, source, figures or {}

    def to_json(self) -> dict[str, object]:
        """The `safe-serve.refusal/1` document (README: JSON output)."""
        return {"schema": "safe-serve.refusal/1", "exit_code": int(self.exit_code), "reason": self.message,
                "hint": self.hint, "rule": self.rule, "source": self.source, "figures": self.figures,
                "alternatives": [a.to_json() if isinstance(a, Alternative) else {"description": str(a)}
                                 for a in self.alternatives]}


class TemporarilyUnavailable(SafeServeError):
    """The GPU is busy or locked; the same command may work later."""

    exit_code = ExitCode.TEMPFAIL
