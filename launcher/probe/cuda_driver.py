"""The CUDA total each device gives the engines, read from the CUDA driver itself.

vLLM and SGLang size everything from `torch.cuda.mem_get_info()`'s total (cudaMemGetInfo), which
sits a driver reserve below NVML's total. NVML's memory info v2 names a "reserved" figure, but
nothing says it is that same gap (the stand-in fixtures' H100 shows how far apart a guess can
be); the driver's own answer is `cuDeviceTotalMem_v2`, the figure behind
`cudaDeviceProp.totalGlobalMem` (torch's `total_memory`), which is cudaMemGetInfo's total too
(not yet checked on a GPU here: the first device lent compares them). It needs `cuInit` only:
no CUDA context is created, so no device memory is taken from anyone.

The driver is asked in a child interpreter (`python -I -S`, ctypes only, nothing of ours
imported): cuInit loads the driver's threads and state into a process for good, which the
supervisor must not carry, and a driver that hangs (a GPU fallen off the bus) costs a timeout
instead of the launch. The child names every device by UUID, so it is matched to NVML's record
whatever CUDA_VISIBLE_DEVICES says; its answers are checked against NVML before they are used.
One child asks for the whole GPUs and one for each MIG instance: a CUDA process enumerates a
single MIG device (NVIDIA's MIG user guide, "CUDA device enumeration").
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from launcher.common.units import MiB
from launcher.model.gpu import GpuDevice

# cuInit on a host of eight GPUs without persistence mode takes seconds; longer is a driver in trouble.
TIMEOUT_S: Final = 20.0
# What the child may print: one short JSON line per device; more is not the child we wrote.
_MAX_OUTPUT: Final = 64 * 1024
_UUID_HEX: Final = re.compile(r"[0-9a-f]{32}")

# The child: ctypes against libcuda.so.1, one JSON object per line. Error codes are CUresult values.
CHILD_SOURCE: Final = r"""
import ctypes, json, sys
def say(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    say(error="library")
    sys.exit(0)
rc = cuda.cuInit(0)
if rc:
    say(error="cuInit", code=rc)
    sys.exit(0)
count = ctypes.c_int(0)
rc = cuda.cuDeviceGetCount(ctypes.byref(count))
if rc:
    say(error="cuDeviceGetCount", code=rc)
    sys.exit(0)
get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None)
v2 = get_uuid is not None
get_uuid = get_uuid or cuda.cuDeviceGetUuid
for ordinal in range(count.value):
    device, uuid, total = ctypes.c_int(0), (ctypes.c_ubyte * 16)(), ctypes.c_size_t(0)
    rc = cuda.cuDeviceGet(ctypes.byref(device), ordinal) or get_uuid(uuid, device) or \
        cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device)
    if rc:
        say(error="device", ordinal=ordinal, code=rc)
        continue
    say(uuid=bytes(uuid).hex(), total=total.value, uuid_v2=v2)
"""

# CUresult codes worth a word (cuda.h); the rest are named by number.
_CU_ERRORS: Final = {100: "no CUDA device (CUDA_ERROR_NO_DEVICE)", 999: "CUDA_ERROR_UNKNOWN",
                     3: "CUDA_ERROR_NOT_INITIALIZED", 804: "the driver does not support this GPU "
                     "(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)", 35: "the driver is older than the runtime "
                     "(CUDA_ERROR_INSUFFICIENT_DRIVER)", 46: "the devices are busy or unavailable "
                     "(CUDA_ERROR_DEVICES_UNAVAILABLE)"}


@dataclass(frozen=True)
class CudaTotal:
    total_bytes: int
    uuid_v2: bool  # cuDeviceGetUuid_v2: a MIG instance is named by its own UUID


@dataclass(frozen=True)
class CudaReport:
    """What the driver said: totals by UUID (32 hex digits), and why any are missing."""

    totals: Mapping[str, CudaTotal]
    notes: tuple[str, ...] = ()
    no_library: bool = False  # libcuda.so.1 did not load: no other query can do better


def uuid_hex(nvml_uuid: str | None) -> str | None:
    """`GPU-8f2a1c3e-5b7d-...` / `MIG-...` -> the 32 hex digits CUDA's CUuuid holds, else None."""
    if not nvml_uuid or "-" not in nvml_uuid:
        return None
    digits = nvml_uuid.split("-", 1)[1].replace("-", "").lower()
    return digits if _UUID_HEX.fullmatch(digits) else None


def child_env(env: Mapping[str, str], devices: Sequence[GpuDevice]) -> dict[str, str]:
    """The engine's environment (its LD_LIBRARY_PATH finds the driver the engine will load) with
    `devices` named by UUID: CUDA then enumerates those, whatever the engine's own selection."""
    child = {k: v for k, v in env.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    child["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in devices if d.uuid)
    return child


def _queries(devices: Sequence[GpuDevice]) -> list[list[GpuDevice]]:
    """Which devices each child asks about: every whole GPU CUDA can use in one, and each MIG instance
    in its own (a CUDA process enumerates a single MIG device, however many are named). A GPU whose MIG
    mode NVML could not read goes last, so a CUDA that cannot use it stops after the others."""
    whole = [d for d in devices if d.uuid and not d.is_mig and d.mig_mode is not True]
    whole.sort(key=lambda d: d.mig_mode is None)
    return ([whole] if whole else []) + [[d] for d in devices if d.uuid and d.is_mig]


def read_cuda_totals(env: Mapping[str, str], devices: Sequence[GpuDevice], *,
                     timeout_s: float = TIMEOUT_S) -> CudaReport:
    """Ask the CUDA driver, in children, for each device's total within `timeout_s` in all. Never
    raises: a driver that cannot answer leaves NVML's figures in place, with a note saying why."""
    deadline = time.monotonic() + timeout_s
    totals: dict[str, CudaTotal] = {}
    notes: list[str] = []
    for group in _queries(devices):
        report, final = _ask(child_env(env, group), deadline - time.monotonic(), timeout_s)
        totals.update(report.totals)
        notes += report.notes
        if final:
            break  # no driver, or a hung one: asking again costs the same
    return CudaReport(totals, tuple(dict.fromkeys(notes)))


def _ask(env: dict[str, str], left_s: float, timeout_s: float) -> tuple[CudaReport, bool]:
    """One child's report, and whether asking again is pointless (no driver library, no child, a hang)."""
    hung = CudaReport({}, (f"CUDA totals not measured: the CUDA driver did not answer in {timeout_s:.0f} s "
                           "(cuInit; see `nvidia-smi` and the kernel log)",))
    if left_s <= 0:
        return hung, True
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", CHILD_SOURCE], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    except OSError as exc:
        return CudaReport({}, (f"CUDA totals not measured: the driver query could not start ({exc.strerror})",)), True
    try:
        out, _ = proc.communicate(timeout=left_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return hung, True
    except BaseException:  # Ctrl-C while waiting: the child is in its own session and would not see it
        _stop(proc)
        raise
    report = parse_child_output(out[:_MAX_OUTPUT].decode("ascii", "replace"))
    if not report.totals and not report.notes:
        return CudaReport({}, (f"CUDA totals not measured: the driver query ended with status {proc.returncode} "
                               "and no answer",)), False
    return report, report.no_library


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The child is ours and leads its own process group: end the group (a helper the driver started
    could hold the pipe open) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # in the kernel (D state): the pipe is closed when it goes


def parse_child_output(text: str) -> CudaReport:
    """The child's lines, each checked: a UUID of 32 hex digits and a total in bytes."""
    totals: dict[str, CudaTotal] = {}
    notes: list[str] = []
    no_library = False
    for line in text.splitlines()[:256]:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        error = record.get("error")
        if error == "library":
            no_library = True
            notes.append("CUDA totals not measured: libcuda.so.1 could not be loaded (no CUDA driver "
                         "library on the engine's library path)")
        elif isinstance(error, str):
            code = record.get("code")
            what = _CU_ERRORS.get(code, f"CUresult {code}") if isinstance(code, int) else "no code"
            notes.append(f"CUDA totals not measured: {error[:40]} failed: {what}")
        else:
            uuid, total = record.get("uuid"), record.get("total")
            if isinstance(uuid, str) and _UUID_HEX.fullmatch(uuid) and type(total) is int and 0 < total < 1 << 50:
                totals[uuid] = CudaTotal(total, record.get("uuid_v2") is True)
    return CudaReport(totals, tuple(dict.fromkeys(notes)), no_library)


def with_cuda_totals(devices: Sequence[GpuDevice], report: CudaReport) -> tuple[GpuDevice, ...]:
    """Each device with the total its driver gives CUDA, where the driver named it and the figure is
    one NVML's record allows (at most NVML's total, at least half of it); free memory as CUDA sees it
    (no more than the CUDA total less what NVML counts as used)."""
    by_uuid = {uuid_hex(d.uuid): d for d in devices if uuid_hex(d.uuid)}
    measured: dict[str, int] = {}
    for uuid, found in report.totals.items():
        device = by_uuid.get(uuid)
        if device is None or (device.mig_mode and not device.is_mig):
            continue  # not NVML's, or a MIG instance answering with its parent's UUID (before CUDA 11.4)
        if device.is_mig and not found.uuid_v2:
            continue
        measured[uuid] = found.total_bytes
    updated = []
    for device in devices:
        total = measured.get(uuid_hex(device.uuid) or "")
        if total is None:
            updated.append(device)
        elif not device.total_bytes // 2 <= total <= device.total_bytes:
            updated.append(dataclasses.replace(device, notes=(*device.notes, (
                f"the CUDA driver's total {total // MiB} MiB is not within NVML's {device.total_bytes // MiB} MiB "
                "(at most it, at least half): not used"))))
        else:
            updated.append(_measured(device, total))
    return tuple(updated)


def _measured(device: GpuDevice, total: int) -> GpuDevice:
    free = device.free_bytes
    if free is not None:
        # NVML v2 leaves the reserve out of `used`: CUDA's free is its total less what is used. v1
        # counts the reserve as used, which already keeps NVML's free within CUDA's.
        in_use = device.used_bytes if device.reserved_bytes is not None and device.used_bytes is not None else 0
        free = max(min(free, total - in_use), 0)
    return dataclasses.replace(device, cuda_total_bytes=total, cuda_total_error_bytes=0, cuda_total_why=None,
                               cuda_total_measured=True, free_bytes=free)


def measure(devices: Sequence[GpuDevice], env: Mapping[str, str]) -> tuple[tuple[GpuDevice, ...], tuple[str, ...]]:
    """The devices with their CUDA totals from the driver, and the notes on what could not be read."""
    report = read_cuda_totals(env, devices)
    updated = with_cuda_totals(devices, report)
    asked = {id(d) for group in _queries(devices) for d in group}
    unmatched = [d.label for d, u in zip(devices, updated, strict=True)
                 if id(d) in asked and not u.cuda_total_measured and u.notes == d.notes]
    notes = report.notes
    if report.totals and unmatched:
        notes += (f"CUDA totals not measured for {', '.join(unmatched)}: the CUDA driver did not name "
                  "them (NVML total less the driver reserve used)",)
    return updated, notes
