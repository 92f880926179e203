"""Rendering a plan: a human table with a budget bar, and a stable JSON document."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from launcher.plan import Plan
from launcher.units import GiB

PLAN_SCHEMA = "safe-serve.plan/1"

_BAR_ORDER = ("weights", "activations", "graphs", "other", "kv", "free")
_BAR_GLYPH = {"weights": "W", "activations": "A", "graphs": "G", "other": "o", "kv": "K", "free": "."}


def _gib(num: float) -> str:
    return f"{num / GiB:8.2f}"


def budget_bar(plan: Plan, width: int = 60) -> str:
    """One character per 1/width of the total: W weights, A activations, G graphs, o other, K KV, . free."""
    segments = {name: 0 for name in _BAR_ORDER}
    for item in plan.budget:
        if item.bar:
            segments[item.bar] += max(item.bytes, 0)
    total = sum(segments.values())
    if total <= 0:
        return ""
    cells = []
    for name in _BAR_ORDER:
        count = round(segments[name] / total * width)
        cells.append(_BAR_GLYPH[name] * count)
    bar = "".join(cells)[:width].ljust(width, ".")
    legend = "  ".join(f"{_BAR_GLYPH[n]} {n} {segments[n] / GiB:.2f}" for n in _BAR_ORDER if segments[n])
    return f"[{bar}]\n {legend} (GiB)"


def render_plan(plan: Plan, command: Sequence[str] | None = None) -> str:
    where = f"{plan.gpu_count} x {plan.gpu_name}" if plan.device == "cuda" else "CPU (host RAM)"
    lines = [
        f"safe-serve plan: {plan.model} on {where}, {plan.engine} {plan.engine_version}"
        f" (rules {plan.rules_version}), TP {plan.tp} x PP {plan.pp}",
        "",
        f"  {'item':34} {'GiB':>8}  {'source':14} why",
    ]
    for item in plan.budget:
        lines.append(f"  {item.label[:34]:34} {_gib(item.bytes)}  {item.source:14} {item.detail}")
    lines += ["", budget_bar(plan), ""]
    knob = (f"--gpu-memory-utilization {plan.gpu_memory_utilization:g}" if plan.gpu_memory_utilization is not None
            else f"--mem-fraction-static {plan.mem_fraction_static:g}" if plan.mem_fraction_static is not None
            else f"VLLM_CPU_KVCACHE_SPACE={plan.cpu_kvcache_space_gib}" if plan.cpu_kvcache_space_gib is not None
            else "")
    lines.append(f"  memory knob    {knob}")
    lines.append(f"  max length     {plan.max_model_len:,} ({plan.max_model_len_source})")
    lines.append(f"  KV cache       {plan.kv_cache_bytes / GiB:.2f} GiB = {plan.kv_cache_tokens:,} tokens"
                 + (f" ({plan.num_blocks:,} blocks of {plan.block_size})" if plan.num_blocks is not None else ""))
    lines.append(f"  concurrency    {plan.max_concurrency:.2f} requests of {plan.max_model_len:,} tokens")
    added = " ".join(shlex.quote(a) for a in plan.engine_args) or "(none: everything pinned)"
    env = " ".join(f"{k}={v}" for k, v in plan.engine_env.items())
    lines.append(f"  flags added    {added}" + (f"   env {env}" if env else ""))
    if plan.pinned:
        lines.append("  pinned (kept)  " + " ".join(f"{k} {v}" if v is not True else k for k, v in plan.pinned.items()))
    for note in plan.notes:
        lines.append(f"  note: {note}")
    if command:
        lines += ["", "  command: " + shlex.join(command)]
    return "\n".join(lines)


def plan_to_json(plan: Plan, command: Sequence[str] | None = None) -> dict[str, Any]:
    """The documented `safe-serve.plan/1` schema (README: JSON output)."""
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "engine": plan.engine,
        "engine_version": plan.engine_version,
        "rules_version": plan.rules_version,
        "device": plan.device,
        "model": plan.model,
        "gpu": {"name": plan.gpu_name, "count": plan.gpu_count},
        "tensor_parallel_size": plan.tp,
        "pipeline_parallel_size": plan.pp,
        "max_model_len": plan.max_model_len,
        "max_model_len_source": plan.max_model_len_source,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "mem_fraction_static": plan.mem_fraction_static,
        "cpu_kvcache_space_gib": plan.cpu_kvcache_space_gib,
        "kv_cache_bytes": plan.kv_cache_bytes,
        "kv_cache_tokens": plan.kv_cache_tokens,
        "max_concurrency": plan.max_concurrency,
        "block_size": plan.block_size,
        "num_blocks": plan.num_blocks,
        "budget": [
            {"key": i.key, "label": i.label, "bytes": i.bytes, "source": i.source, "detail": i.detail, "bar": i.bar}
            for i in plan.budget
        ],
        "engine_args": list(plan.engine_args),
        "engine_env": dict(plan.engine_env),
        "pinned": {k: v for k, v in plan.pinned.items()},
        "notes": list(plan.notes),
    }
    if command is not None:
        doc["command"] = list(command)
    return doc
