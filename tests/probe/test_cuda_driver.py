# ruff: noqa: F811  (pytest fixtures imported from test_probe are parameters here)
"""The CUDA total from the CUDA driver (launcher/probe/cuda_driver.py), through the real ctypes
child against a stand-in libcuda.so.1 (tests/nvml_stub/cuda_stub.c) built beside the NVML one."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

from launcher.common.units import MiB
from launcher.model.gpu import GpuDevice
from launcher.probe.cuda_driver import (
    CudaReport,
    CudaTotal,
    _queries,
    child_env,
    parse_child_output,
    read_cuda_totals,
    uuid_hex,
    with_cuda_totals,
)
from tests.probe.test_probe import (  # noqa: F401
    A100_UUID,
    H100_UUID,
    L40S_UUID,
    MIG_1G_UUID,
    MIG_3G_UUID,
    StubLibs,
    _fixture,
    _safe_serve,
    by_label,
    dead_pid,
    probe,
    sleeper,
    stub_libs,
)

H100_CUDA_TOTAL = 85029615043  # profiles/gpus.yaml: the published total, as tests/nvml_stub/fixtures set it
L40S_CUDA_TOTAL = 47695611822


def _h100(**changes: object) -> GpuDevice:
    device = GpuDevice(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=85520809984, free_bytes=69704089600,
                       used_bytes=15250489344, reserved_bytes=566231040, uuid=H100_UUID, mig_mode=False)
    return dataclasses.replace(device, **changes)  # type: ignore[arg-type]


class TestThroughTheStubDriver:
    def test_mig_instances_are_measured_by_their_own_uuid(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                          tmp_path: Path) -> None:
        """Every MIG instance is named to CUDA (unset, CUDA would enumerate only the first), and the
        A100 in MIG mode, which CUDA cannot use whole, gets no CUDA total."""
        inv = probe(stub_libs.current, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path)
        devices = by_label(inv)
        assert H100_CUDA_TOTAL == devices["GPU 0"].cuda_total_bytes
        assert 42144366592 == devices["GPU 1 MIG 0"].cuda_total_bytes == devices["GPU 1 MIG 0"].usable_total_bytes
        assert 10468982784 == devices["GPU 1 MIG 2"].cuda_total_bytes
        assert devices["GPU 1"].cuda_total_bytes is None and not devices["GPU 1"].cuda_total_measured
        assert not any("CUDA totals" in note for note in inv.notes)

    def test_before_cuda_11_4_mig_instances_keep_nvml_figures(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                              tmp_path: Path) -> None:
        """Without cuDeviceGetUuid_v2 a MIG instance may answer with its parent's UUID: not taken for the
        parent, not taken for an instance; the whole H100 is still measured."""
        inv = probe(stub_libs.old_driver, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path)
        devices = by_label(inv)
        assert H100_CUDA_TOTAL == devices["GPU 0"].cuda_total_bytes
        assert [None, None, None] == [devices[label].cuda_total_bytes
                                      for label in ("GPU 1", "GPU 1 MIG 0", "GPU 1 MIG 2")]
        assert ["CUDA totals not measured for GPU 1 MIG 0, GPU 1 MIG 2: the CUDA driver did not name them "
                "(NVML total less the driver reserve used)"] == [n for n in inv.notes if "CUDA totals" in n]

    def test_a_failing_cuinit_leaves_nvml_figures_and_says_why(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                                dead_pid: int, tmp_path: Path) -> None:
        text = _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid).replace(
            "cuda=12040", "cuda=12040 cuinit=999")
        inv = probe(stub_libs.current, text, tmp_path)
        h100, l40s = inv.devices
        assert (None, None) == (h100.cuda_total_bytes, l40s.cuda_total_bytes)
        assert 85520809984 - 566231040 == h100.usable_total_bytes  # NVML total less NVML's reserved
        assert 47852814336 == l40s.free_bytes  # NVML's free, untouched
        assert ("CUDA totals not measured: cuInit failed: CUDA_ERROR_UNKNOWN",) == tuple(
            n for n in inv.notes if "CUDA" in n and "ORDER" not in n)

    def test_a_total_above_nvml_is_not_trusted(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                               dead_pid: int, tmp_path: Path) -> None:
        text = _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid).replace(
            f"cuda_total={L40S_CUDA_TOTAL}", "cuda_total=48305799169")
        inv = probe(stub_libs.current, text, tmp_path)
        h100, l40s = inv.devices
        assert H100_CUDA_TOTAL == h100.cuda_total_bytes and l40s.cuda_total_bytes is None
        assert ("the CUDA driver's total 46068 MiB is not within NVML's 46068 MiB (at most it, at least half): "
                "not used",) == l40s.notes
        assert not any("CUDA totals" in note for note in inv.notes)  # it did name the L40S

    def test_a_driver_that_crashes_the_query_is_noted(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                      dead_pid: int, tmp_path: Path) -> None:
        text = _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid).replace(
            "cuda=12040", "cuda=12040 cucrash=1")
        inv = probe(stub_libs.current, text, tmp_path)
        assert all(device.cuda_total_bytes is None for device in inv.devices)
        assert ("CUDA totals not measured: the driver query ended with status -6 and no answer",) == tuple(
            n for n in inv.notes if "CUDA totals" in n)

    def test_no_driver_library(self, stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int,
                               tmp_path: Path) -> None:
        """NVML answers but libcuda.so.1 does not load (an empty file stands first on the path, so a real
        driver on the host is not found either)."""
        libs = tmp_path / "libs"
        libs.mkdir()
        shutil.copy(stub_libs.current / "libnvidia-ml.so.1", libs)
        (libs / "libcuda.so.1").write_bytes(b"")
        inv = probe(libs, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path)
        assert all(device.cuda_total_bytes is None for device in inv.devices)
        assert ("CUDA totals not measured: libcuda.so.1 could not be loaded (no CUDA driver library on the "
                "engine's library path)",) == tuple(n for n in inv.notes if "CUDA totals" in n)

    def test_a_hung_driver_costs_the_timeout_only(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                  dead_pid: int, tmp_path: Path) -> None:
        fixture = tmp_path / "fixture.txt"
        fixture.write_text(_fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid).replace(
            "cuda=12040", "cuda=12040 cudelay_ms=30000"))
        env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(stub_libs.current),
               "SAFE_SERVE_NVML_STUB_FIXTURE": str(fixture)}
        started = time.monotonic()
        report = read_cuda_totals(env, [_h100()], timeout_s=1.0)
        assert time.monotonic() - started < 10
        assert ({}, ("CUDA totals not measured: the CUDA driver did not answer in 1 s (cuInit; see `nvidia-smi` "
                     "and the kernel log)",)) == (dict(report.totals), report.notes)

    def test_the_plan_and_gpus_say_the_total_was_measured(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                          dead_pid: int, tmp_path: Path) -> None:
        text = _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid)
        run = _safe_serve(stub_libs.current, text, tmp_path, "plan", "qwen2.5-7b", "--json",
                          env={"CUDA_VISIBLE_DEVICES": "1"})
        assert run.returncode == 0, run.stderr
        total = next(item for item in json.loads(run.stdout)["budget"] if item["key"] == "total")
        assert (L40S_CUDA_TOTAL, 0, "measured") == (total["bytes"], total["error_bytes"], total["source"])
        assert total["detail"] == "cudaMemGetInfo total (measured here: the CUDA driver's cuDeviceTotalMem)"
        gpus = _safe_serve(stub_libs.current, text, tmp_path, "gpus")
        assert "CUDA totals (from the CUDA driver): GPU 0 79.19 GiB, GPU 1 44.42 GiB" in gpus.stdout.splitlines()
        doc = json.loads(_safe_serve(stub_libs.current, text, tmp_path, "gpus", "--json").stdout)
        assert ["cuda driver", "cuda driver"] == [device["cuda_total_source"] for device in doc["devices"]]


class TestPure:
    def test_uuid_hex(self) -> None:
        assert "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718" == uuid_hex(H100_UUID)
        assert "d184f67cc95f5ef2a935195bd0094fbd" == uuid_hex(MIG_3G_UUID)
        assert [None, None, None] == [uuid_hex(text) for text in (None, "GPU-12", "GPU-8f2a1c3e-5b7d-4e9f-a1b2-zzzz")]

    def test_one_query_for_the_whole_gpus_and_one_per_mig_instance(self) -> None:
        """A CUDA process enumerates one MIG device at most; a GPU in MIG mode is no CUDA device."""
        parent = GpuDevice(index=1, name="A100", total_bytes=1, free_bytes=1, uuid=A100_UUID, mig_mode=True)
        unknown = GpuDevice(index=2, name="L40S", total_bytes=1, free_bytes=1, uuid=L40S_UUID, mig_mode=None)
        first, second = (GpuDevice(index=1, name="A100 MIG", total_bytes=1, free_bytes=1, uuid=uuid, mig_index=slot,
                                   mig_mode=True) for uuid, slot in ((MIG_3G_UUID, 0), (MIG_1G_UUID, 2)))
        queries = _queries([unknown, _h100(), parent, first, second])
        assert [[H100_UUID, L40S_UUID], [MIG_3G_UUID], [MIG_1G_UUID]] == [
            [d.uuid for d in group] for group in queries]  # the GPU of unknown MIG mode last
        env = child_env({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "HOME": "/root"},
                        queries[0])
        assert {"CUDA_VISIBLE_DEVICES": f"{H100_UUID},{L40S_UUID}", "HOME": "/root"} == env

    @pytest.mark.parametrize("line", [
        "not json", "[1, 2]", '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718", "total": true}',
        '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f6071", "total": 5}',  # 31 digits
        '{"uuid": "8F2A1C3E5B7D4E9FA1B2C3D4E5F60718", "total": 5}',  # CUDA's bytes print lower-case
        '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718", "total": 1e12}',
        '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718", "total": 1125899906842624}',  # 1 PiB
        '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718", "total": 0}',
        "[" * 60000,  # json.loads raises RecursionError here, not ValueError
    ])
    def test_a_line_that_is_not_the_childs_is_ignored(self, line: str) -> None:
        assert CudaReport({}) == parse_child_output(line + "\n")

    def test_child_records(self) -> None:
        report = parse_child_output(
            '{"uuid": "8f2a1c3e5b7d4e9fa1b2c3d4e5f60718", "total": 85029615043, "uuid_v2": true}\n'
            '{"error": "device", "ordinal": 1, "code": 101}\n')
        assert {"8f2a1c3e5b7d4e9fa1b2c3d4e5f60718": CudaTotal(85029615043, True)} == dict(report.totals)
        assert ("CUDA totals not measured: device failed: CUresult 101",) == report.notes

    def test_free_is_the_smaller_of_nvml_and_cuda(self) -> None:
        """v2 (reserved apart): CUDA's free is its total less NVML's used; v1 counts the reserve as used."""
        gap_smaller = CudaReport({uuid_hex(H100_UUID) or "": CudaTotal(85520809984 - 700 * MiB, True)})
        (v2,) = with_cuda_totals([_h100()], gap_smaller)
        assert 85520809984 - 700 * MiB - 15250489344 == v2.free_bytes
        (v1,) = with_cuda_totals([_h100(reserved_bytes=None, used_bytes=15250489344 + 566231040,
                                        free_bytes=85520809984 - 15250489344 - 566231040)], gap_smaller)
        assert 85520809984 - 15250489344 - 566231040 == v1.free_bytes
        gap_larger = CudaReport({uuid_hex(H100_UUID) or "": CudaTotal(H100_CUDA_TOTAL, True)})
        (kept,) = with_cuda_totals([_h100()], gap_larger)
        assert 69704089600 == kept.free_bytes and H100_CUDA_TOTAL == kept.usable_total_bytes

    def test_a_stranger_uuid_changes_nothing(self) -> None:
        report = CudaReport({"0" * 32: CudaTotal(80 * 2**30, True), uuid_hex(L40S_UUID) or "": CudaTotal(5, True)})
        assert (_h100(),) == with_cuda_totals([_h100()], report)
