"""Command-line values checked before anything is probed, resolved or planned.

Pure functions: a value in, the value (normalised) out, or one `UsageError` (exit 2)
naming the option. The CLI calls them first, so a typo never costs a probe, a Hub
call or a plan, and `--concurrency 0` is refused the same with or without `--gpu`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from launcher.common.errors import UsageError

# What `version_key` (launcher.engines.versions) can read: a numeric release, an optional
# leading v, and the pre/dev/local tails pip versions carry (0.8.5.dev169+g1234abc, 0.11.0rc1).
_VERSION = re.compile(
    r"^v?[0-9]{1,6}(\.[0-9]{1,6}){0,3}((a|b|rc|\.post|\.dev|post|dev)[0-9]{0,9})*(\+[A-Za-z0-9.]{1,64})?$")

# Far above any engine's max_num_seqs (vLLM and SGLang default to 256 or less on one GPU),
# low enough that the planner's arithmetic stays small.
MAX_CONCURRENCY = 1_000_000
# Longer than any model's context (the largest configs say 10M tokens).
MAX_TOKENS = 1 << 30


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else f"{text[:40]}...")


def check_engine_version(text: str) -> str:
    """`--engine-version`: a release number such as 0.10.2, v0.32.0 or 0.8.5.dev169+g1234abc."""
    value = text.strip()
    if not _VERSION.match(value):
        raise UsageError(f"--engine-version {_shown(text)}: not a version number (e.g. 0.10.2 or 0.5.4)")
    return value


def check_concurrency(n: int) -> int:
    """`--concurrency`: requests that must run at once; at least 1."""
    return _check_count("--concurrency", n, MAX_CONCURRENCY)


def check_tokens(n: int) -> int:
    """`fit --tokens`: tokens per request (prompt + output); at least 1."""
    return _check_count("--tokens", n, MAX_TOKENS)


def _check_count(option: str, n: int, limit: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise UsageError(f"{option} {n!r}: must be a whole number")
    if n < 1:
        raise UsageError(f"{option} {n}: must be at least 1")
    if n > limit:
        raise UsageError(f"{option} {n}: more than {limit:,} is not a workload safe-serve can plan for")
    return n


def check_device_and_gpus(device: str, gpu_specs: Sequence[str]) -> None:
    """`--device cpu` plans for the host; a hypothetical `--gpu` contradicts it."""
    if device == "cpu" and gpu_specs:
        raise UsageError(f"--device cpu and --gpu {_shown(gpu_specs[0])} contradict each other: "
                         "plan for the host (--device cpu) or for a GPU (--gpu), not both")


def check_seconds(option: str, value: float, *, allow_zero: bool = False) -> float:
    """`--grace`, `--watch-timeout`, `--lock-timeout`: a finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        floor = "0 or more" if allow_zero else "above 0"
        raise UsageError(f"{option} {value!r}: must be a finite number of seconds, {floor}")
    return float(value)


def check_tolerance(value: float) -> float:
    """`--tolerance`: the share the engine's KV size may differ from the plan, 0 to 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 1:
        raise UsageError(f"--tolerance {value!r}: must be a fraction from 0 to below 1 (e.g. 0.02)")
    return float(value)


def check_max_retunes(n: int) -> int:
    """`--max-retunes`: 0 (never retune) up to a few."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 100:
        raise UsageError(f"--max-retunes {n!r}: must be a whole number from 0 to 100")
    return n


def check_size(option: str, text: str, *, share: bool = True) -> str:
    """`--margin`, `--max-gpu-memory`: a size with its unit (24GiB, 24Gi, 512MiB) or, where the
    option takes one, a share of the GPU (50%); the error names the option."""
    from launcher.common.units import parse_share, parse_size

    try:
        if share and parse_share(text) is not None:
            return text
        parse_size(text)
    except UsageError as exc:
        hint = exc.hint
        if share and re.fullmatch(r"\s*0?\.[0-9]+\s*", text) and float(text) > 0:
            hint = f"a fraction of the GPU is written {float(text):.0%}"
        raise UsageError(f"{option} {exc.message}", hint=hint) from None
    return text


def check_ready_file(path: str) -> str:
    """`--ready-file`: its directory must exist and be writable now, not at ready time (a startup
    probe waiting on a path that can never appear kills the pod only after its whole budget)."""
    import os

    directory = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise UsageError(f"--ready-file {_shown(path)}: is a directory; give a file path inside it")
    if not os.path.isdir(directory):
        raise UsageError(f"--ready-file {_shown(path)}: the directory {directory} does not exist",
                         hint="create it first (in Kubernetes: an emptyDir volume mounted there)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--ready-file {_shown(path)}: the directory {directory} is not writable by this user")
    return path


def check_instance_name(name: str) -> str:
    """`serve --name`: a file-name-safe word (it names the status file in the shared state directory)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name):
        raise UsageError(f"--name {_shown(name)}: use letters, digits, '.', '_' and '-' (at most 128, no leading "
                         "dot or dash)")
    return name
