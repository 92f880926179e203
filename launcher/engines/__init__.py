"""Engine adapters: one package per engine holds all of that engine's knowledge.

`adapter(engine)` is the one door: it returns the engine's `EngineAdapter` (see `base.py`).
`ENGINES` is the registry: the CLI's `--engine` choices and every per-engine loop read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from launcher.engines.base import EngineAdapter

if TYPE_CHECKING:
    from launcher.plan.types import PinnedValue


def _vllm() -> EngineAdapter:
    from launcher.engines.vllm.adapter import ADAPTER

    return ADAPTER


def _sglang() -> EngineAdapter:
    from launcher.engines.sglang.adapter import ADAPTER

    return ADAPTER


# Imported on first use, so `safe-serve gpus` loads no engine package.
_LOADERS: Mapping[str, Callable[[], EngineAdapter]] = {"vllm": _vllm, "sglang": _sglang}
ENGINES: tuple[str, ...] = tuple(_LOADERS)
_ADAPTERS: dict[str, EngineAdapter] = {}


def adapter(engine: str) -> EngineAdapter:
    """The adapter of `engine` (one of `ENGINES`); ValueError for any other name."""
    if engine not in _LOADERS:
        raise ValueError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    found = _ADAPTERS.get(engine)
    if found is None:
        found = _ADAPTERS[engine] = _LOADERS[engine]()
    return found


def figure_keys() -> tuple[str, ...]:
    """Every engine's own plan figures (the JSON keys of their memory knobs), in a stable order."""
    return tuple(key for name in ENGINES for key in adapter(name).figure_keys)


def ranks(engine: str, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes from the pinned flags, in the engine's spelling."""
    return adapter(engine).ranks(pinned)
