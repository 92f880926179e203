"""Engine flags checked against the engine: the flags after `--` against the option strings the
chosen engine's own argparse accepts in that release (each engine package's argparse_flags.json,
read from the engines' code by tests/oracles/engine_flags.py).

A flag the engine does not take is exit 2 that names its spelling in the chosen engine
(`--max-model-len` on SGLang is `--context-length`), before anything is planned: the engine's
argparse would refuse it after minutes of loading, or, worse, the pin would be lost. A second
model after `--` is exit 2 too. Where the table cannot be sure (a release between, before or
after the ones read), an unknown flag is a warning, not an error; a flag that is another
engine's spelling stays an error in every release.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.common.errors import UsageError
from launcher.engines.versions import version_key

_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Choices:
    """An argument's argparse `choices` and how its `type` turns a value into one (argparse converts
    first): "exact", "lower", or "lower_underscore" (vLLM's --moe-backend)."""

    values: tuple[str, ...]
    normalize: str = "exact"

    def converted(self, value: str) -> str:
        if self.normalize == "lower_underscore":
            return value.lower().replace("-", "_")
        return value.lower() if self.normalize == "lower" else value


@dataclass(frozen=True)
class AcceptedFlags:
    """One engine's argparse by release, and where its flags have another engine's spelling."""

    engine_label: str  # "vLLM", "SGLang": as the engine calls itself in messages
    versions: Mapping[str, frozenset[str]]  # release -> every option string its argparse takes
    equivalents: Mapping[str, str]  # another engine's spelling -> this engine's
    model_flags: frozenset[str]  # flags that name the model: the positional MODEL already does
    underscores: bool = True  # the parser also takes --max_model_len for --max-model-len
    # The engine's own rewriting of its argv before argparse sees it (vLLM: -O3 -> --optimization-level 3)
    rewrite: Callable[[Sequence[str]], list[str]] | None = None
    # release -> option string -> that argument's choices (every spelling of it), where argparse has them
    choices: Mapping[str, Mapping[str, Choices]] = field(default_factory=dict)

    def table_for(self, version: str | None) -> tuple[str, bool]:
        """The release whose table applies to `version`, and whether it is that release exactly
        (None: the newest table, exact)."""
        ordered = sorted(self.versions, key=version_key)
        if version is None:
            return ordered[-1], True
        at_or_below = [v for v in ordered if version_key(v) <= version_key(version)]
        chosen = at_or_below[-1] if at_or_below else ordered[0]
        return chosen, version_key(chosen) == version_key(version)


def load_table(path: Path) -> tuple[dict[str, frozenset[str]], dict[str, dict[str, Choices]]]:
    """From one argparse_flags.json: {release: option strings}, and {release: {option string: choices}}
    (every spelling of an argument with choices)."""
    doc = json.loads(path.read_text())
    flags: dict[str, frozenset[str]] = {}
    choices: dict[str, dict[str, Choices]] = {}
    for version, entry in doc["versions"].items():
        spellings = entry["flags"]
        flags[version] = frozenset(s for strings in spellings.values() for s in strings)
        choices[version] = {spelling: Choices(tuple(spec["values"]), str(spec.get("normalize", "exact")))
                            for canonical, spec in (entry.get("choices") or {}).items()
                            for spelling in spellings.get(canonical, [canonical])}
    return flags, choices


def _names(engine_args: Sequence[str]) -> list[str]:
    """The flag names in `engine_args` as written (`--x=1` -> `--x`); values such as -1 are not flags."""
    return [token.partition("=")[0] for token in engine_args if _FLAG.fullmatch(token.partition("=")[0])]


def known_flag(name: str, accepted: frozenset[str], underscores: bool) -> bool:
    normal = name.replace("_", "-") if underscores else name
    if normal in accepted:
        return True
    # argparse's allow_abbrev (on in both engines' parsers): a unique prefix of a long option is that option.
    return normal.startswith("--") and len(_prefixed(normal, accepted)) == 1


@functools.lru_cache(maxsize=1024)
def _prefixed_cached(name: str, accepted: frozenset[str]) -> tuple[str, ...]:
    return tuple(s for s in accepted if s.startswith(name))


def _prefixed(name: str, accepted: frozenset[str]) -> tuple[str, ...]:
    return _prefixed_cached(name, accepted)


def check_engine_args(table: AcceptedFlags, version: str | None, engine_args: Sequence[str]) -> tuple[str, ...]:
    """Raise UsageError (exit 2) for a flag the engine does not take or a second model; return
    warnings for flags the table cannot vouch for in `version`."""
    release, exact = table.table_for(version)
    accepted = table.versions[release]
    everywhere = frozenset().union(*table.versions.values())
    warnings: list[str] = []
    parsed = table.rewrite(engine_args) if table.rewrite else engine_args
    if parsed and not parsed[0].startswith("-"):  # neither engine takes a positional after the model
        raise UsageError(f"engine argument {parsed[0]!r} is neither a flag nor a flag's value: "
                         f"{table.engine_label} would refuse it as an unrecognized argument",
                         hint="the model is MODEL; engine flags after `--` start with - or --")
    for name in _names(parsed):
        normal = name.replace("_", "-") if table.underscores else name
        if normal in table.model_flags or name in table.model_flags:
            raise UsageError(f"engine flag {name} names a second model: the model is the positional MODEL",
                             hint=f"drop {name} after `--`, or give that model as MODEL")
        if known_flag(name, accepted, table.underscores):
            continue
        if name in table.equivalents or normal in table.equivalents:
            ours = table.equivalents.get(name) or table.equivalents[normal]
            raise UsageError(f"{table.engine_label} does not take engine flag {name}",
                             hint=f"{table.engine_label}'s spelling is {ours}")
        if exact:
            close = difflib.get_close_matches(normal, sorted(accepted), n=3, cutoff=0.75)
            raise UsageError(f"{table.engine_label} {release} does not take engine flag {name}",
                             hint=("did you mean " + " or ".join(close)) if close else
                             "engine flags after `--` go to the engine exactly as written")
        if known_flag(name, everywhere, table.underscores):
            warnings.append(f"engine flag {name} is not in {table.engine_label} {release}'s argparse "
                            f"(it is in another release's); the engine decides")
        else:
            warnings.append(f"engine flag {name} is not in {table.engine_label}'s argparse as of {release} "
                            f"(the newest we read is {sorted(table.versions, key=version_key)[-1]}); "
                            f"the engine decides")
    return (*warnings, *_choice_warnings(table, release, exact, parsed))


def _values(engine_args: Sequence[str]) -> list[tuple[str, str]]:
    """(flag as written, its value) for `--x=v` and `--x v` (a next token that is not a flag)."""
    found = []
    for i, token in enumerate(engine_args):
        name, eq, value = token.partition("=")
        if not _FLAG.fullmatch(name):
            continue
        if eq:
            found.append((name, value))
        elif i + 1 < len(engine_args) and not engine_args[i + 1].startswith("-"):
            found.append((name, engine_args[i + 1]))
    return found


def _choice_warnings(table: AcceptedFlags, release: str, exact: bool, engine_args: Sequence[str]) -> list[str]:
    """A value outside its argument's argparse choices: exit 2 in a release read exactly (the engine's
    argparse exits before loading anything), a warning in a release between or past the ones read."""
    choices = table.choices.get(release)
    if not choices:
        return []
    warnings: list[str] = []
    accepted = table.versions[release]
    for name, value in _values(engine_args):
        normal = name.replace("_", "-") if table.underscores else name
        prefixed = _prefixed(normal, accepted) if normal.startswith("--") and normal not in accepted else ()
        allowed = choices.get(prefixed[0] if len(prefixed) == 1 else normal)  # allow_abbrev: a unique prefix
        if allowed is None:
            continue
        shown = allowed.converted(value)
        if shown in allowed.values:
            continue
        message = f"argument {name}: invalid choice: {shown!r} (choose from {', '.join(allowed.values)})"
        if exact:
            close = difflib.get_close_matches(shown, allowed.values, n=2, cutoff=0.6)
            raise UsageError(f"{table.engine_label} {release} refuses the command line: {message}",
                             hint=("did you mean " + " or ".join(f"{name} {c}" for c in close)) if close else
                             f"{name} takes one of the values above")
        warnings.append(f"{message} in {table.engine_label} {release}'s argparse (not the release planned "
                        "for); the engine decides")
    return warnings
