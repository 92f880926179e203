"""Engine-neutral pieces of every planner: which devices the ranks use, who else holds a GPU's
memory, and the plan for `--trust-engine`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.common.errors import SafeServeError, UsageError, WontFit
from launcher.common.units import format_gib
from launcher.model.gpu import GpuDevice
from launcher.model.resolve import ResolvedModel
from launcher.plan.types import CATALOG, COMPUTED, LEFT_TO_ENGINE, MEASURED, Plan, PlanRequest


def rank_devices(request: PlanRequest, ranks: int, nnodes: int = 1, *, tp_flag: str,
                 kind: str = "tensor x pipeline parallel") -> tuple[GpuDevice, ...]:
    """The devices this node's ranks run on: all ranks, or a 1/nnodes share with `--nnodes`.

    Multi-node runs start safe-serve on every node; each node plans its own ranks, and
    every rank holds the same share of the model, so one node's plan is every node's.
    """
    if nnodes > 1 and ranks % nnodes:
        raise UsageError(f"{ranks} ranks do not split evenly over --nnodes {nnodes}")
    local = ranks // max(nnodes, 1)
    if len(request.gpus) < local:
        where = f" on this node (of {ranks} over {nnodes} nodes)" if nnodes > 1 else ""
        raise WontFit(
            f"{local} ranks ({kind}){where} need {local} GPUs; {len(request.gpus)} visible",
            hint=f"lower {tp_flag}, or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    devices = request.gpus[:local]
    for device in devices:
        if device.free_bytes is None:
            raise WontFit(f"{device.label} ({device.name}): free memory unknown ({'; '.join(device.notes) or 'NVML'})",
                          hint="plan with --gpu NAME for a hypothetical card")
    return devices


def tightest(devices: tuple[GpuDevice, ...]) -> GpuDevice:
    """The rank with the least free memory sets the block count for all ranks."""
    return min(devices, key=lambda d: (d.free_bytes or 0, d.usable_total_bytes))


def tenants_detail(device: GpuDevice) -> str:
    if device.source != "nvml":
        return "hypothetical GPU: assumed idle"
    held = list(device.processes)
    if not held:
        return "NVML used memory (no other processes listed)"
    parts = [f"pid {p.pid} {p.name or '?'}" + (f" {format_gib(p.used_bytes)}" if p.used_bytes else "")
             for p in held[:3]]
    return "NVML: " + ", ".join(parts) + (f" and {len(held) - 3} more" if len(held) > 3 else "")


def unplanned(request: PlanRequest, refusal: SafeServeError, *, newest: str, rules_version: str,
              pinned: Mapping[str, Any], length: int, tp: int, block: int | None) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; the engine sizes itself.

    The plan carries no token prediction (nothing to diverge from); the watcher still
    retunes from the engine's own numbers when it refuses.
    """
    return Plan(
        engine=request.engine, engine_version=request.engine_version or newest, rules_version=rules_version,
        device=request.device, model=request.model.name, max_model_len=length,
        max_model_len_source="left to the engine (--trust-engine)", kv_cache_bytes=0, kv_cache_tokens=0,
        max_concurrency=0.0, budget=(), engine_args=(), engine_env={}, pinned=dict(pinned), tp=tp, block_size=block,
        knob=LEFT_TO_ENGINE,
        gpu_name=request.gpus[0].name if request.gpus else request.device, gpu_count=len(request.gpus),
        notes=(f"--trust-engine: safe-serve's plan refused ({refusal.message}); the engine decides",),
        engine_version_assumed=request.engine_version_assumed,
    )


def not_modelled_warnings(pinned: Mapping[str, Any], not_modelled: Mapping[str, str]) -> list[str]:
    """One warning per pinned flag whose memory the engine's planner does not count."""
    return [f"{flag}: {why}; the plan does not count it" for flag, why in not_modelled.items()
            if pinned.get(flag) not in (None, False)]


def weights_source(model: ResolvedModel) -> str:
    """`measured` only for bytes read from the checkpoint itself here (a local index's total_size,
    the tensor headers, the Hub's metadata); a shipped profile's figure is `catalog` (written
    without Hub access, docs/profiles.md), and a size derived from config shapes `computed`."""
    text = model.weight_bytes_source
    if text.split(": ", 1)[-1].startswith("computed"):
        return COMPUTED
    return CATALOG if text.startswith("profile ") else MEASURED
