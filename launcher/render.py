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


FIT_SCHEMA = "safe-serve.fit/1"


def _option_summary(option: Any) -> dict[str, Any]:
    plan = option.plan
    return {
        "gpu": option.gpu_name, "gpu_count": option.gpu_count, "kv_cache_dtype": option.kv_dtype,
        "checkpoint": option.checkpoint, "compromises": list(option.compromises),
        "engine_args": list(option.engine_args), "fits": option.fits, "shortfall": option.shortfall,
        "kv_cache_tokens": plan.kv_cache_tokens if plan else None,
        "kv_cache_bytes": plan.kv_cache_bytes if plan else None,
        "max_concurrency": plan.max_concurrency if plan else None,
        "memory_knob": (plan.gpu_memory_utilization if plan and plan.gpu_memory_utilization is not None
                        else plan.mem_fraction_static if plan else None),
    }


def fit_to_json(results: Sequence[Any], workload: Any, model: str, engine: str,
                inverse: tuple[int, int] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": FIT_SCHEMA, "model": model, "engine": engine,
        "workload": {"concurrency": workload.concurrency, "tokens": workload.tokens},
        "gpus": [{"gpu": r.gpu_name, "fits": r.best is not None,
                  "best": _option_summary(r.best) if r.best else None,
                  "single_gpu_miss": _option_summary(r.closest_miss) if r.closest_miss and r.best is not r.closest_miss
                  else None} for r in results],
    }
    if inverse is not None:
        doc["largest_concurrency_at_tokens"], doc["longest_tokens_at_concurrency"] = inverse
    return doc


def render_fit(results: Sequence[Any], workload: Any, model: str, engine: str,
               inverse: tuple[int, int] | None) -> str:
    lines = [f"safe-serve fit: {model} on {engine}, {workload.concurrency} requests x {workload.tokens:,} tokens",
             "", f"  {'GPU':34} {'needs':26} {'KV tokens':>11} {'headroom':>9}  flags / why not"]
    need = workload.concurrency * workload.tokens
    for result in results:
        option = result.best
        if option is not None and option.plan is not None:
            needs = f"{option.gpu_count} GPU" + ("s" if option.gpu_count > 1 else "")
            if option.compromises:
                needs += " + " + ", ".join("fp8 KV" if c == "fp8 KV cache" else "quantized" for c in option.compromises)
            headroom = f"{option.plan.max_concurrency / workload.concurrency - 1:+.0%}"
            flags = " ".join(a for a in option.engine_args)
            if option.quantized:
                flags = f"model {option.checkpoint}: {flags}"
            lines.append(f"  {result.gpu_name[:34]:34} {needs:26} {option.plan.kv_cache_tokens:>11,} {headroom:>9}  "
                         f"{flags}")
        else:
            miss = result.closest_miss
            lines.append(f"  {result.gpu_name[:34]:34} {'no fit up to 8':26} {'-':>11} {'-':>9}  "
                         f"{miss.shortfall if miss else ''}")
        if option is not None and result.closest_miss is not None and result.closest_miss is not option \
                and result.closest_miss.gpu_count == 1 and result.closest_miss.kv_dtype == "auto":
            lines.append(f"  {'':34} {'1 GPU, bf16':26} {'':>11} {'':>9}  short: {result.closest_miss.shortfall}")
    lines.append(f"\n  workload: {need:,} KV tokens at once; headroom = extra requests the KV cache would hold")
    if inverse is not None:
        lines.append(f"  on one of these GPUs as configured (no fp8, original checkpoint): at most {inverse[0]} requests of {workload.tokens:,} tokens; "
                     f"{workload.concurrency} requests of at most {inverse[1]:,} tokens each")
    return "\n".join(lines)
