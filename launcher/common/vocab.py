"""The words safe-serve's data uses, as enums: device, budget source, divergence mode.

Engine names are not here: the registry (`launcher.engines.ENGINES`) is their one source.

They are `str` enums so that they compare equal to, and serialize as, the plain strings the
JSON schemas and the tests already use (`Device.CPU == "cpu"`, `json.dumps` gives "cpu").
"""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """A string enum whose str() and format() are its value (Python 3.10-3.13 alike)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Device(_Word):
    CUDA = "cuda"
    CPU = "cpu"


class Source(_Word):
    """Where a number in a plan comes from (the `source` column and JSON field)."""

    MEASURED = "measured"  # read off the machine or the checkpoint's own bytes
    COMPUTED = "computed"  # derived exactly from shapes (config.json, tensor headers)
    FORMULA = "formula"  # an estimate with an error band
    ENGINE_DEFAULT = "engine default"
    PINNED = "pinned"  # an operator's flag, kept as given
    CATALOG = "catalog"  # profiles/gpus.yaml for a hypothetical GPU
    CALIBRATED = "calibrated"  # what an earlier start of the same setup measured


class DivergenceMode(_Word):
    RETUNE = "retune"
    ABORT = "abort"
    WARN = "warn"
