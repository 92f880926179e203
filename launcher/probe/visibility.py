"""`CUDA_VISIBLE_DEVICES` with CUDA's rules, over NVML's device list: pure functions, no I/O.

The launcher never creates a CUDA context: which devices an engine will see is worked out
from NVML's view (`resolve_visible`), and what an operator may not expect becomes a note.

Containers: `NVIDIA_VISIBLE_DEVICES` is applied by the NVIDIA container runtime, which
mounts only those GPUs, so NVML inside the container already sees exactly them and CUDA
never reads the variable. We therefore do not filter by it again; we only note it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from launcher.model.gpu import GpuDevice

# CUDA reads an ordinal like strtol: leading digits count, the rest of the entry is ignored.
_ORDINAL = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class Resolution:
    """What CUDA makes of one `CUDA_VISIBLE_DEVICES`: the devices it sees, and why some are not."""

    devices: tuple[GpuDevice, ...]
    stopped_at: str | None = None  # the first entry CUDA could not use
    duplicate: str | None = None  # an entry naming a device twice: CUDA then sees none
    dropped_for_mig: bool = False  # other devices hidden because one MIG instance was chosen


def resolve_visible(devices: Sequence[GpuDevice], cuda_visible_devices: str | None) -> tuple[GpuDevice, ...]:
    """The devices an engine started with this `CUDA_VISIBLE_DEVICES` sees, in CUDA order.

    `devices` is the probe's list: whole GPUs (in NVML index order) and MIG instances.
    The rules are CUDA's (and nvitop's `parse_cuda_visible_devices`):

    =================================  ===================================================
    value                              visible
    =================================  ===================================================
    unset (None)                       every GPU, in NVML (PCI bus) order
    ``""``                             none
    ``"1,0"``                          GPU 1 then GPU 0
    ``"0,7,1"`` (no GPU 7)             GPU 0: CUDA stops at the first invalid entry
    ``"-1"``                           none (the usual way to hide all GPUs)
    ``"0,0"``                          none: a device named twice fails CUDA init
    ``"GPU-8f2a"``                     the GPU whose UUID starts so, if only one does
    ``"0,GPU-8f2a"``                   GPU 0: indices and UUIDs cannot be mixed
    ``"MIG-<uuid>"``                   that MIG instance (prefixes work too)
    a GPU with MIG on (by index/UUID)  its first MIG instance only; CUDA enumerates one
                                       MIG instance per process and drops the rest
    =================================  ===================================================

    Ordinals are NVML indices, which is what CUDA uses with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    The legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` form is not understood (it stops the list).
    """
    return resolve(devices, cuda_visible_devices).devices


def resolve(devices: Sequence[GpuDevice], cuda_visible_devices: str | None) -> Resolution:
    """`resolve_visible` with the reasons kept, for `visibility_notes`."""
    gpus = [device for device in devices if not device.is_mig]
    if cuda_visible_devices is None:
        return _one_mig_at_most(gpus, devices)
    if not cuda_visible_devices.strip():
        return Resolution(devices=())  # set but empty: CUDA sees nothing
    named: list[GpuDevice] = []
    by_index: bool | None = None  # set by the first entry: ordinals or UUIDs, never both
    for entry in cuda_visible_devices.split(","):
        token = entry.strip()
        is_ordinal = _ORDINAL.match(token) is not None
        if by_index is None:
            by_index = is_ordinal
        device = _lookup(token, devices, gpus) if is_ordinal == by_index else None
        if device is None:
            return replace(_one_mig_at_most(named, devices), stopped_at=entry)
        if any(_key(device) == _key(seen) for seen in named):
            return Resolution(devices=(), duplicate=entry)
        named.append(device)
    return _one_mig_at_most(named, devices)


def _lookup(token: str, devices: Sequence[GpuDevice], gpus: Sequence[GpuDevice]) -> GpuDevice | None:
    ordinal = _ORDINAL.match(token)
    if ordinal is not None:
        number = int(ordinal.group())
        return next((gpu for gpu in gpus if gpu.index == number), None)
    prefix = token.lower()
    if prefix.startswith("gpu-"):
        pool = gpus
    elif prefix.startswith("mig-") and not prefix.startswith("mig-gpu-"):
        pool = [device for device in devices if device.is_mig]
    else:
        return None
    matches = [device for device in pool if device.uuid and device.uuid.lower().startswith(prefix)]
    return matches[0] if len(matches) == 1 else None  # an ambiguous prefix is invalid


def _one_mig_at_most(named: Sequence[GpuDevice], devices: Sequence[GpuDevice]) -> Resolution:
    """CUDA enumerates at most one MIG instance, and then nothing else."""
    migs = [device for device in named if device.is_mig]
    if migs:
        return Resolution(devices=(migs[0],), dropped_for_mig=len(named) > 1)
    visible: list[GpuDevice] = []
    for device in named:
        if not device.mig_mode:
            visible.append(device)
            continue
        instances = sorted(
            (d for d in devices if d.is_mig and d.index == device.index), key=lambda d: d.mig_index or 0
        )
        if instances:  # a MIG-enabled GPU runs nothing itself; its first instance is used
            return Resolution(devices=(instances[0],), dropped_for_mig=len(named) > 1 or len(instances) > 1)
    return Resolution(devices=tuple(visible))


def _key(device: GpuDevice) -> tuple[int, int | None]:
    return device.index, device.mig_index


def visibility_notes(resolution: Resolution, devices: Sequence[GpuDevice], env: Mapping[str, str]) -> list[str]:
    """One line for each way the engine's view differs from what the operator may expect."""
    notes: list[str] = []
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    if cuda_visible is not None and not resolution.devices and devices:
        notes.append(f"CUDA_VISIBLE_DEVICES={cuda_visible!r} leaves no GPU visible to the engine")
    if resolution.stopped_at is not None:
        notes.append(
            f"CUDA_VISIBLE_DEVICES entry {resolution.stopped_at.strip()!r} names no usable device: "
            "CUDA ignores it and every entry after it"
        )
    if resolution.duplicate is not None:
        notes.append(f"CUDA_VISIBLE_DEVICES names {resolution.duplicate.strip()!r} twice: CUDA then sees no GPU")
    if resolution.dropped_for_mig:
        notes.append(f"CUDA uses one MIG instance per process: only {resolution.devices[0].label} is visible")
    names = {device.name for device in devices if not device.is_mig}
    uses_ordinals = cuda_visible is None or _ORDINAL.match(cuda_visible.strip()) is not None
    if len(names) > 1 and uses_ordinals and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append(
            "GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers the fastest first, "
            "so set CUDA_DEVICE_ORDER=PCI_BUS_ID or name GPUs by UUID"
        )
    container_choice = env.get("NVIDIA_VISIBLE_DEVICES")
    if container_choice not in (None, "", "all") and cuda_visible is None:
        notes.append(
            f"NVIDIA_VISIBLE_DEVICES={container_choice} was applied by the container runtime; "
            "NVML already sees only those GPUs"
        )
    return notes
