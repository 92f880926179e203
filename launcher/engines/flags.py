"""Reading the engine flags an operator pinned after `--`, exactly as the engine would.

The flags pass through untouched; we only read the memory-relevant ones so the plan
keeps them and never overrides what the operator set.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import UsageError


@dataclass(frozen=True)
class FlagSpec:
    name: str  # canonical spelling, e.g. "--max-model-len"
    parse: Callable[[str], Any] | None  # None: a boolean switch
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecretFlag:
    """An engine flag whose value is a credential; `nargs` as the engine's argparse reads it:
    "1" one value, "?" an optional value (a bare flag means True), "+" one or more values."""

    name: str
    nargs: str = "1"
    aliases: tuple[str, ...] = ()


def _spellings(spec: FlagSpec | SecretFlag) -> list[str]:
    names = [spec.name, *spec.aliases]
    # argparse in both engines accepts the underscore spelling too (--tp_size).
    return names + [n.replace("-", "_").replace("__", "--", 1) for n in names]


def parse_pinned(argv: Sequence[str], specs: Sequence[FlagSpec]) -> dict[str, Any]:
    """Values of the known flags in `argv` (last one wins, as in argparse).

    One serve reads the same argv many times (plan, alternatives, lock, calibration key,
    health port): the parse is pure, so it is done once per argv and copied out.
    """
    return dict(_parse_pinned(tuple(argv), tuple(specs)))


@functools.lru_cache(maxsize=256)
def _parse_pinned(argv: tuple[str, ...], specs: tuple[FlagSpec, ...]) -> tuple[tuple[str, Any], ...]:
    lookup = {spelling: spec for spec in specs for spelling in _spellings(spec)}
    pinned: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        spec = lookup.get(name) or _abbreviated(name, lookup)
        negated = _negated(name, lookup) if spec is None else None
        if negated is not None:  # `--no-enforce-eager` after `--enforce-eager`: the last one wins
            pinned[negated.name] = False
            i += 1
            continue
        if spec is None:
            i += 1
            continue
        if spec.parse is None:
            pinned[spec.name] = True if not eq else inline.lower() not in ("0", "false", "no")
            i += 1
            continue
        if eq:
            raw = inline
            i += 1
        elif i + 1 < len(argv):
            raw = argv[i + 1]
            i += 2
        else:
            raise UsageError(f"engine flag {name} needs a value")
        try:
            pinned[spec.name] = spec.parse(raw)
        except (ValueError, UsageError) as exc:
            raise UsageError(f"engine flag {name}: cannot read {raw!r} ({exc})") from None
    return tuple(pinned.items())


def _negated(name: str, lookup: Mapping[str, FlagSpec]) -> FlagSpec | None:
    """vLLM's boolean flags are argparse BooleanOptionalAction: `--no-X` turns `--X` off (SGLang's store_true
    flags have no such spelling; the flag check refuses it there before the plan)."""
    if not name.startswith("--no-") and not name.startswith("--no_"):
        return None
    spec = lookup.get("--" + name[5:])
    return spec if spec is not None and spec.parse is None else None


def _abbreviated(name: str, lookup: Mapping[str, FlagSpec]) -> FlagSpec | None:
    """argparse's allow_abbrev, on in both engines' parsers: a unique prefix of a long option is that option
    (`--max-model 8192` is `--max-model-len 8192` to the engine), so it is pinned as that flag. A prefix of
    several is the engine's own error (refused before the plan by `check_engine_args`)."""
    if not name.startswith("--") or len(name) < 4:
        return None
    found = {id(spec): spec for spelling, spec in lookup.items() if spelling.startswith(name)}
    return next(iter(found.values())) if len(found) == 1 else None


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """vLLM's `human_readable_int`: 1k = 1000, 1K = 1024, 25.6k; no decimals with K/M/G/T."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]


def human_int_or_auto(text: str) -> int:
    """`--max-model-len` also takes -1 and auto (fit the KV cache); otherwise a positive count."""
    return -1 if text.strip().lower() in ("auto", "-1") else positive(human_int)(text)


def positive(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse`, refusing zero and negative values (sizes, counts and lengths)."""
    def parse_positive(text: str) -> Any:
        value = parse(text)
        if value <= 0:
            raise ValueError("must be positive")
        return value

    return parse_positive


positive_int = positive(int)


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be in (0, 1]")
    return value


def drop_flag(args: Sequence[str], flag: str, specs: Sequence[FlagSpec] = ()) -> list[str]:
    """`args` without `flag` in any spelling (`--flag v`, `--flag=v`, `--flag_name v`, and the
    aliases its spec in `specs` lists, e.g. `-tp` for `--tensor-parallel-size`)."""
    spec = next((s for s in specs if s.name == flag), None)
    spellings = set(_spellings(spec)) if spec is not None else {flag, flag.replace("-", "_").replace("__", "--", 1)}
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        name = token.partition("=")[0]
        if name in spellings:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def set_flag(args: Sequence[str], flag: str, value: str, specs: Sequence[FlagSpec] = ()) -> list[str]:
    """`args` with `flag` set to `value`, replacing any earlier spelling of it."""
    return [*drop_flag(args, flag, specs), flag, value]


def split_engine_cmd(engine_cmd: str) -> list[str]:
    """`--engine-cmd` split like a shell would; an unclosed quote is a usage error (exit 2)."""
    try:
        return shlex.split(engine_cmd)
    except ValueError as exc:
        # Not repeated: it cannot be split into words, so a secret in it (env HF_TOKEN=..., --api-key ...)
        # could not be masked.
        raise UsageError(f"--engine-cmd cannot be split into words like a shell would: {exc}",
                         hint="quote it as one shell word; the command is not repeated here, it may hold a secret") \
            from None


def mask_secret_flags(argv: Sequence[str], secrets: Sequence[SecretFlag], plain: frozenset[str] = frozenset()
                      ) -> list[str]:
    """`argv` as it may be shown: the values of `secrets` (and of secret environment words) replaced.

    Both engines' parsers are argparse with abbreviations allowed (vLLM's FlexibleArgumentParser,
    SGLang's ArgumentParser in srt/server_args.py), so `--api-k X` is `--api-key X` to the
    engine: a prefix of a secret flag's spelling is masked too, unless it is itself a flag named
    in `plain` (SGLang's `--ssl-keyfile` is a path, `--ssl-keyfile-password` a secret).
    """
    from launcher.common.shown import REDACTED, shown_assignments

    spellings = {spelling: spec for spec in secrets for spelling in _spellings(spec)}
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, _ = word.partition("=")
        spec = _secret_for(name, spellings, plain) if word.startswith("--") else None
        i += 1
        if spec is None:
            out.append(word)
            continue
        if eq:
            out.append(f"{name}={REDACTED}")
            continue
        out.append(word)
        while i < len(argv) and not argv[i].startswith("-"):  # argparse never takes a `-x` word as a value
            out.append(REDACTED)
            i += 1
            if spec.nargs != "+":
                break
    return shown_assignments(out)


def secret_flag_before_a_dash(argv: Sequence[str], secrets: Sequence[SecretFlag], plain: frozenset[str],
                              is_flag: Callable[[str], bool]) -> str | None:
    """The secret flag (as written) followed by a `-` word that is no flag of the engine: argparse
    reads that word as an unknown flag, so the value (perhaps the secret itself, `--api-key -Xy...`)
    must not be named in a "does not take engine flag" message. (`--hf-token --port 1`: a bare
    optional-value flag before a real one is fine.)"""
    spellings = {spelling: spec for spec in secrets for spelling in _spellings(spec)}
    for word, following in zip(argv, argv[1:], strict=False):
        if word.startswith("--") and "=" not in word and following.startswith("-") \
                and _secret_for(word, spellings, plain) is not None and not is_flag(following.partition("=")[0]):
            return word
    return None


def _secret_for(name: str, spellings: Mapping[str, SecretFlag], plain: frozenset[str]) -> SecretFlag | None:
    if name in spellings:
        return spellings[name]
    if len(name) < 5 or name in plain:  # `--a`: too short to mean anything to argparse
        return None
    return next((spec for spelling, spec in spellings.items() if spelling.startswith(name)), None)
