"""Host memory under cgroup limits (launcher/probe/host.py): the parsers, and the reader on a fake
/proc + /sys tree."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest

from launcher.common.units import GiB, MiB
from launcher.model.gpu import HostMemory
from launcher.probe import (
    CgroupMemory,
    cgroup_levels,
    count_numa_nodes,
    host_memory,
    parse_cgroup_v1_limit,
    parse_cgroup_v2_max,
    parse_memory_stat,
    parse_proc_cgroup,
    probe_host,
)


class TestCgroupParsing:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param("max\n", None, id="max"),
            pytest.param("17179869184\n", 16 * GiB, id="limit"),
            pytest.param("", None, id="empty"),
        ],
    )
    def test_v2_max(self, text: str, expected: int | None) -> None:
        """memory.max is a byte count or `max` for no limit."""
        assert expected == parse_cgroup_v2_max(text)

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param("9223372036854771712\n", None, id="unlimited-x86"),
            pytest.param("9223372036854775807\n", None, id="unlimited-int64"),
            pytest.param("8589934592\n", 8 * GiB, id="limit"),
            pytest.param("-1\n", None, id="minus-one"),
        ],
    )
    def test_v1_limit(self, text: str, expected: int | None) -> None:
        """memory.limit_in_bytes reports 'no limit' as a huge number, which means None."""
        assert expected == parse_cgroup_v1_limit(text)

    def test_memory_stat(self) -> None:
        """One counter is read out of memory.stat by name; a missing one is 0."""
        text = "anon 1000\nfile 5000\ninactive_file 3000\nactive_file 2000\n"

        assert (3000, 0) == (parse_memory_stat(text, "inactive_file"), parse_memory_stat(text, "shmem"))

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param("0::/system.slice/safe-serve.service\n", ("/system.slice/safe-serve.service", None),
                         id="v2"),
            pytest.param("0::/\n", ("/", None), id="v2-namespace-root"),
            pytest.param("12:cpu,cpuacct:/docker/ab12\n5:memory:/docker/ab12\n0::/\n", ("/", "/docker/ab12"),
                         id="hybrid"),
            pytest.param("4:memory,hugetlb:/user.slice\n", (None, "/user.slice"), id="v1-shared-hierarchy"),
            pytest.param("", (None, None), id="none"),
        ],
    )
    def test_proc_self_cgroup(self, text: str, expected: tuple[str | None, str | None]) -> None:
        """/proc/self/cgroup gives the v2 path and the v1 memory controller's path."""
        assert expected == parse_proc_cgroup(text)

    def test_numa_nodes(self) -> None:
        """Only nodeN directories count as NUMA nodes, and there is always at least one."""
        assert (2, 1) == (count_numa_nodes(["node0", "node1", "possible", "power", "has_cpu"]), count_numa_nodes([]))

    def test_headroom_subtracts_working_set(self) -> None:
        """What a cgroup can still take is its limit minus usage that cannot be reclaimed."""
        assert 176 * MiB == CgroupMemory(256 * MiB, 100 * MiB, 20 * MiB).headroom_bytes
        assert 0 == CgroupMemory(256 * MiB, 300 * MiB).headroom_bytes

    def test_host_memory_takes_tightest_level(self) -> None:
        """The smallest limit and headroom along the cgroup path clamp the host's numbers."""
        levels = [CgroupMemory(8 * GiB, 7 * GiB), CgroupMemory(4 * GiB, 1 * GiB)]

        assert HostMemory(total_bytes=4 * GiB, available_bytes=1 * GiB, cgroup_limit_bytes=4 * GiB, numa_nodes=2) \
            == host_memory(64 * GiB, 50 * GiB, levels, numa_nodes=2)
        assert HostMemory(64 * GiB, 50 * GiB) == host_memory(64 * GiB, 50 * GiB, [])


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


class TestProbeHost:
    def test_cgroup_v2_service_limit(self, tmp_path: Path) -> None:
        """A systemd service's memory.max (and its slice's) clamp what psutil reports."""
        root = _tree(tmp_path, {
            "proc/self/cgroup": "0::/system.slice/safe-serve.service\n",
            "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
            "sys/fs/cgroup/system.slice/memory.max": "max\n",
            "sys/fs/cgroup/system.slice/safe-serve.service/memory.max": f"{256 * MiB}\n",
            "sys/fs/cgroup/system.slice/safe-serve.service/memory.current": f"{100 * MiB}\n",
            "sys/fs/cgroup/system.slice/safe-serve.service/memory.stat": f"anon 1\ninactive_file {20 * MiB}\n",
            "sys/devices/system/node/node0/meminfo": "",
            "sys/devices/system/node/node1/meminfo": "",
        })

        host = probe_host(root)

        assert (256 * MiB, 176 * MiB, 256 * MiB, 2) == (
            host.total_bytes, host.available_bytes, host.cgroup_limit_bytes, host.numa_nodes)

    def test_container_without_cgroup_namespace_reads_mount_root(self, tmp_path: Path) -> None:
        """A host path in /proc/self/cgroup that is not mounted here falls back to the mount root."""
        root = _tree(tmp_path, {
            "proc/self/cgroup": "0::/docker/0123abcd\n",
            "sys/fs/cgroup/memory.max": f"{512 * MiB}\n",
            "sys/fs/cgroup/memory.current": f"{128 * MiB}\n",
        })

        assert [CgroupMemory(512 * MiB, 128 * MiB, 0)] == cgroup_levels(root)

    def test_cgroup_v1_limit(self, tmp_path: Path) -> None:
        """On cgroup v1 the memory controller's limit_in_bytes and total_inactive_file apply."""
        root = _tree(tmp_path, {
            "proc/self/cgroup": "7:memory:/\n0::/\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{300 * MiB}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{200 * MiB}\n",
            "sys/fs/cgroup/memory/memory.stat": f"inactive_file 1\ntotal_inactive_file {50 * MiB}\n",
        })

        host = probe_host(root)

        assert (300 * MiB, 150 * MiB, 300 * MiB, 1) == (
            host.total_bytes, host.available_bytes, host.cgroup_limit_bytes, host.numa_nodes)

    def test_no_cgroup_limit_is_psutil(self, tmp_path: Path) -> None:
        """Without any limit the host's own numbers stand and the limit is None."""
        root = _tree(tmp_path, {"proc/self/cgroup": "0::/user.slice\n", "sys/fs/cgroup/user.slice/memory.max": "max"})

        host = probe_host(root)

        assert (psutil.virtual_memory().total, None) == (host.total_bytes, host.cgroup_limit_bytes)


class TestCpuFlags:
    ZEN4 = "flags\t\t: fpu sse2 avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16\n"
    ZEN3 = "flags\t\t: fpu sse2 avx2 fma\n"

    def test_avx512_needs_the_four_subsets_torch_asks_for(self, tmp_path: Path) -> None:
        """vLLM's CPU build loads its AVX-512 kernels only where F, BW, VL and DQ are all there."""
        for name, cpuinfo, avx512, bf16 in (("zen4", self.ZEN4, True, True), ("zen3", self.ZEN3, False, False),
                                            ("knl", "flags\t: avx2 avx512f avx512cd avx512er\n", False, False)):
            host = probe_host(_tree(tmp_path / name, {"proc/cpuinfo": cpuinfo}))
            assert (host.cpu_avx512, host.cpu_avx512_bf16, host.cpu_amx) == (avx512, bf16, False), name

    def test_no_cpuinfo_is_unknown(self, tmp_path: Path) -> None:
        host = probe_host(_tree(tmp_path, {"proc/self/cgroup": "0::/\n"}))
        assert (host.cpu_avx512, host.cpu_avx512_bf16, host.cpu_amx) == (None, None, None)
