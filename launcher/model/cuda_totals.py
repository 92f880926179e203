"""CUDA totals per catalog card, from the totals people published (tests/data/cuda-totals.yaml).

The engines size against cudaMemGetInfo's total, which sits a driver reserve below NVML's. The
catalog (profiles/gpus.yaml) carries, per card with observations, the median of the Linux
totals printed for it and the largest distance of any of them from that median (the band);
`derive` is that rule, and tests/model/test_cuda_totals.py holds the catalog to it. Observations a
source marks as doubtful, and Windows/WSL2 (WDDM prints round totals), unified-memory and vGPU
hosts, are left out: they are not the card's total on a Linux server.

`catalog_without` rebuilds the catalog's totals with one source left out, for scoring a startup
log against a total that was not read from that same log (bench/startup_logs.py).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.common.paths import load_yaml
from launcher.common.units import GiB, MiB
from launcher.model.catalog import CatalogGpu, find

# A total printed with two decimals in GiB is known to +/- 0.005 GiB.
PRINT_RESOLUTION_BYTES = int(0.005 * GiB)
# Not a Linux server's total for the card: said so in the source's note.
_NOT_LINUX_SERVER = re.compile(r"DOUBTFUL|Windows|WSL|WDDM|UMA|unified|vGPU|interposer", re.IGNORECASE)
# Only the memory class named ("40GB class"): which card it was is a guess.
_VARIANT_NOT_STATED = re.compile(r"\bclass\b", re.IGNORECASE)
_MEMORY_WORDS = re.compile(r"\s*\b(HBM\d?e?|GDDR\dX?)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Observation:
    gpu: str
    variant: str
    total_bytes: int | None
    source: str
    note: str
    nvml_total_mib: int | None = None


def load(path: Path) -> list[Observation]:
    raw = load_yaml(path.read_text()) if path.is_file() else []
    found = []
    for entry in raw if isinstance(raw, list) else []:
        total = entry.get("cuda_total_gib")
        found.append(Observation(str(entry.get("gpu") or ""), str(entry.get("memory_variant") or ""),
                                 int(round(float(total) * GiB)) if total is not None else None,
                                 str(entry.get("source") or ""), str(entry.get("note") or ""),
                                 int(entry["nvml_total_mib"]) if entry.get("nvml_total_mib") else None))
    return found


def card_for(observation: Observation, catalog: Sequence[CatalogGpu]) -> CatalogGpu | None:
    """The catalog card an observation is of, or None (not in the catalog, or which one unclear).
    A size without a form factor ("A100", "80GB") takes the catalog's own alias ("a10080gb")."""
    if _VARIANT_NOT_STATED.search(observation.variant):
        return None
    name = _MEMORY_WORDS.sub("", re.sub(r"\(.*?\)", "", observation.gpu)).strip()
    size = re.match(r"\s*(\d+)\s*GB", observation.variant)
    for candidate in (name, f"{name} {size.group(1)}GB" if size else None, re.sub(r"\s*\d+GB?$", "", name)):
        card = find(candidate, catalog) if candidate else None
        if card is not None and _same_size(card, size.group(1) if size else None) and (
                observation.nvml_total_mib is None or observation.nvml_total_mib * MiB in _nvml_totals(card)):
            return card  # an NVML total that differs is another memory setup (ECC on/off)
    return None


def _nvml_totals(card: CatalogGpu) -> tuple[int, ...]:
    return (card.nvml_total_bytes,) + ((card.ecc_on.nvml_total_bytes,) if card.ecc_on is not None else ())


def with_ecc_on(observation: Observation, card: CatalogGpu) -> bool:
    """Whether an observation of an ECC-optional card was taken with ECC on: its NVML total says so,
    or without one its CUDA total, below the ECC-on NVML total (in-band ECC takes 1/16 of the memory,
    3 GiB on a 48 GB card; the driver's reserve is under 1 GiB)."""
    if card.ecc_on is None:
        return False
    if observation.nvml_total_mib is not None:
        return observation.nvml_total_mib * MiB == card.ecc_on.nvml_total_bytes
    return observation.total_bytes is not None and observation.total_bytes < card.ecc_on.nvml_total_bytes


def _same_size(card: CatalogGpu, gigabytes: str | None) -> bool:
    """An 80GB observation is not of the 40GB card, whatever its name says."""
    if gigabytes is None:
        return True
    nominal = card.nvml_total_bytes / GiB
    return abs(nominal - int(gigabytes)) <= max(0.1 * int(gigabytes), 2)


def usable(observation: Observation) -> bool:
    return observation.total_bytes is not None and not _NOT_LINUX_SERVER.search(observation.note)


@dataclass(frozen=True)
class DerivedTotal:
    total_bytes: int
    error_bytes: int
    count: int
    sources: tuple[str, ...]


def derive(card: CatalogGpu, observations: Sequence[Observation],
           catalog: Sequence[CatalogGpu], *, ecc_on: bool = False) -> DerivedTotal | None:
    """The card's CUDA total (with ECC on: `ecc_on`): the median of its usable observations, +/- the
    farthest of them (at least the print resolution)."""
    totals = [(o.total_bytes, o.source) for o in observations
              if usable(o) and o.total_bytes is not None and (c := card_for(o, catalog)) and c.name == card.name
              and with_ecc_on(o, card) == ecc_on]
    if not totals:
        return None
    values = [t for t, _ in totals]
    middle = int(statistics.median(values))
    spread = max(abs(v - middle) for v in values)
    return DerivedTotal(middle, max(spread, PRINT_RESOLUTION_BYTES), len(values),
                        tuple(sorted({s for _, s in totals})))


def catalog_without(catalog: Sequence[CatalogGpu], observations: Sequence[Observation],
                    source: str) -> tuple[CatalogGpu, ...]:
    """The catalog with every card's total derived from the observations of other sources only;
    a card left with none falls back to NVML less the reserve (cuda_total_bytes None)."""
    kept = [o for o in observations if o.source != source]
    rebuilt = []
    for card in catalog:
        derived = derive(card, kept, catalog)
        card = dataclasses.replace(card, cuda_total_bytes=derived.total_bytes if derived else None,
                                   cuda_total_error_bytes=derived.error_bytes if derived else 0,
                                   cuda_total_source=card.cuda_total_source if derived else None)
        if card.ecc_on is not None:
            on = derive(card, kept, catalog, ecc_on=True)
            card = dataclasses.replace(card, ecc_on=dataclasses.replace(
                card.ecc_on, cuda_total_bytes=on.total_bytes if on else None,
                cuda_total_error_bytes=on.error_bytes if on else 0,
                cuda_total_source=card.ecc_on.cuda_total_source if on else None))
        rebuilt.append(card)
    return tuple(rebuilt)
