"""Hypothetical GPUs for `--gpu`: catalog names as people type them, sizes, and counts.

`--gpu rtx4090`, `--gpu "RTX 4090"`, `--gpu a100-80gb`, `--gpu 2xA100-80GB`, `--gpu 24GiB`,
`--gpu 1x24576MiB`. A catalog entry knows both the total NVML reports and the (smaller)
total CUDA can use; a bare size is taken as both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from launcher.common.errors import UsageError
from launcher.common.paths import load_yaml, profiles_dir
from launcher.common.units import MiB, parse_size
from launcher.model.gpu import CUDA_RESERVE_BYTES, GpuDevice

_COUNT = re.compile(r"^\s*([0-9]+)\s*[x×*]\s*(.+)$", re.IGNORECASE)
# More devices than any one engine launch spans: `100000000xrtx4090` would otherwise build a
# hundred million device records (minutes, 1.6 GB) before anything could refuse it.
MAX_GPUS = 1024
_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|[\s_\-]+", re.IGNORECASE)


@dataclass(frozen=True)
class CatalogGpu:
    name: str
    aliases: tuple[str, ...]
    nvml_total_bytes: int
    cuda_total_bytes: int | None
    cuda_total_source: str | None
    compute_capability: tuple[int, int] | None
    cuda_total_error_bytes: int = 0  # +/- on cuda_total_bytes: the spread of the totals published for it


def normalise(text: str) -> str:
    """`NVIDIA GeForce RTX-4090` -> `rtx4090`."""
    return _NOISE.sub("", text).lower()


@lru_cache(maxsize=1)
def load_catalog() -> tuple[CatalogGpu, ...]:
    path = profiles_dir() / "gpus.yaml"
    raw = load_yaml(path.read_text()) if path.is_file() else []
    entries = raw.get("gpus", raw) if isinstance(raw, Mapping) else raw
    if not isinstance(entries, list):
        return ()
    return tuple(_entry(e) for e in entries if isinstance(e, Mapping))


def _entry(entry: Mapping[str, Any]) -> CatalogGpu:
    cc = entry.get("compute_capability")
    cuda_total = entry.get("cuda_total_bytes")
    return CatalogGpu(
        name=str(entry["name"]),
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        nvml_total_bytes=int(entry["nvml_total_mib"]) * MiB,
        cuda_total_bytes=int(cuda_total) if cuda_total else None,
        cuda_total_source=entry.get("cuda_total_source"),
        compute_capability=(int(cc[0]), int(cc[1])) if isinstance(cc, Sequence) and len(cc) == 2 else None,
        cuda_total_error_bytes=int(entry.get("cuda_total_error_bytes") or 0),
    )


def find(text: str, catalog: Sequence[CatalogGpu] | None = None) -> CatalogGpu | None:
    wanted = normalise(text)
    for gpu in catalog if catalog is not None else load_catalog():
        if wanted == normalise(gpu.name) or wanted in {normalise(a) for a in gpu.aliases}:
            return gpu
    return None


def hypothetical_gpus(specs: Sequence[str], catalog: Sequence[CatalogGpu] | None = None) -> tuple[GpuDevice, ...]:
    """Devices for each `--gpu` value, idle (all memory free), in the order given."""
    devices: list[GpuDevice] = []
    for spec in specs:
        count, what = 1, spec.strip()
        match = _COUNT.match(what)
        if match:
            digits, what = match.group(1).lstrip("0") or "0", match.group(2)
            count = int(digits) if len(digits) <= 5 else MAX_GPUS + 1  # int() of 5000 digits raises
            if count < 1:
                raise UsageError(f"--gpu {_shown(spec)}: the count must be at least 1")
        if len(devices) + count > MAX_GPUS:
            raise UsageError(f"--gpu {_shown(spec)}: at most {MAX_GPUS} GPUs in all can be planned for")
        start = len(devices)
        devices.extend(_device(what, spec, start + i, catalog) for i in range(count))
    return tuple(devices)


def _shown(spec: str) -> str:
    """The spec as typed, cut short so a 10,000-character argument stays one readable line."""
    return repr(spec if len(spec) <= 40 else f"{spec[:40]}...")


def _device(what: str, spec: str, index: int, catalog: Sequence[CatalogGpu] | None) -> GpuDevice:
    gpu = find(what, catalog)
    if gpu is not None:
        usable = gpu.cuda_total_bytes or gpu.nvml_total_bytes - CUDA_RESERVE_BYTES
        return GpuDevice(index=index, name=gpu.name, total_bytes=gpu.nvml_total_bytes, free_bytes=usable,
                         used_bytes=gpu.nvml_total_bytes - usable, cuda_total_bytes=gpu.cuda_total_bytes,
                         cuda_total_error_bytes=gpu.cuda_total_error_bytes if gpu.cuda_total_bytes else 0,
                         compute_capability=gpu.compute_capability, source="catalog",
                         notes=(f"CUDA total: {gpu.cuda_total_source}" if gpu.cuda_total_bytes else
                                f"CUDA total unknown: NVML total less the typical reserve "
                                f"({CUDA_RESERVE_BYTES // MiB} MiB)",))
    if re.match(r"^\s*\d", what):
        try:
            size = parse_size(what)
        except UsageError as exc:  # 4090ti: more likely a card's name than 4090 TiB
            hint = suggest(what, catalog or load_catalog())
            if hint.startswith("known:"):
                raise
            raise UsageError(f"--gpu {_shown(spec)}: not a GPU in the catalog, and as a size: {exc.message}",
                             hint=hint) from exc
        if size < MiB:
            raise UsageError(f"--gpu {_shown(spec)}: a GPU needs some memory")
        return GpuDevice(index=index, name=f"{size / MiB:.0f} MiB GPU", total_bytes=size, free_bytes=size,
                         used_bytes=0, cuda_total_bytes=size, source="catalog", size_given=True)
    raise UsageError(f"--gpu {_shown(spec)}: not a GPU in the catalog nor a size like 24GiB",
                     hint=suggest(what, catalog or load_catalog()))


def typed_name(gpu: CatalogGpu) -> str:
    """The name as people type it (`a100-80gb`, `rtx4090`), from the catalog's first alias."""
    alias = gpu.aliases[0] if gpu.aliases else normalise(gpu.name)
    alias = re.sub(r"(?<=\d)(?=\d{2}gb(?:$|[a-z]))", "-", alias)  # a10080gb -> a100-80gb
    alias = re.sub(r"(?<=[a-z])(?=\d+gb$)", "-", alias)  # a100pcie40gb -> a100pcie-40gb
    alias = re.sub(r"(?<=gb)(?=[a-z])", "-", alias)  # a100-80gbpcie -> a100-80gb-pcie
    return re.sub(r"(?<=\d)(?=pcie|sxm|nvl)", "-", alias)  # a100pcie -> a100-pcie


def suggest(text: str, catalog: Sequence[CatalogGpu]) -> str:
    """`did you mean ...` for a GPU name: every card it starts (a100: which one), else difflib's near
    misses, else the whole catalog, each as people type it."""
    import difflib

    wanted = normalise(text)
    by_key = {key: gpu for gpu in catalog for key in (normalise(gpu.name), *gpu.aliases)}
    starts = {typed_name(gpu) for key, gpu in by_key.items() if wanted and key.startswith(wanted)}
    if starts:
        return f"{text.strip()!r} could be " + ", ".join(sorted(starts))
    close = {typed_name(by_key[key]) for key in difflib.get_close_matches(wanted, list(by_key), n=4, cutoff=0.6)}
    if close:
        return "did you mean " + " or ".join(sorted(close))
    return "known: " + ", ".join(sorted(typed_name(gpu) for gpu in catalog))
