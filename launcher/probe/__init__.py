"""Probe: what GPUs and host memory this process can use, and who else is on them.

`probe_inventory()` asks NVML (through `launcher.probe.nvml`, the only module that touches the
bindings), reads each device's CUDA total from the CUDA driver (`probe.cuda_driver`, in a
child), names the other tenants (`probe.tenants`, psutil), works out which devices the engine
will see from `CUDA_VISIBLE_DEVICES` (`probe.visibility`, pure CUDA rules) and
measures host memory under cgroup limits (`probe.host`). `probe_host()` alone works
without any GPU (CPU mode).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launcher.model.gpu import GpuInventory
from launcher.probe.cuda_driver import measure as measure_cuda_totals
from launcher.probe.host import (
    CgroupMemory,
    cgroup_levels,
    count_numa_nodes,
    has_amx,
    has_avx512,
    has_avx512_bf16,
    host_memory,
    parse_cgroup_v1_limit,
    parse_cgroup_v2_max,
    parse_memory_stat,
    parse_proc_cgroup,
    probe_host,
)
from launcher.probe.nvml import read_nvml
from launcher.probe.tenants import describe_process, name_processes
from launcher.probe.visibility import resolve, resolve_visible, visibility_notes

__all__ = [
    "CgroupMemory",
    "cgroup_levels",
    "count_numa_nodes",
    "describe_process",
    "has_amx",
    "has_avx512",
    "has_avx512_bf16",
    "host_memory",
    "name_processes",
    "parse_cgroup_v1_limit",
    "parse_cgroup_v2_max",
    "parse_memory_stat",
    "parse_proc_cgroup",
    "probe_host",
    "probe_inventory",
    "resolve_visible",
]


def probe_inventory(env: Mapping[str, str] | None = None, *, cuda_totals: bool = True) -> GpuInventory:
    """Everything the planner needs to know about the GPUs here, measured now.

    Args:
        env: the environment the engine will get; `os.environ` when None.
        cuda_totals: ask the CUDA driver for each device's total (a child process; off where only
            the devices' identities are wanted, e.g. to take the start lock).

    Raises:
        ProbeError: NVML cannot be used (no driver, driver not loaded, ...), with a hint.
    """
    env = os.environ if env is None else env
    report = read_nvml()
    measured, cuda_notes = measure_cuda_totals(report.devices, env) if cuda_totals else (report.devices, ())
    devices = tuple(name_processes(device) for device in measured)
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    resolution = resolve(devices, cuda_visible)
    return GpuInventory(
        devices=devices,
        visible=resolution.devices,
        host=probe_host(),
        driver_version=report.driver_version,
        nvml_version=report.nvml_version,
        cuda_driver_version=report.cuda_driver_version,
        visible_devices_env=cuda_visible,
        source="nvml",
        notes=(*report.notes, *cuda_notes, *visibility_notes(resolution, devices, env)),
    )
