"""Engine adapters: one package per engine holds all of that engine's knowledge."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

ENGINES = ("vllm", "sglang")


def engine_module(engine: str) -> ModuleType:
    """The package holding `engine`'s knowledge (flags, defaults, budget)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}")
    return importlib.import_module(f"launcher.engines.{engine}")


def engine_logs(engine: str) -> ModuleType:
    """`engine`'s log rules: `parse(line)` and the `PREFILTER` substrings."""
    engine_module(engine)  # validates the name
    return importlib.import_module(f"launcher.engines.{engine}.logs")


def ranks(engine: str, pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes from the pinned flags, in the engine's spelling."""
    module = engine_module(engine)
    return pinned.get(module.TP_FLAG, 1), pinned.get(module.PP_FLAG, 1)
