"""Other tenants: naming the processes NVML lists on a GPU, through psutil.

What we may not see (another user's process, one that is gone, a host pid in a container's
pid namespace) stays None; the bytes NVML reports are right either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import psutil

from launcher.model.gpu import GpuDevice, GpuProcess

_T = TypeVar("_T")


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
