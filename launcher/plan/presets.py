"""Presets for the deployments people run: margin, memory cap, concurrency and length policy.

`--preset debug | online | online-long | shared | wsl2` picks a row of `PRESETS`; each value
says why it is what it is, and that reason reaches the plan's notes. A flag the operator
gave explicitly always wins over the preset (`Explicit` says which ones were given).
WSL2 is also detected from the kernel's version text ("microsoft"): Windows keeps part of
the GPU's memory for its desktop, and that share moves, so a margin is added by itself.

Pure data and pure functions: the CLI reads /proc/version and the click parameter sources
and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.common.errors import UsageError
from launcher.common.units import GiB, MiB, format_gib

# Windows (WDDM) keeps the desktop's and other apps' GPU memory outside WSL2's view of
# "free", and that share grows when a window opens: keep 1 GiB aside for it. A judgement
# from the WDDM design, not a measurement; --margin overrides it.
WSL2_EXTRA_MARGIN_BYTES = 1 * GiB


@dataclass(frozen=True)
class Preset:
    """One deployment shape. `None` leaves the setting to safe-serve's default."""

    name: str
    summary: str  # one line for --help
    reason: str  # shown in the plan's notes: "preset NAME: REASON"
    margin_bytes: int | None = None
    max_gpu_memory_fraction: float | None = None  # of the smallest rank's CUDA total
    concurrency: int | None = None
    max_model_len: int | None = None  # a cap on the length; None: the longest that fits
    wsl2: bool = False  # add the WSL2 margin even where /proc/version does not say so


PRESETS: Mapping[str, Preset] = {p.name: p for p in (
    Preset("debug", "one short request, quick to start, room left for a notebook",
           "1 request of at most 4096 tokens and 80 % of the GPU: a short KV cache profiles and starts "
           "quickly, and the rest stays free for a notebook or a profiler",
           margin_bytes=512 * MiB, max_gpu_memory_fraction=0.80, concurrency=1, max_model_len=4096),
    Preset("online", "a chat endpoint: many requests at once",
           "plans 16 requests at once so the length fits real traffic, not one request alone; "
           "0.5 GiB margin for allocator growth under load",
           margin_bytes=512 * MiB, concurrency=16),
    Preset("online-long", "long prompts (RAG, code): fewer, longer requests",
           "keeps 1.5 GiB free for prefill peaks (long prompts allocate beyond the profile run), "
           "plans 4 requests of the longest length that fits",
           margin_bytes=3 * GiB // 2, concurrency=4),
    Preset("shared", "two servers on one GPU",
           "takes at most 45 % of the GPU so a second server fits beside it, 1 GiB margin for "
           "the neighbour's drift",
           margin_bytes=1 * GiB, max_gpu_memory_fraction=0.45, concurrency=4),
    Preset("wsl2", "a GPU under Windows' WSL2",
           "Windows keeps part of the GPU's memory for its desktop and it moves: 1 GiB more margin",
           wsl2=True),
)}


@dataclass(frozen=True)
class Explicit:
    """What the operator set explicitly: each of these beats the preset."""

    margin_bytes: int | None = None
    max_gpu_memory_bytes: int | None = None
    concurrency: int | None = None
    length_pinned: bool = False  # a length flag after `--` (--max-model-len, --context-length)
    memory_pinned: bool = False  # --gpu-memory-utilization / --mem-fraction-static after `--`


@dataclass(frozen=True)
class Settings:
    """The values the request gets, and the notes that say where they came from."""

    margin_bytes: int
    max_gpu_memory_bytes: int | None
    concurrency: int
    max_model_len: int | None  # a length cap to pin; None: leave it to the planner
    notes: tuple[str, ...]
    wsl2: bool = False  # the kernel or the preset says WSL2 (the driver maps no virtual memory there)


def is_wsl2(proc_version: str) -> bool:
    """WSL kernels say "microsoft" in /proc/version (WSL2: "...-microsoft-standard-WSL2")."""
    return "microsoft" in proc_version.lower()


def names() -> tuple[str, ...]:
    return tuple(PRESETS)


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"--preset {name!r}: not a preset", hint="use one of " + ", ".join(PRESETS)) from None


def apply(name: str | None, explicit: Explicit, *, default_margin_bytes: int, gpu_total_bytes: int | None,
          proc_version: str = "") -> Settings:
    """The preset's values where the operator gave none; the WSL2 margin when the kernel says so.

    `gpu_total_bytes` is the smallest rank's CUDA total (None on CPU): a fraction of it
    becomes the memory cap. A pinned memory flag after `--` keeps the preset's cap out.
    """
    preset = get(name) if name else None
    notes: list[str] = []
    if preset is not None:
        notes.append(f"preset {preset.name}: {preset.reason}")
    margin = _margin(preset, explicit, default_margin_bytes, proc_version, notes)
    cap = _cap(preset, explicit, gpu_total_bytes, notes)
    concurrency = _concurrency(preset, explicit, notes)
    length = preset.max_model_len if preset is not None else None
    if length is not None and explicit.length_pinned:
        notes.append(f"length pinned after --: preset cap {length} not used")
        length = None
    wsl2 = is_wsl2(proc_version) or (preset is not None and preset.wsl2)
    return Settings(margin, cap, concurrency, length, tuple(notes), wsl2)


def _margin(preset: Preset | None, explicit: Explicit, default_margin_bytes: int, proc_version: str,
            notes: list[str]) -> int:
    margin = default_margin_bytes
    if explicit.margin_bytes is not None:
        margin = explicit.margin_bytes
        if preset is not None and preset.margin_bytes is not None:
            notes.append(f"--margin {format_gib(margin)} given: preset margin {format_gib(preset.margin_bytes)} "
                         "not used")
    elif preset is not None and preset.margin_bytes is not None:
        margin = preset.margin_bytes
    if not (is_wsl2(proc_version) or (preset is not None and preset.wsl2)):
        return margin
    if explicit.margin_bytes is not None:
        notes.append("WSL2: --margin given, so no WSL2 margin is added")
        return margin
    seen = "the kernel says WSL2 (/proc/version)" if is_wsl2(proc_version) else "preset wsl2"
    notes.append(f"WSL2 ({seen}): margin + {format_gib(WSL2_EXTRA_MARGIN_BYTES)}, since Windows keeps "
                 "part of the GPU's memory and that share moves")
    return margin + WSL2_EXTRA_MARGIN_BYTES


def _cap(preset: Preset | None, explicit: Explicit, gpu_total_bytes: int | None, notes: list[str]) -> int | None:
    cap = explicit.max_gpu_memory_bytes
    fraction = preset.max_gpu_memory_fraction if preset is not None else None
    if fraction is None:
        return cap
    if cap is not None:
        notes.append(f"--max-gpu-memory given: preset cap {fraction:.0%} not used")
    elif explicit.memory_pinned:
        notes.append(f"memory flag pinned after --: preset cap {fraction:.0%} not used")
    elif gpu_total_bytes is None:
        notes.append(f"preset cap {fraction:.0%} of the GPU does not apply on CPU")
    else:
        cap = int(gpu_total_bytes * fraction)
    return cap


def _concurrency(preset: Preset | None, explicit: Explicit, notes: list[str]) -> int:
    if explicit.concurrency is not None:
        if preset is not None and preset.concurrency is not None and preset.concurrency != explicit.concurrency:
            notes.append(f"--concurrency {explicit.concurrency} given: preset's {preset.concurrency} not used")
        return explicit.concurrency
    return preset.concurrency if preset is not None and preset.concurrency is not None else 1


def length_value(settings: Settings, *, model_max_len: int) -> int | None:
    """The preset's length cap, never above the model's own maximum (engines refuse that); None: no cap."""
    if settings.max_model_len is None:
        return None
    return min(settings.max_model_len, model_max_len)


def length_args(settings: Settings, *, length_flag: str, model_max_len: int) -> tuple[str, ...]:
    """The length cap as an engine flag (`length_value` in the engine's spelling)."""
    value = length_value(settings, model_max_len=model_max_len)
    return () if value is None else (length_flag, str(value))


def help_text() -> str:
    """One line per preset for the option's help."""
    return "; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values())


def smallest_total(totals: Sequence[int]) -> int | None:
    """The engines size every rank by the smallest one; the cap follows it."""
    return min(totals) if totals else None
