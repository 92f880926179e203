"""`safe-serve gpus`: the probe's inventory as a one-shot table or as versioned JSON.

The table is in the spirit of nvitop's: one row per device, then per device the other
tenants and how much they hold, then the notes that say which values are unknown and why.
Lines stay within 100 columns; long names and command lines are cut with an ellipsis.
"""

from __future__ import annotations

import textwrap
from typing import Any, Final

from launcher.common.shown import printable
from launcher.common.units import format_gib
from launcher.model.gpu import GpuDevice, GpuInventory, GpuProcess, HostMemory

SCHEMA: Final = "safe-serve.gpus/1"
WIDTH: Final = 100
_BAR_CELLS: Final = 10
_ROW: Final = "{label:<9} {name:<28} {total:>10} {used:>10} {free:>10}  {bar:<12} {cc:>4} {mig:>4}"


# ---- the table ----------------------------------------------------------------------


def render_inventory(inv: GpuInventory) -> str:
    """The inventory as a table people read; unknown values print as `?`, never 0."""
    lines = [_header(inv), _ROW.format(label="GPU", name="NAME", total="TOTAL", used="USED", free="FREE",
                                       bar="MEM", cc="CC", mig="MIG")]
    lines += [_device_row(device) for device in inv.devices] or ["(no GPU found)"]
    lines.append(_visible_line(inv))
    if any(device.total_bytes for device in inv.devices):
        lines.append(_cuda_totals_line(inv))
    if inv.host is not None:
        lines.append(_host_line(inv.host))
    tenants = [line for device in inv.devices for line in _tenant_lines(device)]
    if tenants:
        lines += ["", "other tenants:", *tenants]
    notes = [*inv.notes, *(f"{device.label}: {note}" for device in inv.devices for note in device.notes)]
    if notes:
        lines += ["", "notes:", *(_wrap(note) for note in notes)]
    return "\n".join(lines)


def _header(inv: GpuInventory) -> str:
    parts = [
        f"driver {inv.driver_version or '?'}",
        f"CUDA {inv.cuda_driver_version or '?'}",
        f"NVML {inv.nvml_version or '?'}",
    ]
    if inv.source != "nvml":
        parts.append(f"source {inv.source}")
    return _cut(", ".join(parts), WIDTH)


def _device_row(device: GpuDevice) -> str:
    label = str(device.index) if device.mig_index is None else f"{device.index} MIG {device.mig_index}"
    cc = device.compute_capability
    return _ROW.format(
        label=label,
        name=_cut(_short_name(device), 28),
        total=_gib_or_unknown(_known_total(device)),
        used=_gib_or_unknown(device.used_bytes),
        free=_gib_or_unknown(device.free_bytes),
        bar=_bar(device),
        cc=f"{cc[0]}.{cc[1]}" if cc else "?",
        mig=_mig_text(device),
    )


def _short_name(device: GpuDevice) -> str:
    """MIG rows show their profile ("MIG 3g.40gb"): the parent's row already names the GPU."""
    head, sep, profile = device.name.rpartition(" MIG ")
    return f"  MIG {profile}" if device.is_mig and sep and head else device.name


def _bar(device: GpuDevice) -> str:
    """What is not free (used + reserved) as a share of the total, in ten cells."""
    if device.free_bytes is None or device.total_bytes <= 0:
        return "[    ?     ]"
    share = min(1.0, max(0.0, (device.total_bytes - device.free_bytes) / device.total_bytes))
    filled = round(share * _BAR_CELLS)
    return "[" + "#" * filled + "." * (_BAR_CELLS - filled) + "]"


def _mig_text(device: GpuDevice) -> str:
    if device.is_mig:
        return "inst"
    return {True: "on", False: "off", None: "?"}[device.mig_mode]


def _visible_line(inv: GpuInventory) -> str:
    chosen = "unset" if inv.visible_devices_env is None else repr(inv.visible_devices_env)
    seen = ", ".join(device.label for device in inv.visible) or "no GPU"
    return _cut(f"engine sees (CUDA_VISIBLE_DEVICES {chosen}): {seen}", WIDTH)


def _cuda_totals_line(inv: GpuInventory) -> str:
    """`CUDA totals (from the CUDA driver): GPU 0 79.19 GiB, GPU 1 44.42 GiB`, wrapped on many GPUs."""
    parts = [f"{device.label} {format_gib(device.usable_total_bytes)}" for device in inv.devices if device.total_bytes]
    sources = sorted({device.usable_total_source for device in inv.devices if device.total_bytes})
    words = {"cuda driver": "the CUDA driver", "catalog": "published totals",
             "nvml reserved": "NVML total - reserved", "typical reserve": "NVML total - a typical reserve"}
    return textwrap.fill(f"CUDA totals (from {'; '.join(words[s] for s in sources)}): {', '.join(parts)}",
                         width=WIDTH, subsequent_indent="    ")


def _host_line(host: HostMemory) -> str:
    limit = "none" if host.cgroup_limit_bytes is None else format_gib(host.cgroup_limit_bytes)
    nodes = "node" if host.numa_nodes == 1 else "nodes"
    return (
        f"host: {format_gib(host.total_bytes)} total, {format_gib(host.available_bytes)} available, "
        f"cgroup limit {limit}, {host.numa_nodes} NUMA {nodes}"
    )


def _tenant_lines(device: GpuDevice) -> list[str]:
    """`GPU 0: free 9.1 GiB: 14.2 GiB held by pid 4121 python (user alice) `vllm serve …``."""
    if not device.processes:
        return []
    free = "unknown" if device.free_bytes is None else format_gib(device.free_bytes, digits=1)
    first = f"{device.label}: free {free}: "
    indent = " " * len(first)
    return [_process_line(first if i == 0 else indent, process) for i, process in enumerate(device.processes)]


def _process_line(prefix: str, process: GpuProcess) -> str:
    held = "? GiB" if process.used_bytes is None else format_gib(process.used_bytes, digits=1)
    who = f"pid {process.pid} {process.name or '(name unknown)'}"
    if process.user:
        who += f" (user {process.user})"
    if process.kind != "compute":
        who += f" [{process.kind}]"
    line = f"{prefix}{held} held by {who}"
    room = WIDTH - len(line) - 3  # a space and two backticks
    if process.cmdline and room >= 8:
        line += f" `{_cut(process.cmdline, room)}`"
    return _cut(line, WIDTH)


def _wrap(note: str) -> str:
    return textwrap.fill(printable(note), width=WIDTH, initial_indent="  ", subsequent_indent="    ")


def _known_total(device: GpuDevice) -> int | None:
    # The probe stores 0 when NVML could not say (the field is not optional): show unknown.
    return None if device.total_bytes == 0 and device.free_bytes is None else device.total_bytes


def _gib_or_unknown(num_bytes: int | None) -> str:
    return "?" if num_bytes is None else format_gib(num_bytes)


def _cut(text: str, width: int) -> str:
    """`text` escaped (a tenant's command line or a device name with a newline or terminal escape
    cannot forge a line or repaint the screen), then cut to `width`."""
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


# ---- JSON ---------------------------------------------------------------------------


def inventory_to_json(inv: GpuInventory) -> dict[str, Any]:
    """The inventory as plain JSON data: stable keys, bytes as ints, unknown as null."""
    return {
        "schema": SCHEMA,
        "source": inv.source,
        "driver_version": inv.driver_version,
        "nvml_version": inv.nvml_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "cuda_visible_devices": inv.visible_devices_env,
        "devices": [_device_json(device) for device in inv.devices],
        "visible": [_device_ref(device) for device in inv.visible],
        "host": None if inv.host is None else _host_json(inv.host),
        "notes": list(inv.notes),
    }


def _device_ref(device: GpuDevice) -> dict[str, Any]:
    return {"index": device.index, "mig_index": device.mig_index, "uuid": device.uuid, "label": device.label}


def _device_json(device: GpuDevice) -> dict[str, Any]:
    cc = device.compute_capability
    return {
        **_device_ref(device),
        "name": device.name,
        "total_bytes": _known_total(device),
        "free_bytes": device.free_bytes,
        "used_bytes": device.used_bytes,
        "reserved_bytes": device.reserved_bytes,
        "cuda_total_bytes": device.cuda_total_bytes,
        "cuda_total_source": device.usable_total_source,
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
        "mig_mode": device.mig_mode,
        "source": device.source,
        "processes": [_process_json(process) for process in device.processes],
        "notes": list(device.notes),
    }


def _process_json(process: GpuProcess) -> dict[str, Any]:
    return {
        "pid": process.pid,
        "kind": process.kind,
        "used_bytes": process.used_bytes,
        "name": process.name,
        "user": process.user,
        "cmdline": process.cmdline,
    }


def _host_json(host: HostMemory) -> dict[str, Any]:
    return {
        "total_bytes": host.total_bytes,
        "available_bytes": host.available_bytes,
        "cgroup_limit_bytes": host.cgroup_limit_bytes,
        "numa_nodes": host.numa_nodes,
    }
