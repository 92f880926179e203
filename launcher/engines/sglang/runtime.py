"""Launching and watching SGLang: its command line, health port, retunes and measurements."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher.common.units import GiB
from launcher.engines.events import EngineEvent
from launcher.engines.flags import set_flag, split_engine_cmd
from launcher.engines.sglang.rules import FLAGS
from launcher.plan.types import Calibration, Plan

# "The memory capacity is unbalanced": another tenant on one rank; may pass later (exit 75).
TEMPORARY_FATAL = frozenset({"unbalanced"})


def engine_argv(plan: Plan, model_ref: str, passthrough: Sequence[str], engine_cmd: str | None) -> list[str]:
    base = split_engine_cmd(engine_cmd) if engine_cmd else [sys.executable, "-m", "sglang.launch_server"]
    return [*base, "--model-path", model_ref, *passthrough, *plan.engine_args]


def retuned_args(plan: Plan, args: Sequence[str], event: EngineEvent, *, concurrency: int) -> list[str] | None:
    values = event.values
    if event.kind == "kv" and values.get("tokens") is not None:
        # SGLang caps request length at the pool silently: make the cap explicit.
        length = int(values["tokens"]) // concurrency
        if length < (values.get("max_model_len") or plan.max_model_len):
            return set_flag(args, "--context-length", str(length), FLAGS)
    if event.kind == "fatal:weights_leave_nothing":
        return set_flag(args, "--mem-fraction-static", f"{min(values['minimum'] + 0.02, 0.99):.3f}", FLAGS)
    return None


def kv_shortfall(plan: Plan, event: EngineEvent, *, concurrency: int, tolerance: float) -> str | None:
    """SGLang's pool holds fewer than `concurrency` requests of its context, beyond the tolerance."""
    tokens, context = event.values.get("tokens"), event.values.get("max_model_len")
    if tokens is not None and context and tokens < context * concurrency * (1 - tolerance):
        return "SGLang pool smaller than the context length"
    return None


class SglangMeasurements:
    """What loading cost beyond the weights (pre-load free minus free after load, less the weights), and
    what the rank held before SGLang's baseline (the free memory the plan saw minus the pre-load free)."""

    def __init__(self, plan: Plan) -> None:
        self._weights = plan.item("weights")
        pre_load, context = plan.item("pre_load"), plan.item("context")
        self._free_at_plan = pre_load.bytes + context.bytes if pre_load and context else None
        self._pre_load_gib: float | None = None

    def feed(self, event: EngineEvent) -> Calibration | None:
        if event.kind == "pre_load":
            self._pre_load_gib = event.values["gib"]
            held = None if self._free_at_plan is None else self._free_at_plan - int(self._pre_load_gib * GiB)
            # Not a measurement where free memory grew since the plan (a tenant left).
            return Calibration(context_bytes=held) if held is not None and held > 0 else None
        if event.kind == "weights" and self._pre_load_gib is not None and self._weights is not None:
            used = int((self._pre_load_gib - event.values["avail_gib"]) * GiB)
            return Calibration(load_overhead_bytes=max(used - self._weights.bytes, 0))
        return None


def measurements_for(plan: Plan) -> SglangMeasurements:
    return SglangMeasurements(plan)
