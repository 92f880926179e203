"""The one door to NVML: the only module that imports `pynvml` (from nvidia-ml-py).

`read_nvml()` opens a session, reads every GPU and MIG instance into the shared
`GpuDevice` values and shuts NVML down again. Processes come back unnamed (pid, bytes,
kind); `launcher.probe` names them through psutil and decides what the engine will see.

Error policy, in one place (`_Session.query`):

* NVML cannot work at all (library missing, driver not loaded, driver/library version
  mismatch, no permission to the device nodes) -> `ProbeError`, one line with a hint.
* One field cannot be read (NotSupported, FunctionNotFound on an older driver, a lost GPU)
  -> that field is None and the device carries a note saying why; the rest still counts.

Command line equivalent of what is read: `nvidia-smi --query-gpu=index,name,uuid,
memory.total,memory.reserved,memory.used,memory.free,compute_cap,mig.mode.current
--format=csv` plus `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, replace
from types import ModuleType, TracebackType
from typing import Any, Final

from launcher.common.errors import ProbeError
from launcher.model.gpu import GpuDevice, GpuProcess

# Where to go when NVML cannot be used: every ProbeError from here ends with this.
NO_GPU_HINT: Final = "or plan without one: --gpu NAME for a hypothetical plan, or --device cpu"

# pynvml exception class name -> (what went wrong, what to do). These stop the probe.
_FATAL: Final[dict[str, tuple[str, str]]] = {
    "NVMLError_LibraryNotFound": (
        "NVML (libnvidia-ml.so.1) could not be loaded: no NVIDIA driver is installed here",
        "install the NVIDIA driver, or in a container run with --gpus / the NVIDIA runtime",
    ),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA driver is installed but its kernel module is not loaded",
        "check `nvidia-smi`; load it with `sudo modprobe nvidia` or reboot",
    ),
    "NVMLError_LibRmVersionMismatch": (
        "NVML and the loaded kernel driver differ in version (driver upgraded without reboot?)",
        "reboot, or reload the nvidia kernel modules",
    ),
    "NVMLError_NoPermission": (
        "no permission to open the NVIDIA device nodes (/dev/nvidia*)",
        "run as a user in the group owning /dev/nvidia*, or pass the GPUs into the container",
    ),
    "NVMLError_Uninitialized": (
        "NVML was used before it was initialised",
        "this is a safe-serve bug; please report it",
    ),
}

# Per-field failures -> short reason for the device's note.
_FIELD_REASONS: Final[dict[str, str]] = {
    "NVMLError_NotSupported": "not supported on this device",
    "NVMLError_NoPermission": "no permission to read it",
    "NVMLError_GpuIsLost": "the GPU is lost (needs a reset or reboot)",
    "NVMLError_FunctionNotFound": "this driver is too old to report it",
    "NVMLError_ArgumentVersionMismatch": "this driver expects another struct version",
}

# Field failures that mean "try the older entry point instead".
_FALLBACK_ERRORS: Final = frozenset({"NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch"})
# MIG slots with no instance answer NotFound (or InvalidArgument past the end): not a fault.
_EMPTY_SLOT_ERRORS: Final = frozenset({"NVMLError_NotFound", "NVMLError_InvalidArgument"})


@dataclass(frozen=True)
class NvmlReport:
    """What NVML said, before processes are named and visibility is resolved."""

    devices: tuple[GpuDevice, ...]  # each GPU followed by its MIG instances
    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: str | None  # "12.4"
    notes: tuple[str, ...] = ()


class FieldUnavailable(Exception):
    """One NVML field could not be read; `reason` goes into the device's notes."""

    def __init__(self, reason: str, *, error_name: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_name = error_name


def read_nvml() -> NvmlReport:
    """Read every device NVML sees, in NVML index order (PCI bus order).

    Raises:
        ProbeError: NVML cannot be used at all (see `_FATAL` for the causes).
    """
    with NvmlSession() as session:
        return session.report()


def format_cuda_version(version: int) -> str:
    """NVML's integer CUDA driver version (12040) as people write it ("12.4")."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _bindings() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise ProbeError(
            "the NVML Python bindings are not installed (module pynvml)",
            hint=f"pip install nvidia-ml-py, {NO_GPU_HINT}",
        ) from None


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__


class NvmlSession:
    """`with NvmlSession() as nvml:` initialises NVML on entry and shuts it down on exit.

    Nothing is loaded until `__enter__`, so importing this module costs nothing on CPU-only
    hosts. NVML counts init/shutdown pairs itself, so nested sessions are safe.
    """

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._memory_v2: bool | None = None  # decided on first use: does the driver export _v2?
        self._processes_v3: bool | None = None

    def __enter__(self) -> NvmlSession:
        nvml = _bindings()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise self._fatal(exc, "initialising NVML") from None
        self._nvml = nvml
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            # Nothing useful to do about a failed shutdown on the way out.
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    # ---- the choke point ---------------------------------------------------------------

    def query(self, function: str, *args: Any) -> Any:
        """Call `pynvml.<function>(*args)`, decoding bytes and applying the error policy.

        Raises:
            ProbeError: NVML itself stopped working.
            FieldUnavailable: only this value cannot be read.
        """
        nvml = self._nvml
        if nvml is None:
            raise ProbeError("NVML was queried outside a session", hint="this is a safe-serve bug; please report it")
        fn = getattr(nvml, function, None)
        if fn is None:  # an nvidia-ml-py older than the function
            raise FieldUnavailable(f"pynvml lacks {function}", error_name="NVMLError_FunctionNotFound")
        try:
            value = fn(*args)
        except nvml.NVMLError as exc:
            name = _error_name(exc)
            if name in _FATAL and name != "NVMLError_NoPermission":
                raise self._fatal(exc, function) from None
            raise FieldUnavailable(_FIELD_REASONS.get(name, f"NVML error: {exc}"), error_name=name) from None
        # Older pynvml releases return bytes for strings.
        return value.decode(errors="replace") if isinstance(value, bytes) else value

    def field(self, notes: list[str], what: str, function: str, *args: Any) -> Any:
        """`query`, but a field failure becomes None plus a note `"<what>: <reason>"`."""
        try:
            return self.query(function, *args)
        except FieldUnavailable as exc:
            notes.append(f"{what}: {exc.reason}")
            return None

    @staticmethod
    def _fatal(exc: BaseException, doing: str) -> ProbeError:
        message, todo = _FATAL.get(_error_name(exc), (f"NVML failed while {doing}: {exc}", "check `nvidia-smi`"))
        return ProbeError(message, hint=f"{todo}; {NO_GPU_HINT}")

    # ---- versioned reads with a fallback ----------------------------------------------

    def memory(self, handle: object, notes: list[str]) -> tuple[int, int, int, int | None] | None:
        """(total, free, used, reserved) in bytes, or None plus a note when unknown.

        Unified-memory parts (GH200-class, GB10) answer NotSupported or a total of 0:
        their free memory is the host's and cannot be read here, so it stays unknown.
        """
        try:
            total, free, used, reserved = self._memory_info(handle)
        except FieldUnavailable as exc:
            if exc.error_name == "NVMLError_NotSupported":
                notes.append("memory: not supported (unified memory part?): free unknown")
            else:
                notes.append(f"memory: {exc.reason}")
            return None
        if total == 0:
            notes.append("memory: NVML reports a total of 0 (unified memory part?): free unknown")
            return None
        if free > total:  # planned as is, the budget would leave more free than the card holds
            notes.append(f"memory: NVML reports {free} bytes free of a total of {total} (an impossible reading): "
                         "free unknown")
            return None
        return total, free, used, reserved

    def _memory_info(self, handle: object) -> tuple[int, int, int, int | None]:
        # v2 adds `reserved` (driver/firmware) and leaves it out of `used`; v1 counts it as used.
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if self._memory_v2 is not False and version is not None:
            try:
                info = self.query("nvmlDeviceGetMemoryInfo", handle, version)
            except FieldUnavailable as exc:
                if exc.error_name not in _FALLBACK_ERRORS:
                    raise
                self._memory_v2 = False  # the driver lacks _v2: ask v1 from now on
            else:
                self._memory_v2 = True
                return int(info.total), int(info.free), int(info.used), int(info.reserved)
        info = self.query("nvmlDeviceGetMemoryInfo", handle)
        return int(info.total), int(info.free), int(info.used), None

    def processes(self, handle: object, kind: str, notes: list[str]) -> list[Any] | None:
        """Raw process records of one kind ("compute"/"graphics"): the v3 call, else v2."""
        base = f"nvmlDeviceGet{kind.capitalize()}RunningProcesses"
        if self._processes_v3 is not False:
            try:
                records = self.query(f"{base}_v3", handle)
            except FieldUnavailable as exc:
                if exc.error_name not in _FALLBACK_ERRORS:
                    notes.append(f"{kind} processes: {exc.reason}")
                    return None
                self._processes_v3 = False
            else:
                self._processes_v3 = True
                return list(records)
        records = self.field(notes, f"{kind} processes", f"{base}_v2", handle)
        return None if records is None else list(records)

    def cuda_driver_version(self, notes: list[str]) -> str | None:
        try:
            version = self.query("nvmlSystemGetCudaDriverVersion_v2")
        except FieldUnavailable as exc:
            if exc.error_name not in _FALLBACK_ERRORS:
                notes.append(f"CUDA driver version: {exc.reason}")
                return None
            version = self.field(notes, "CUDA driver version", "nvmlSystemGetCudaDriverVersion")
        return None if version is None else format_cuda_version(int(version))

    # ---- the whole report --------------------------------------------------------------

    def report(self) -> NvmlReport:
        notes: list[str] = []
        driver = self.field(notes, "driver version", "nvmlSystemGetDriverVersion")
        nvml_version = self.field(notes, "NVML version", "nvmlSystemGetNVMLVersion")
        cuda = self.cuda_driver_version(notes)
        try:
            count = int(self.query("nvmlDeviceGetCount"))
        except FieldUnavailable as exc:
            hint = f"check `nvidia-smi`; {NO_GPU_HINT}"
            raise ProbeError(f"NVML could not count the GPUs: {exc.reason}", hint=hint) from None
        if count == 0:
            notes.append("NVML sees no GPU (in a container: was it started with GPUs passed in?)")
        devices: list[GpuDevice] = []
        for index in range(count):
            devices.extend(self._read_gpu(index))
        return NvmlReport(tuple(devices), driver, nvml_version, cuda, tuple(notes))

    def _read_gpu(self, index: int) -> list[GpuDevice]:
        """The GPU at `index`, followed by its MIG instances when MIG is on."""
        try:
            handle = self.query("nvmlDeviceGetHandleByIndex", index)
        except FieldUnavailable as exc:
            # A lost GPU must not hide the others; it shows up unusable (free unknown).
            return [GpuDevice(index=index, name="unreadable GPU", total_bytes=0, free_bytes=None,
                              notes=(f"handle: {exc.reason}",))]
        notes: list[str] = []
        mig_mode = self._mig_mode(handle, notes)
        gpu = self._read_device(handle, index, None, notes, mig_mode=mig_mode)
        if not mig_mode:
            return [gpu]
        instances = self._read_mig_instances(handle, gpu, notes)
        return [replace(gpu, notes=tuple(notes)), *instances]

    def _mig_mode(self, handle: object, notes: list[str]) -> bool | None:
        try:
            current, _pending = self.query("nvmlDeviceGetMigMode", handle)
        except FieldUnavailable as exc:
            if exc.error_name == "NVMLError_NotSupported":
                return False  # a GPU without MIG support has MIG off; nothing to note
            notes.append(f"MIG mode: {exc.reason}")
            return None
        return bool(current == getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _read_mig_instances(self, parent_handle: object, parent: GpuDevice, notes: list[str]) -> list[GpuDevice]:
        slots = self.field(notes, "MIG instances", "nvmlDeviceGetMaxMigDeviceCount", parent_handle)
        instances: list[GpuDevice] = []
        for slot in range(int(slots or 0)):
            try:
                handle = self.query("nvmlDeviceGetMigDeviceHandleByIndex", parent_handle, slot)
            except FieldUnavailable as exc:
                if exc.error_name not in _EMPTY_SLOT_ERRORS:
                    notes.append(f"MIG slot {slot}: {exc.reason}")
                continue
            instance = self._read_device(handle, parent.index, slot, [], mig_mode=True)
            if instance.compute_capability is None and parent.compute_capability is not None:
                # A MIG instance is a slice of its parent: same architecture.
                instance = replace(instance, compute_capability=parent.compute_capability)
            instances.append(instance)
        return instances

    def _read_device(
        self, handle: object, index: int, mig_index: int | None, notes: list[str], *, mig_mode: bool | None
    ) -> GpuDevice:
        name = self.field(notes, "name", "nvmlDeviceGetName", handle)
        uuid = self.field(notes, "UUID", "nvmlDeviceGetUUID", handle)
        memory = self.memory(handle, notes)
        capability = self._compute_capability(handle, notes, quiet=mig_index is not None)
        processes = self._device_processes(handle, notes)
        total, free, used, reserved = memory if memory is not None else (0, None, None, None)
        return GpuDevice(
            index=index,
            name=name if name is not None else "unknown GPU",
            total_bytes=total,
            free_bytes=free,
            used_bytes=used,
            reserved_bytes=reserved,
            uuid=uuid,
            compute_capability=capability,
            mig_index=mig_index,
            mig_mode=mig_mode,
            processes=processes,
            notes=tuple(notes),
        )

    def _compute_capability(self, handle: object, notes: list[str], *, quiet: bool) -> tuple[int, int] | None:
        # MIG handles may not answer; the caller then copies the parent's, so no note.
        sink: list[str] = [] if quiet else notes
        value = self.field(sink, "compute capability", "nvmlDeviceGetCudaComputeCapability", handle)
        return None if value is None else (int(value[0]), int(value[1]))

    def _device_processes(self, handle: object, notes: list[str]) -> tuple[GpuProcess, ...]:
        """Compute then graphics processes; a pid in both lists is one 'compute+graphics' entry."""
        by_pid: dict[int, GpuProcess] = {}
        for kind in ("compute", "graphics"):
            for record in self.processes(handle, kind, notes) or ():
                pid = int(record.pid)
                used = None if record.usedGpuMemory is None else int(record.usedGpuMemory)
                seen = by_pid.get(pid)
                if seen is None:
                    by_pid[pid] = GpuProcess(pid=pid, used_bytes=used, kind=kind)
                elif seen.kind != kind:
                    # NVML reports the same allocation in both lists; count it once.
                    by_pid[pid] = GpuProcess(pid=pid, used_bytes=seen.used_bytes, kind=f"{seen.kind}+{kind}")
        return tuple(by_pid.values())

