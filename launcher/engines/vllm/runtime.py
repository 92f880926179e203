"""Launching and watching vLLM: its command line, health port, retunes and measurements."""

from __future__ import annotations

import math
from collections.abc import Sequence

from launcher.common.units import GiB
from launcher.engines.events import EngineEvent
from launcher.engines.flags import set_flag, split_engine_cmd
from launcher.engines.vllm.rules import FLAGS
from launcher.plan.types import Calibration, Plan

# Other processes hold the memory: the same command may work later (exit 75, not 78). Under 0.34's
# extensible KV cache an out-of-memory while committing its pages is the same case: it sized the cache
# from the memory free after warmup, which a tenant then took (there is no startup refusal to say so).
TEMPORARY_FATAL = frozenset({"startup_free", "cpu_node_memory", "kv_commit_oom"})
RETUNE_MARGIN_GIB = 0.25  # kept free below what vLLM reported free when it refused to start


def engine_argv(plan: Plan, model_ref: str, passthrough: Sequence[str], engine_cmd: str | None) -> list[str]:
    """`vllm serve MODEL ...`; the OpenAI api_server module takes `--model MODEL` instead."""
    base = split_engine_cmd(engine_cmd) if engine_cmd else ["vllm", "serve"]
    model_args = ["--model", model_ref] if any("api_server" in part for part in base) else [model_ref]
    return [*base, *model_args, *passthrough, *plan.engine_args]


def retuned_args(plan: Plan, args: Sequence[str], event: EngineEvent, *, concurrency: int) -> list[str] | None:
    """Flags recomputed from vLLM's own numbers, or None when they don't say what would work."""
    values = event.values
    block = plan.block_size or 16
    if event.kind in ("fatal:kv_too_small", "fatal:kv_too_small_v0") and values.get("estimated_max_model_len"):
        # vLLM's estimate holds one request; share it out and keep whole blocks.
        length = int(values["estimated_max_model_len"]) // concurrency
        length = length // block * block if length >= block else length
        return set_flag(args, "--max-model-len", str(length), FLAGS) if length > 0 else None
    if event.kind == "fatal:startup_free":
        utilization = math.floor((values["free_gib"] - RETUNE_MARGIN_GIB) / values["total_gib"] * 10_000) / 10_000
        return set_flag(args, "--gpu-memory-utilization", f"{utilization:g}", FLAGS) if utilization > 0 else None
    if event.kind == "kv" and values.get("concurrency") is not None and values["concurrency"] < concurrency:
        length = int(values["tokens"] / concurrency) // block * block
        return set_flag(args, "--max-model-len", str(length), FLAGS) if length > 0 else None
    return None


def kv_shortfall(plan: Plan, event: EngineEvent, *, concurrency: int, tolerance: float) -> str | None:
    """vLLM reports its own concurrency: the divergence check on tokens covers it."""
    return None


class VllmMeasurements:
    """vLLM prints the KV memory it found: everything else it subtracted is the non-KV figure.

    Not under 0.34's extensible KV cache (`Plan.kv_sized_after_warmup`): "Available KV cache memory" is then
    only the estimate its address range is reserved for, and the cache itself follows the free memory at
    each start (min(requested, free - margin) - ...), which one start's figure does not carry over to the
    next; vLLM measures it again after warmup."""

    def __init__(self, plan: Plan) -> None:
        self._requested = None if plan.kv_sized_after_warmup else plan.item("requested")

    def feed(self, event: EngineEvent) -> Calibration | None:
        if event.kind == "available_kv" and self._requested is not None:
            return Calibration(non_kv_bytes=self._requested.bytes - int(event.values["gib"] * GiB))
        return None


def measurements_for(plan: Plan) -> VllmMeasurements:
    return VllmMeasurements(plan)
