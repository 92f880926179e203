"""Probe: what GPUs and host memory this process can use, and who else is on them.

`probe_inventory()` asks NVML (through `launcher.nvml`, the only module that touches the
bindings), names the other tenants through psutil, works out which devices the engine
will see from `CUDA_VISIBLE_DEVICES`, and measures host memory under cgroup limits.
`probe_host()` alone works without any GPU (CPU mode). The launcher never creates a CUDA
context: visibility is resolved from NVML's view with CUDA's rules (`resolve_visible`).

Containers: `NVIDIA_VISIBLE_DEVICES` is applied by the NVIDIA container runtime, which
mounts only those GPUs, so NVML inside the container already sees exactly them and CUDA
never reads the variable. We therefore do not filter by it again; we only note it.
"""

from __future__ import annotations

import dataclasses

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import psutil

from launcher.gpu import GpuDevice, GpuInventory, GpuProcess, HostMemory
from launcher.nvml import read_nvml

_T = TypeVar("_T")


def probe_inventory(env: Mapping[str, str] | None = None) -> GpuInventory:
    """Everything the planner needs to know about the GPUs here, measured now.

    Args:
        env: the environment the engine will get; `os.environ` when None.

    Raises:
        ProbeError: NVML cannot be used (no driver, driver not loaded, ...), with a hint.
    """
    env = os.environ if env is None else env
    report = read_nvml()
    devices = tuple(name_processes(device) for device in report.devices)
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    resolution = _resolve(devices, cuda_visible)
    return GpuInventory(
        devices=devices,
        visible=resolution.devices,
        host=probe_host(),
        driver_version=report.driver_version,
        nvml_version=report.nvml_version,
        cuda_driver_version=report.cuda_driver_version,
        visible_devices_env=cuda_visible,
        source="nvml",
        notes=(*report.notes, *_visibility_notes(resolution, devices, env)),
    )


# ---- other tenants ------------------------------------------------------------------


def name_processes(device: GpuDevice) -> GpuDevice:
    """The device with each process's name, user and command line filled in where allowed."""
    if not device.processes:
        return device
    return replace(device, processes=tuple(describe_process(process) for process in device.processes))


def describe_process(process: GpuProcess) -> GpuProcess:
    """Name one process through psutil; what we may not see (other users, gone) stays None.

    In a container NVML reports host pids, which may name nothing (or another process)
    in the container's pid namespace; the bytes held are right either way.
    """
    try:
        handle = psutil.Process(process.pid)
    except (psutil.Error, ValueError):
        return process
    with handle.oneshot():
        name = _ask(handle.name)
        user = _ask(handle.username)
        argv = _ask(handle.cmdline)
    return replace(process, name=name, user=user, cmdline=" ".join(argv) if argv else None)


def _ask(getter: Callable[[], _T]) -> _T | None:
    try:
        return getter()
    except (psutil.AccessDenied, psutil.NoSuchProcess):  # ZombieProcess is a NoSuchProcess
        return None


# ---- CUDA_VISIBLE_DEVICES -------------------------------------------------------------

# CUDA reads an ordinal like strtol: leading digits count, the rest of the entry is ignored.
_ORDINAL = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class _Resolution:
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
    return _resolve(devices, cuda_visible_devices).devices


def _resolve(devices: Sequence[GpuDevice], cuda_visible_devices: str | None) -> _Resolution:
    gpus = [device for device in devices if not device.is_mig]
    if cuda_visible_devices is None:
        return _one_mig_at_most(gpus, devices)
    if not cuda_visible_devices.strip():
        return _Resolution(devices=())  # set but empty: CUDA sees nothing
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
            return _Resolution(devices=(), duplicate=entry)
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


def _one_mig_at_most(named: Sequence[GpuDevice], devices: Sequence[GpuDevice]) -> _Resolution:
    """CUDA enumerates at most one MIG instance, and then nothing else."""
    migs = [device for device in named if device.is_mig]
    if migs:
        return _Resolution(devices=(migs[0],), dropped_for_mig=len(named) > 1)
    visible: list[GpuDevice] = []
    for device in named:
        if not device.mig_mode:
            visible.append(device)
            continue
        instances = sorted(
            (d for d in devices if d.is_mig and d.index == device.index), key=lambda d: d.mig_index or 0
        )
        if instances:  # a MIG-enabled GPU runs nothing itself; its first instance is used
            return _Resolution(devices=(instances[0],), dropped_for_mig=len(named) > 1 or len(instances) > 1)
    return _Resolution(devices=tuple(visible))


def _key(device: GpuDevice) -> tuple[int, int | None]:
    return device.index, device.mig_index


def _visibility_notes(resolution: _Resolution, devices: Sequence[GpuDevice], env: Mapping[str, str]) -> list[str]:
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


# ---- host memory --------------------------------------------------------------------

# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on x86-64).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
    """One cgroup level's memory limit and what its processes already hold, in bytes."""

    limit_bytes: int
    usage_bytes: int
    reclaimable_bytes: int = 0  # inactive page cache, dropped before the OOM killer runs

    @property
    def headroom_bytes(self) -> int:
        working_set = max(0, self.usage_bytes - self.reclaimable_bytes)
        return max(0, self.limit_bytes - working_set)


def parse_cgroup_v2_max(text: str) -> int | None:
    """`memory.max`: a byte count, or "max" for no limit (None)."""
    value = text.strip()
    return None if value in ("", "max") else int(value)


def parse_cgroup_v1_limit(text: str) -> int | None:
    """`memory.limit_in_bytes`: a byte count; the huge "unlimited" value gives None."""
    value = text.strip()
    if not value or value == "-1":
        return None
    number = int(value)
    return None if number >= _V1_UNLIMITED else number


def parse_memory_stat(text: str, key: str) -> int:
    """One counter from `memory.stat` (`inactive_file 1234` lines); 0 when absent."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """From /proc/self/cgroup: (the v2 unified path, the v1 memory controller's path)."""
    unified: str | None = None
    memory_v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "memory" in controllers.split(","):
            memory_v1 = path
    return unified, memory_v1


def count_numa_nodes(entries: Iterable[str]) -> int:
    """NUMA nodes from the names in /sys/devices/system/node (node0, node1, ...); at least 1."""
    return max(1, sum(1 for name in entries if re.fullmatch(r"node\d+", name)))


def host_memory(total: int, available: int, levels: Sequence[CgroupMemory], numa_nodes: int = 1) -> HostMemory:
    """Host RAM clamped by the tightest cgroup level (a limit anywhere up the tree applies)."""
    if not levels:
        return HostMemory(total_bytes=total, available_bytes=available, numa_nodes=numa_nodes)
    limit = min(level.limit_bytes for level in levels)
    headroom = min(level.headroom_bytes for level in levels)
    return HostMemory(
        total_bytes=min(total, limit),
        available_bytes=min(available, headroom),
        cgroup_limit_bytes=limit,
        numa_nodes=numa_nodes,
    )


def probe_host(root: Path = Path("/")) -> HostMemory:
    """Host memory this process may use, from psutil and its cgroup; needs no GPU.

    `root` is where /proc and /sys are read from (tests point it at a fake tree).
    """
    memory = psutil.virtual_memory()
    try:
        numa_entries: list[str] = os.listdir(root / "sys/devices/system/node")
    except OSError:
        numa_entries = []
    host = host_memory(int(memory.total), int(memory.available), cgroup_levels(root), count_numa_nodes(numa_entries))
    return dataclasses.replace(host, cpu_amx=has_amx(_read(root / "proc/cpuinfo")))


def has_amx(cpuinfo: str | None) -> bool | None:
    """Whether the CPU has AMX tiles (vLLM's CPU MLA kernel depends on it); None if unknown."""
    if not cpuinfo:
        return None
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return "amx_tile" in flags.split()


def cgroup_levels(root: Path = Path("/")) -> list[CgroupMemory]:
    """Memory limits on this process's cgroup and its ancestors (v1 memory or v2)."""
    unified, memory_v1 = parse_proc_cgroup(_read(root / "proc/self/cgroup") or "")
    if memory_v1 is not None:  # on hybrid hosts the memory controller lives in v1
        return _v1_levels(root / "sys/fs/cgroup/memory", memory_v1)
    if unified is not None:
        return _v2_levels(root / "sys/fs/cgroup", unified)
    return []


def _v2_levels(mount: Path, path: str) -> list[CgroupMemory]:
    levels: list[CgroupMemory] = []
    for directory in _cgroup_dirs(mount, path):
        limit = parse_cgroup_v2_max(_read(directory / "memory.max") or "max")
        if limit is None:
            continue
        usage = int((_read(directory / "memory.current") or "0").strip() or 0)
        reclaimable = parse_memory_stat(_read(directory / "memory.stat") or "", "inactive_file")
        levels.append(CgroupMemory(limit, usage, reclaimable))
    return levels


def _v1_levels(mount: Path, path: str) -> list[CgroupMemory]:
    # v1 is hierarchical in one file: the leaf's limit_in_bytes is enough in practice.
    directory = _cgroup_dirs(mount, path)[0]
    limit = parse_cgroup_v1_limit(_read(directory / "memory.limit_in_bytes") or "")
    if limit is None:
        return []
    usage = int((_read(directory / "memory.usage_in_bytes") or "0").strip() or 0)
    reclaimable = parse_memory_stat(_read(directory / "memory.stat") or "", "total_inactive_file")
    return [CgroupMemory(limit, usage, reclaimable)]


def _cgroup_dirs(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount, leaf first.

    Without a cgroup namespace a container sees its host path (/docker/<id>) in
    /proc/self/cgroup while its own cgroup is mounted as the root: then only the root.
    """
    leaf = mount / path.strip("/")
    if not path.strip("/") or not leaf.is_dir():
        return [mount]
    return [leaf, *(parent for parent in leaf.parents if parent == mount or mount in parent.parents)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
