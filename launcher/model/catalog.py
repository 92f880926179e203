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
from launcher.common.units import GiB, MiB, parse_size
from launcher.model.gpu import CUDA_RESERVE_BYTES, CUDA_RESERVE_ERROR_BYTES, GpuDevice

_COUNT = re.compile(r"^\s*([0-9]+)\s*[x×*]\s*(.+)$", re.IGNORECASE)
# More devices than any one engine launch spans: `100000000xrtx4090` would otherwise build a
# hundred million device records (minutes, 1.6 GB) before anything could refuse it.
MAX_GPUS = 1024
_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|[\s_\-]+", re.IGNORECASE)


# `--gpu rtx6000ada-ecc` / `-noecc`: the ECC state of a card whose ECC is optional (normalised text).
_ECC_SUFFIXES = (("noecc", False), ("eccoff", False), ("eccon", True), ("ecc", True))


@dataclass(frozen=True)
class EccOn:
    """An ECC-optional GDDR card with ECC switched on: in-band ECC takes 1/16 of the memory, which
    NVML's total already shows (49140 -> 46068 MiB on a 48 GB card), and CUDA's total sits below it."""

    nvml_total_bytes: int
    cuda_total_bytes: int | None
    cuda_total_source: str | None = None
    cuda_total_error_bytes: int = 0


@dataclass(frozen=True)
class CatalogGpu:
    name: str
    aliases: tuple[str, ...]
    nvml_total_bytes: int
    cuda_total_bytes: int | None
    cuda_total_source: str | None
    compute_capability: tuple[int, int] | None
    cuda_total_error_bytes: int = 0  # +/- on cuda_total_bytes: the spread of the totals published for it
    # ECC optional and off in the totals above (RTX A6000, RTX 6000 Ada): the same card with ECC on.
    ecc_on: EccOn | None = None


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
    ecc = entry.get("ecc_on")
    ecc_on = None
    if isinstance(ecc, Mapping) and ecc.get("nvml_total_mib"):
        ecc_total = ecc.get("cuda_total_bytes")
        ecc_on = EccOn(nvml_total_bytes=int(ecc["nvml_total_mib"]) * MiB,
                       cuda_total_bytes=int(ecc_total) if ecc_total else None,
                       cuda_total_source=ecc.get("cuda_total_source"),
                       cuda_total_error_bytes=int(ecc.get("cuda_total_error_bytes") or 0))
    return CatalogGpu(
        name=str(entry["name"]),
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        nvml_total_bytes=int(entry["nvml_total_mib"]) * MiB,
        cuda_total_bytes=int(cuda_total) if cuda_total else None,
        cuda_total_source=entry.get("cuda_total_source"),
        compute_capability=(int(cc[0]), int(cc[1])) if isinstance(cc, Sequence) and len(cc) == 2 else None,
        cuda_total_error_bytes=int(entry.get("cuda_total_error_bytes") or 0),
        ecc_on=ecc_on,
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
    gpu, ecc = find(what, catalog), None
    if gpu is None:
        gpu, ecc = _with_ecc_state(what, spec, catalog)
    if gpu is not None:
        return _catalog_device(gpu, index, ecc)
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


def _with_ecc_state(what: str, spec: str,
                    catalog: Sequence[CatalogGpu] | None) -> tuple[CatalogGpu | None, bool | None]:
    """`rtx6000ada-ecc` / `rtx6000ada-noecc`: the card and the ECC state asked for, or (None, None)."""
    wanted = normalise(what)
    for suffix, on in _ECC_SUFFIXES:
        gpu = find(wanted[:-len(suffix)], catalog) if wanted.endswith(suffix) and len(wanted) > len(suffix) else None
        if gpu is None:
            continue
        if gpu.ecc_on is None:
            raise UsageError(f"--gpu {_shown(spec)}: the catalog knows one memory setup for {gpu.name} "
                             "(its ECC is not optional, or costs no capacity)", hint=f"--gpu {typed_name(gpu)}")
        return gpu, on
    return None, None


def _totals(gpu: CatalogGpu, ecc: bool) -> tuple[int, int | None, int, str]:
    """(NVML total, published CUDA total or None, +/- on it, where it comes from), ECC on or off."""
    if ecc and gpu.ecc_on is not None:
        on = gpu.ecc_on
        nvml, cuda, error, source = on.nvml_total_bytes, on.cuda_total_bytes, on.cuda_total_error_bytes, \
            on.cuda_total_source
    else:
        nvml, cuda, error, source = gpu.nvml_total_bytes, gpu.cuda_total_bytes, gpu.cuda_total_error_bytes, \
            gpu.cuda_total_source
    if cuda:
        return nvml, cuda, error, f"CUDA total: {source}"
    return nvml, None, CUDA_RESERVE_ERROR_BYTES, (f"CUDA total unknown: NVML total less the typical reserve "
                                                  f"({CUDA_RESERVE_BYTES // MiB} MiB)")


def _catalog_device(gpu: CatalogGpu, index: int, ecc: bool | None) -> GpuDevice:
    """The card idle; an ECC-optional card whose ECC state was not given spans both states."""
    def device(nvml: int, cuda: int | None, error: int, notes: tuple[str, ...], why: str | None = None) -> GpuDevice:
        usable = cuda or nvml - CUDA_RESERVE_BYTES
        return GpuDevice(index=index, name=gpu.name, total_bytes=nvml, free_bytes=usable, used_bytes=nvml - usable,
                         cuda_total_bytes=cuda, cuda_total_error_bytes=error if cuda else 0,
                         cuda_total_why=why, compute_capability=gpu.compute_capability, source="catalog",
                         notes=notes)

    if gpu.ecc_on is None or ecc is not None:
        nvml, cuda, error, note = _totals(gpu, bool(ecc))
        state = () if ecc is None else (f"ECC {'on' if ecc else 'off'}, as given",)
        return device(nvml, cuda, error, (*state, note))
    # ECC state unknown: from ECC on's low end to ECC off's high end, the middle as the figure; the
    # plan's length comes from the band's low end, so "fits" never rests on ECC being off. The NVML
    # total is ECC on's: SGLang's default fraction reserves a fixed size of it, a smaller share of more.
    on_nvml, on_cuda, on_error, on_note = _totals(gpu, True)
    nvml, off_cuda, off_error, off_note = _totals(gpu, False)
    low = (on_cuda or on_nvml - CUDA_RESERVE_BYTES) - on_error
    high = (off_cuda or nvml - CUDA_RESERVE_BYTES) + off_error
    typed = typed_name(gpu)
    return device(on_nvml, (low + high) // 2, (high - low) // 2, (
        f"ECC state unknown (optional on this card): CUDA total {low / GiB:.2f}-{high / GiB:.2f} GiB, from ECC on "
        f"(in-band ECC takes 1/16: NVML {on_nvml // MiB} MiB) to ECC off (NVML {nvml // MiB} MiB); "
        f"--gpu {typed}-ecc or {typed}-noecc plans one, and on the host NVML reads it",
        f"ECC on: {on_note}", f"ECC off: {off_note}"), why="ECC state unknown: from ECC on to ECC off")


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
