"""What a GPU looks like to the planner: value types shared by the probe and the catalog.

All sizes are bytes. A value nobody could read is ``None`` with a note saying why,
never 0: the planner refuses to guess (a free memory of 0 would silently plan nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Share of NVML's total that CUDA does not hand out, when nothing better is known.
CUDA_RESERVE_FRACTION = 0.02


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a device, named through psutil where we may."""

    pid: int
    used_bytes: int | None  # None: the driver would not say (e.g. in containers)
    kind: str  # "compute" or "graphics"
    name: str | None = None
    user: str | None = None
    cmdline: str | None = None


@dataclass(frozen=True)
class GpuDevice:
    """One device a process can run on: a whole GPU or a MIG instance."""

    index: int  # NVML index (for MIG: the parent's index)
    name: str
    total_bytes: int  # what NVML (and nvidia-smi) report
    free_bytes: int | None
    used_bytes: int | None = None
    reserved_bytes: int | None = None  # memory_info v2: held by the driver/firmware
    uuid: str | None = None
    # What cudaMemGetInfo reports as total; vLLM sizes from this. Below the NVML total
    # where ECC or the driver reserves memory (L40S: 44.42 GiB vs 46068 MiB).
    cuda_total_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    mig_index: int | None = None  # set for a MIG instance
    mig_mode: bool | None = None  # MIG enabled on this (parent) GPU
    processes: tuple[GpuProcess, ...] = ()
    source: str = "nvml"  # "nvml" (measured) or "catalog" (hypothetical, from --gpu)
    notes: tuple[str, ...] = ()  # fields that degraded and why

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.mig_index is None else f"GPU {self.index} MIG {self.mig_index}"

    @property
    def usable_total_bytes(self) -> int:
        """The total the engines size against: CUDA's view (cudaMemGetInfo).

        Known from the catalog, else NVML total less the driver's reserve (memory info v2),
        else NVML total less 2 %: published CUDA totals sit 1.1-2.9 % under NVML's
        (A100-80GB 79.15 of 80 GiB, RTX 3090 23.58 of 24, L40S 44.42 of 44.99, T4 14.56 of 15).
        """
        if self.cuda_total_bytes is not None:
            return self.cuda_total_bytes
        if self.reserved_bytes:
            return self.total_bytes - self.reserved_bytes
        return int(self.total_bytes * (1 - CUDA_RESERVE_FRACTION))


@dataclass(frozen=True)
class HostMemory:
    """Host RAM as a process here can use it (cgroup limits applied)."""

    total_bytes: int
    available_bytes: int
    cgroup_limit_bytes: int | None = None
    numa_nodes: int = 1
    cpu_amx: bool | None = None  # AMX tiles (amx_tile in /proc/cpuinfo): vLLM's CPU MLA kernel choice


@dataclass(frozen=True)
class GpuInventory:
    """Everything the probe saw, and which devices the engine will use."""

    devices: tuple[GpuDevice, ...]
    visible: tuple[GpuDevice, ...]  # in CUDA ordinal order, after CUDA_VISIBLE_DEVICES
    host: HostMemory | None = None
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None  # e.g. "12.8"
    visible_devices_env: str | None = None  # the CUDA_VISIBLE_DEVICES text that chose them
    source: str = "nvml"
    notes: tuple[str, ...] = field(default=())
