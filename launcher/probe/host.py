"""Host memory this process may use: pure parsers of /proc and cgroup files, and one reader.

`probe_host()` reads psutil, this process's cgroup (v1 memory controller or v2, the
tightest limit up the tree applies), the NUMA node count and the CPU's AMX flag; it needs no
GPU (CPU mode). Everything else here is a pure function over the files' text.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from launcher.model.gpu import HostMemory

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
    cpuinfo = _read(root / "proc/cpuinfo")
    return dataclasses.replace(host, cpu_amx=has_amx(cpuinfo), cpu_avx512_bf16=has_avx512_bf16(cpuinfo),
                               cpu_avx512=has_avx512(cpuinfo))


def has_amx(cpuinfo: str | None) -> bool | None:
    """Whether the CPU has AMX tiles (vLLM's CPU MLA kernel depends on it); None if unknown."""
    return _has_cpu_flag(cpuinfo, "amx_tile")


def has_avx512_bf16(cpuinfo: str | None) -> bool | None:
    """Whether the CPU has AVX-512 BF16 (`torch.cpu._is_avx512_bf16_supported`, which vLLM's CPU backend asks
    before it keeps a hybrid model's SSM state in float32 and loads its `_C` build); None if unknown."""
    return _has_cpu_flag(cpuinfo, "avx512_bf16")


def has_avx512(cpuinfo: str | None) -> bool | None:
    """Whether the CPU has the AVX-512 subsets `torch.cpu._is_avx512_supported` asks for (F, BW, VL, DQ): vLLM's CPU
    backend loads its AVX-512 kernels on such hosts and its AVX2 build elsewhere (platforms/cpu.py:631-662, 0.32.0);
    None if unknown."""
    flags = [_has_cpu_flag(cpuinfo, f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq")]
    return None if None in flags else all(flags)


def _has_cpu_flag(cpuinfo: str | None, flag: str) -> bool | None:
    if not cpuinfo:
        return None
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return flag in flags.split()


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
