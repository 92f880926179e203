"""The probe through the real pynvml, loaded against a stand-in libnvidia-ml.so.1.

The stub (tests/nvml_stub/nvml_stub.c) is built with gcc into tests/_build/ once per
session; each probe runs in a fresh interpreter (tests/nvml_stub/probe_child.py) whose
LD_LIBRARY_PATH points at it, because the dynamic loader reads that variable only at
process start and pynvml keeps the first library it loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from launcher.common.units import GiB
from launcher.edge.gpus_view import inventory_to_json, render_inventory
from launcher.model.gpu import GpuDevice, GpuInventory, GpuProcess, HostMemory

REPO = Path(__file__).resolve().parents[1].parent
STUB_DIR = REPO / "tests" / "nvml_stub"
FIXTURES = STUB_DIR / "fixtures"
BUILD = REPO / "tests" / "_build" / "nvml_stub"

H100_UUID = "GPU-8f2a1c3e-5b7d-4e9f-a1b2-c3d4e5f60718"
L40S_UUID = "GPU-8f2b9d4a-0c1e-4f2a-9b3c-4d5e6f708192"
A100_UUID = "GPU-3eb79704-1571-707c-aee8-f43ce747313d"
MIG_3G_UUID = "MIG-d184f67c-c95f-5ef2-a935-195bd0094fbd"
MIG_1G_UUID = "MIG-5c89b9a3-7e4d-5f1a-b2c3-d4e5f6a7b8c9"


# ---- building and running the stub ----------------------------------------------------


@dataclass(frozen=True)
class StubLibs:
    current: Path  # a directory holding a libnvidia-ml.so.1 with today's entry points
    old_driver: Path  # one without memory _v2 / processes _v3 / CUDA version _v2
    missing: Path  # an empty libnvidia-ml.so.1: dlopen fails as if no driver were installed


def _build(variant: Path, *defines: str) -> Path:
    """The NVML stand-in and the CUDA driver's (cuda_stub.c) side by side, as a driver installs them."""
    variant.mkdir(parents=True, exist_ok=True)
    for library, source in (("libnvidia-ml.so.1", "nvml_stub.c"), ("libcuda.so.1", "cuda_stub.c")):
        scratch = variant / f".build-{uuid.uuid4().hex}.so"  # build aside, then swap in atomically
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-fvisibility=hidden",
             f"-Wl,-soname,{library}", *defines, "-o", str(scratch), str(STUB_DIR / source)],
            check=True,
        )
        os.replace(scratch, variant / library)
    return variant


@pytest.fixture(scope="session")
def stub_libs() -> StubLibs:
    """Compile the stub library in both driver flavours (skipped only without gcc)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: cannot build the stand-in libnvidia-ml.so.1")
    missing = BUILD / "missing"
    missing.mkdir(parents=True, exist_ok=True)
    # Found first on LD_LIBRARY_PATH, an empty file makes dlopen fail even on hosts with a
    # real driver, so "no driver" is tested the same everywhere.
    (missing / "libnvidia-ml.so.1").write_bytes(b"")
    return StubLibs(
        current=_build(BUILD / "current"),
        old_driver=_build(BUILD / "old_driver", "-DSTUB_OLD_DRIVER"),
        missing=missing,
    )


@pytest.fixture(scope="module")
def sleeper() -> Iterator[psutil.Process]:
    """A real foreign process the fixtures list as a GPU tenant, so psutil can name it."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield psutil.Process(process.pid)
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has exited: psutil finds nothing there."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _run_child(
    lib_dir: Path, fixture_text: str, tmp_path: Path, env: Mapping[str, str]
) -> subprocess.CompletedProcess[bytes]:
    fixture = tmp_path / "fixture.txt"
    fixture.write_text(fixture_text)
    child_env = {key: value for key, value in os.environ.items() if not key.startswith(("CUDA_", "NVIDIA_"))}
    child_env.update(
        LD_LIBRARY_PATH=str(lib_dir),
        SAFE_SERVE_NVML_STUB_FIXTURE=str(fixture),
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, str(STUB_DIR / "probe_child.py"), json.dumps(dict(env))],
        env=child_env, capture_output=True, timeout=60, check=False,
    )


def _fixture(name: str, **values: int) -> str:
    text = (FIXTURES / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key.upper()}@", str(value))
    return text


def probe(lib_dir: Path, fixture_text: str, tmp_path: Path, env: Mapping[str, str] | None = None) -> GpuInventory:
    result = _run_child(lib_dir, fixture_text, tmp_path, env or {})
    assert result.returncode == 0, result.stderr.decode()
    inventory = pickle.loads(result.stdout)
    assert isinstance(inventory, GpuInventory)
    return inventory


def probe_error(lib_dir: Path, fixture_text: str, tmp_path: Path) -> tuple[int, str]:
    result = _run_child(lib_dir, fixture_text, tmp_path, {})
    return result.returncode, result.stderr.decode()


def by_label(inventory: GpuInventory) -> dict[str, GpuDevice]:
    return {device.label: device for device in inventory.devices}


# ---- through pynvml and the stub --------------------------------------------------------


class TestSeveralGpus:
    def test_reads_every_gpu_with_v2_memory(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                            dead_pid: int, tmp_path: Path) -> None:
        """Each GPU comes back with its name, UUID, v2 memory (reserved apart) and capability."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path)

        h100, l40s = inv.devices
        assert (0, "NVIDIA H100 80GB HBM3", H100_UUID) == (h100.index, h100.name, h100.uuid)
        assert (85520809984, 69704089600, 15250489344, 566231040) == (
            h100.total_bytes, h100.free_bytes, h100.used_bytes, h100.reserved_bytes)
        assert (9, 0) == h100.compute_capability
        assert h100.mig_mode is False
        assert (1, "NVIDIA L40S", L40S_UUID) == (l40s.index, l40s.name, l40s.uuid)
        # The CUDA driver gives the L40S 150 MiB less than NVML's total less its reserved: CUDA's free
        # is its own total less what NVML counts as used, not NVML's free.
        assert (48305799168, 47695611822, 0, 452984832) == (
            l40s.total_bytes, l40s.free_bytes, l40s.used_bytes, l40s.reserved_bytes)
        assert (85029615043, 47695611822) == (h100.cuda_total_bytes, l40s.cuda_total_bytes)
        assert h100.cuda_total_measured and l40s.cuda_total_measured
        assert (0, 0) == (h100.usable_total_error_bytes, l40s.usable_total_error_bytes)
        assert (8, 9) == l40s.compute_capability
        assert l40s.mig_mode is False  # NOT_SUPPORTED for MIG means MIG is off, without a note
        assert () == l40s.notes == h100.notes
        assert "nvml" == inv.source == h100.source

    def test_system_versions(self, stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int,
                             tmp_path: Path) -> None:
        """Driver, NVML and CUDA driver versions are read and CUDA's is written as major.minor."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path)

        assert ("550.54.15", "12.550.54.15", "12.4") == (
            inv.driver_version, inv.nvml_version, inv.cuda_driver_version)

    def test_all_visible_when_unset(self, stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int,
                                    tmp_path: Path) -> None:
        """Without CUDA_VISIBLE_DEVICES the engine sees every GPU in NVML order, and host memory is read."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path,
                    env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})

        assert [H100_UUID, L40S_UUID] == [device.uuid for device in inv.visible]
        assert inv.visible_devices_env is None
        assert inv.host is not None and 0 < inv.host.available_bytes <= inv.host.total_bytes
        assert () == inv.notes

    def test_cuda_visible_devices_reorders(self, stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int,
                                           tmp_path: Path) -> None:
        """CUDA_VISIBLE_DEVICES from the env argument picks and orders the devices."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path,
                    env={"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})

        assert ["GPU 1", "GPU 0"] == [device.label for device in inv.visible]
        assert "1,0" == inv.visible_devices_env

    def test_mixed_gpus_without_pci_order_are_noted(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                    dead_pid: int, tmp_path: Path) -> None:
        """Different GPU models with CUDA's default fastest-first order get a warning note."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path,
                    env={"CUDA_VISIBLE_DEVICES": "0"})

        assert any("CUDA_DEVICE_ORDER" in note for note in inv.notes)


class TestOtherTenants:
    def test_foreign_process_named_through_psutil(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                  dead_pid: int, tmp_path: Path) -> None:
        """A compute process NVML lists is named by psutil: pid, bytes, name, user, command line."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path)

        tenant = inv.devices[0].processes[0]
        assert GpuProcess(pid=sleeper.pid, used_bytes=15250489344, kind="compute", name="sleep",
                          user=psutil.Process().username(), cmdline="sleep 300") == tenant

    def test_exited_process_keeps_pid_without_names(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                    dead_pid: int, tmp_path: Path) -> None:
        """A graphics process that is gone keeps its pid; unknown bytes and names stay None."""
        inv = probe(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid), tmp_path)

        assert GpuProcess(pid=dead_pid, used_bytes=None, kind="graphics") == inv.devices[0].processes[1]
        assert () == inv.devices[1].processes

    def test_pid_in_both_lists_counted_once(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                            tmp_path: Path) -> None:
        """A process in the compute and the graphics list is one entry, its memory counted once."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        (tenant,) = inv.devices[0].processes
        assert (sleeper.pid, 1073741824, "compute+graphics", "sleep") == (
            tenant.pid, tenant.used_bytes, tenant.kind, tenant.name)


class TestMig:
    def test_mig_instances_are_devices(self, stub_libs: StubLibs, sleeper: psutil.Process, tmp_path: Path) -> None:
        """A MIG-enabled GPU is followed by its instances, each with its own memory and UUID."""
        inv = probe(stub_libs.current, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path)

        assert ["GPU 0", "GPU 1", "GPU 1 MIG 0", "GPU 1 MIG 2"] == [device.label for device in inv.devices]
        devices = by_label(inv)
        parent, big, small = devices["GPU 1"], devices["GPU 1 MIG 0"], devices["GPU 1 MIG 2"]
        assert (True, False) == (parent.mig_mode, devices["GPU 0"].mig_mode)
        assert (MIG_3G_UUID, "NVIDIA A100-SXM4-80GB MIG 3g.40gb") == (big.uuid, big.name)
        assert (42144366592, 31658606592, 10485760000) == (big.total_bytes, big.free_bytes, big.used_bytes)
        assert (MIG_1G_UUID, 10468982784, 10468982784) == (small.uuid, small.total_bytes, small.free_bytes)
        assert (8, 0) == big.compute_capability == small.compute_capability  # copied from the parent
        assert (1, 1) == (big.index, small.index)
        assert [(sleeper.pid, 10485760000, "sleep")] == [(p.pid, p.used_bytes, p.name) for p in big.processes]
        assert () == small.processes
        assert () == big.notes

    def test_unset_sees_first_mig_instance_only(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                tmp_path: Path) -> None:
        """With MIG on and nothing chosen, CUDA enumerates only the first MIG instance."""
        inv = probe(stub_libs.current, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path)

        assert [MIG_3G_UUID] == [device.uuid for device in inv.visible]
        assert any("one MIG instance" in note for note in inv.notes)

    def test_mig_uuid_selects_instance(self, stub_libs: StubLibs, sleeper: psutil.Process, tmp_path: Path) -> None:
        """CUDA_VISIBLE_DEVICES naming a MIG UUID makes exactly that instance visible."""
        inv = probe(stub_libs.current, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path,
                    env={"CUDA_VISIBLE_DEVICES": MIG_1G_UUID})

        assert ["GPU 1 MIG 2"] == [device.label for device in inv.visible]

    def test_probed_mig_inventory_renders(self, stub_libs: StubLibs, sleeper: psutil.Process, tmp_path: Path) -> None:
        """A probed MIG node renders within 100 columns with instance profiles, and as JSON."""
        inv = probe(stub_libs.current, _fixture("mig.txt", sleep_pid=sleeper.pid), tmp_path)

        lines = render_inventory(inv).splitlines()
        assert max(len(line) for line in lines) <= 100
        assert any(line.startswith("1 MIG 0     MIG 3g.40gb") for line in lines)
        assert f"GPU 1 MIG 0: free 29.5 GiB: 9.8 GiB held by pid {sleeper.pid} sleep" in "\n".join(lines)
        visible = inventory_to_json(inv)["visible"]
        assert [{"index": 1, "mig_index": 0, "uuid": MIG_3G_UUID, "label": "GPU 1 MIG 0"}] == visible


class TestDegradedFields:
    def test_not_supported_memory_and_processes_degrade_that_device_only(
            self, stub_libs: StubLibs, sleeper: psutil.Process, tmp_path: Path) -> None:
        """NOT_SUPPORTED for memory and processes leaves those fields unknown with notes, nothing else."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        t4 = inv.devices[1]
        assert ("Tesla T4", (7, 5)) == (t4.name, t4.compute_capability)
        assert (None, None, None) == (t4.free_bytes, t4.used_bytes, t4.reserved_bytes)
        assert ("memory: not supported (unified memory part?): free unknown",
                "compute processes: not supported on this device",
                "graphics processes: not supported on this device") == t4.notes
        assert 22659727360 == inv.devices[0].free_bytes  # its neighbours are untouched
        assert () == inv.devices[0].notes

    def test_unified_memory_total_zero_means_free_unknown(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                          tmp_path: Path) -> None:
        """A part reporting a total of 0 (unified memory) has free unknown, never 0."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        gb10 = inv.devices[2]
        assert ("NVIDIA GB10", None, (12, 1)) == (gb10.name, gb10.free_bytes, gb10.compute_capability)
        assert ("memory: NVML reports a total of 0 (unified memory part?): free unknown",) == gb10.notes

    def test_free_above_total_means_free_unknown(self, stub_libs: StubLibs, tmp_path: Path) -> None:
        """An impossible reading (999 GB free of 80 GiB) was planned as is: 857.68 GiB 'left free' in the
        budget and a bar longer than the card. Free unknown, with a note, like a part that cannot say."""
        text = ("system driver=550.54.15 nvml=12.550.54.15 cuda=12040\n"
                'gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-00000000-aaaa-bbbb-cccc-000000000000 '
                "total=85899345920 reserved=0 used=0 free=999999999999 cc=9.0 mig=unsupported\n")
        device = probe(stub_libs.current, text, tmp_path).devices[0]
        assert device.free_bytes is None
        assert ("memory: NVML reports 999999999999 bytes free of a total of 85899345920 (an impossible "
                "reading): free unknown",) == device.notes

    def test_capability_and_permission_failures_are_noted(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                          tmp_path: Path) -> None:
        """Unsupported compute capability and forbidden process lists are None/empty plus notes."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        l4 = inv.devices[3]
        assert (None, 23733469184) == (l4.compute_capability, l4.free_bytes)
        assert ("compute capability: not supported on this device",
                "compute processes: no permission to read it",
                "graphics processes: no permission to read it") == l4.notes

    def test_lost_gpu_does_not_hide_the_others(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                               tmp_path: Path) -> None:
        """A GPU lost at its handle is listed as unreadable with unknown memory; the rest still read."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        lost = inv.devices[4]
        assert (4, "unreadable GPU", None, None) == (lost.index, lost.name, lost.free_bytes, lost.uuid)
        assert ("handle: the GPU is lost (needs a reset or reboot)",) == lost.notes
        assert 5 == len(inv.devices)

    def test_no_gpu_at_all_is_an_empty_inventory(self, stub_libs: StubLibs, tmp_path: Path) -> None:
        """A driver that sees no GPU gives no devices, nothing visible and a note saying so."""
        inv = probe(stub_libs.current, "system driver=550.54.15 nvml=12.550.54.15 cuda=12040\n", tmp_path)

        assert ((), ()) == (inv.devices, inv.visible)
        assert ("NVML sees no GPU (in a container: was it started with GPUs passed in?)",) == inv.notes

    def test_unsupported_cuda_version_is_a_system_note(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                       tmp_path: Path) -> None:
        """A CUDA driver version NVML will not give is None with a note; other versions still read."""
        inv = probe(stub_libs.current, _fixture("degraded.txt", sleep_pid=sleeper.pid), tmp_path)

        assert (None, "580.95.05") == (inv.cuda_driver_version, inv.driver_version)
        assert "CUDA driver version: not supported on this device" in inv.notes

    def test_old_driver_falls_back_to_v1_entry_points(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                      dead_pid: int, tmp_path: Path) -> None:
        """Without memory _v2 and processes _v3 the v1/v2 calls are used: reserved is unknown."""
        inv = probe(stub_libs.old_driver, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid),
                    tmp_path)

        h100 = inv.devices[0]
        # v1 counts the driver's reservation as used: 15250489344 + 566231040.
        assert (85520809984, 69704089600, 15816720384, None) == (
            h100.total_bytes, h100.free_bytes, h100.used_bytes, h100.reserved_bytes)
        assert [sleeper.pid, dead_pid] == [process.pid for process in h100.processes]
        assert ("12.4", ()) == (inv.cuda_driver_version, h100.notes)


class TestNoDriver:
    def test_library_missing_is_one_line_probe_error(self, stub_libs: StubLibs, tmp_path: Path) -> None:
        """Without libnvidia-ml.so.1 the probe raises ProbeError: one line with a way forward."""
        code, stderr = probe_error(stub_libs.missing, "", tmp_path)

        assert 69 == code
        assert [
            "ProbeError: NVML (libnvidia-ml.so.1) could not be loaded: no NVIDIA driver is installed here "
            "(install the NVIDIA driver, or in a container run with --gpus / the NVIDIA runtime; "
            "or plan without one: --gpu NAME for a hypothetical plan, or --device cpu)"
        ] == stderr.splitlines()

    def test_driver_not_loaded(self, stub_libs: StubLibs, tmp_path: Path) -> None:
        """nvmlInit answering DRIVER_NOT_LOADED becomes a ProbeError telling how to load it."""
        code, stderr = probe_error(stub_libs.current, _fixture("driver_not_loaded.txt"), tmp_path)

        assert 69 == code
        (line,) = stderr.splitlines()
        assert line.startswith("ProbeError: the NVIDIA driver is installed but its kernel module is not loaded (")
        assert "sudo modprobe nvidia" in line and "--device cpu" in line

    def test_driver_library_version_mismatch(self, stub_libs: StubLibs, tmp_path: Path) -> None:
        """An RM/NVML version mismatch (upgrade without reboot) says to reboot."""
        code, stderr = probe_error(stub_libs.current, _fixture("rm_version_mismatch.txt"), tmp_path)

        assert 69 == code
        (line,) = stderr.splitlines()
        assert "differ in version" in line and "reboot" in line and "Traceback" not in stderr


# ---- rendering ----------------------------------------------------------------------------


LONG_CMD = "python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-70B-Instruct " * 3
INVENTORY = GpuInventory(
    devices=(
        GpuDevice(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=85520809984, free_bytes=int(9.1 * GiB),
                  used_bytes=int(14.2 * GiB), reserved_bytes=566231040, uuid=H100_UUID, compute_capability=(9, 0),
                  mig_mode=False,
                  processes=(GpuProcess(pid=4121, used_bytes=int(14.2 * GiB), kind="compute", name="python",
                                        user="alice", cmdline=LONG_CMD),
                             GpuProcess(pid=4200, used_bytes=None, kind="graphics"))),
        GpuDevice(index=1, name="NVIDIA GB10", total_bytes=0, free_bytes=None, compute_capability=(12, 1),
                  mig_mode=False, notes=("memory: not supported (unified memory part?): free unknown",)),
    ),
    visible=(),
    host=HostMemory(total_bytes=64 * GiB, available_bytes=60 * GiB, cgroup_limit_bytes=None, numa_nodes=1),
    driver_version="550.54.15", nvml_version="12.550.54.15", cuda_driver_version="12.4",
    visible_devices_env="",
    notes=("CUDA_VISIBLE_DEVICES='' leaves no GPU visible to the engine",),
)


class TestRender:
    def test_table_rows_and_tenants(self) -> None:
        """The table shows each device, its tenants with bytes and users, and the notes."""
        text = render_inventory(INVENTORY)

        assert "driver 550.54.15, CUDA 12.4, NVML 12.550.54.15" == text.splitlines()[0]
        assert "GPU 0: free 9.1 GiB: 14.2 GiB held by pid 4121 python (user alice) `python -m vllm" in text
        assert "? GiB held by pid 4200 (name unknown) [graphics]" in text
        assert "engine sees (CUDA_VISIBLE_DEVICES ''): no GPU" in text
        assert "GPU 1: memory: not supported (unified memory part?): free unknown" in text

    def test_unknown_memory_is_a_question_mark(self) -> None:
        """A device whose memory is unknown prints `?`, never 0 GiB."""
        row = next(line for line in render_inventory(INVENTORY).splitlines() if line.startswith("1 "))

        assert "0.00 GiB" not in row and "[    ?     ]" in row

    def test_lines_fit_100_columns(self) -> None:
        """Every line, long command lines included, fits in 100 columns."""
        assert max(len(line) for line in render_inventory(INVENTORY).splitlines()) <= 100

    def test_a_tenants_crafted_command_line_cannot_forge_a_line(self) -> None:
        """Another user's process named with a newline and terminal escapes (`exec -a`) printed raw in
        `safe-serve gpus`: a forged "other tenants" line and a cleared screen. Escaped as the plan does."""
        evil = GpuProcess(pid=4300, used_bytes=GiB, kind="compute", name="sle\x1bep", user="mallory",
                          cmdline="evil\x1b[2J\nGPU 0: free 80.0 GiB: nothing held")
        device = dataclasses.replace(INVENTORY.devices[0], processes=(evil,), name="H100\x1b]0;x\x07")
        text = render_inventory(dataclasses.replace(INVENTORY, devices=(device,)))
        assert "\x1b" not in text and "\x07" not in text
        tenants = text.splitlines()[text.splitlines().index("other tenants:") + 1:]
        assert tenants[0].startswith("GPU 0: free 9.1 GiB: 1.0 GiB held by pid 4300 sle\\x1bep (user mallory) "
                                     "`evil\\x1b[2J\\nGPU 0: free 80")  # one line, cut at 100 columns
        assert not any("nothing held" in line for line in tenants[1:])

    def test_json_shape(self) -> None:
        """The JSON has the schema tag, stable keys, bytes as ints and unknowns as null."""
        data = inventory_to_json(INVENTORY)

        assert "safe-serve.gpus/1" == data["schema"]
        assert ["schema", "source", "driver_version", "nvml_version", "cuda_driver_version",
                "cuda_visible_devices", "devices", "visible", "host", "notes"] == list(data)
        h100, gb10 = data["devices"]
        assert (85520809984, 566231040, "9.0", H100_UUID) == (
            h100["total_bytes"], h100["reserved_bytes"], h100["compute_capability"], h100["uuid"])
        assert {"pid": 4121, "kind": "compute", "used_bytes": int(14.2 * GiB), "name": "python", "user": "alice",
                "cmdline": LONG_CMD} == h100["processes"][0]
        assert (None, None) == (gb10["total_bytes"], gb10["free_bytes"])
        assert {"total_bytes": 64 * GiB, "available_bytes": 60 * GiB, "cgroup_limit_bytes": None,
                "numa_nodes": 1} == data["host"]
        assert json.loads(json.dumps(data)) == data


# ---- the CLI on the live probe ----------------------------------------------------------


def _safe_serve(lib_dir: Path, fixture_text: str, tmp_path: Path, *argv: str,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    fixture = tmp_path / "fixture.txt"
    fixture.write_text(fixture_text)
    child_env = {key: value for key, value in os.environ.items() if not key.startswith(("CUDA_", "NVIDIA_"))}
    child_env.update(LD_LIBRARY_PATH=str(lib_dir), SAFE_SERVE_NVML_STUB_FIXTURE=str(fixture),
                     SAFE_SERVE_STATE_DIR=str(tmp_path / "state"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "launcher", *argv], env=child_env, capture_output=True,
                          text=True, timeout=60, check=False, cwd=REPO)


class TestCliOnTheProbe:
    def test_plan_uses_free_memory_and_names_the_tenant(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                        dead_pid: int, tmp_path: Path) -> None:
        """Without --gpu the plan reads NVML: the busy H100's free memory and its tenant by name."""
        text = _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid)
        run = _safe_serve(stub_libs.current, text, tmp_path, "plan", "qwen2.5-7b", "--json",
                          env={"CUDA_VISIBLE_DEVICES": "0"})
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        other = next(item for item in doc["budget"] if item["key"] == "other")
        context = next(item for item in doc["budget"] if item["key"] == "context")
        requested = next(item for item in doc["budget"] if item["key"] == "requested")
        assert doc["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
        # The CUDA driver's total - NVML's free: the tenant's 15,250,489,344 B and the 72 MiB NVML's
        # reserved holds beyond the driver's own gap (free is the smaller of the two views: the safe side).
        assert other["bytes"] == 85029615043 - 69704089600 == 15250489344 + 75036099
        assert f"pid {sleeper.pid} sleep" in other["detail"]
        # requested = ceil(total x u) stays within free - context - margin: vLLM will start.
        assert requested["bytes"] <= 69704089600 - context["bytes"] - 256 * 2**20
        assert doc["gpu_memory_utilization"] < 0.92

    def test_gpus_command(self, stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int,
                          tmp_path: Path) -> None:
        """`safe-serve gpus --json` prints the probe object with both devices."""
        run = _safe_serve(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid),
                          tmp_path, "gpus", "--json")
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["schema"] == "safe-serve.gpus/1" and len(doc["devices"]) == 2

    def test_start_lock_is_taken_before_planning(self, stub_libs: StubLibs, sleeper: psutil.Process,
                                                 dead_pid: int, tmp_path: Path) -> None:
        """A second start on a GPU whose lock is held waits, then exits 75 naming the holder."""
        from launcher.common.devlock import DeviceLock

        lock_dir = tmp_path / "locks"
        lock_dir.mkdir()
        holder = DeviceLock([H100_UUID], lock_dir=lock_dir)
        holder.acquire()
        try:
            run = _safe_serve(stub_libs.current, _fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid),
                              tmp_path, "qwen2.5-7b", "--lock-timeout", "1", "--engine-cmd", "true",
                              env={"CUDA_VISIBLE_DEVICES": "0", "SAFE_SERVE_LOCK_DIR": str(lock_dir)})
        finally:
            holder.release()
        assert run.returncode == 75, run.stderr
        assert str(os.getpid()) in run.stderr and "Traceback" not in run.stderr
