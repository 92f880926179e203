"""What a GPU looks like to the planner: value types shared by the probe and the catalog.

All sizes are bytes. A value nobody could read is ``None`` with a note saying why,
never 0: the planner refuses to guess (a free memory of 0 would silently plan nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.common.units import MiB

# What CUDA does not hand out of NVML's total, when nothing better is known: the middle of the
# reserves seen on the catalog cards with published CUDA totals (317 MiB on an RTX 3090 to 768 MiB
# on an A100 80GB; 10 cards whose NVML total is not recalled from memory, tests/data/cuda-totals.yaml),
# +/- half that range.
# tests/model/test_cuda_totals.py recomputes both from the data.
CUDA_RESERVE_BYTES = 542 * MiB
CUDA_RESERVE_ERROR_BYTES = 226 * MiB


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
    cuda_total_error_bytes: int = 0  # +/- on a catalog CUDA total (the spread of published totals); 0 measured
    cuda_total_why: str | None = None  # a catalog total that is not the published one (ECC state unknown)
    cuda_total_measured: bool = False  # read from the CUDA driver here (launcher/probe/cuda_driver.py)
    compute_capability: tuple[int, int] | None = None
    mig_index: int | None = None  # set for a MIG instance
    mig_mode: bool | None = None  # MIG enabled on this (parent) GPU
    processes: tuple[GpuProcess, ...] = ()
    source: str = "nvml"  # "nvml" (measured) or "catalog" (hypothetical, from --gpu)
    size_given: bool = False  # --gpu 80GB: a bare size the operator typed, taken as the CUDA total
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

        Measured through the CUDA driver (cuDeviceTotalMem) or known from the catalog, else NVML
        total less the driver's reserve (memory info v2), else NVML total less the typical reserve
        (`CUDA_RESERVE_BYTES`).
        """
        if self.cuda_total_bytes is not None:
            return self.cuda_total_bytes
        if self.reserved_bytes:
            return self.total_bytes - self.reserved_bytes
        return self.total_bytes - CUDA_RESERVE_BYTES

    @property
    def usable_total_source(self) -> str:
        """Which of `usable_total_bytes`' sources gave it: "cuda driver", "catalog", "nvml reserved" or
        "typical reserve"."""
        if self.cuda_total_measured:
            return "cuda driver"
        if self.cuda_total_bytes is not None:
            return "catalog"
        return "nvml reserved" if self.reserved_bytes else "typical reserve"

    @property
    def usable_total_error_bytes(self) -> int:
        """+/- on `usable_total_bytes`: a catalog total's spread, 0 where NVML measured the reserve,
        the spread of reserves seen where it is NVML less the typical reserve."""
        if self.cuda_total_bytes is not None:
            return self.cuda_total_error_bytes
        return 0 if self.reserved_bytes else CUDA_RESERVE_ERROR_BYTES


@dataclass(frozen=True)
class HostMemory:
    """Host RAM as a process here can use it (cgroup limits applied)."""

    total_bytes: int
    available_bytes: int
    cgroup_limit_bytes: int | None = None
    numa_nodes: int = 1
    cpu_amx: bool | None = None  # AMX tiles (amx_tile in /proc/cpuinfo): vLLM's CPU MLA kernel choice
    # AVX-512 BF16 (avx512_bf16): vLLM's CPU backend keeps hybrid models' SSM state in float32 only on such hosts
    cpu_avx512_bf16: bool | None = None
    # AVX-512 (F, BW, VL, DQ): without it vLLM's CPU build loads its AVX2 kernels (`_C_AVX2`), which lack the
    # weight-only int GEMM that GPTQ, AWQ and compressed-tensors W4A16 checkpoints run
    cpu_avx512: bool | None = None


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
