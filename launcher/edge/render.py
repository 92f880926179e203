"""Rendering a plan: a human table with a budget bar, and a stable JSON document.

Every line the table prints comes from the same figures as the JSON: `plan_facts` gathers
what the header says (GPUs used of those given, NVML and CUDA totals, whether the engine
version is assumed) once, and both `render_plan` and `plan_to_json` read it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.shown import printable
from launcher.common.units import format_gib
from launcher.engines import adapter, figure_keys
from launcher.model.gpu import GpuDevice
from launcher.plan.types import Plan

PLAN_SCHEMA = "safe-serve.plan/1"

_BAR_ORDER = ("weights", "activations", "graphs", "other", "kv", "free")
_BAR_GLYPH = {"weights": "W", "activations": "A", "graphs": "G", "other": "o", "kv": "K", "free": "."}



@dataclass(frozen=True)
class PlanFacts:
    """What the header and the totals rows say, derived once for the table and the JSON."""

    used: tuple[str, ...]  # names of the devices the ranks run on, CUDA order
    given: tuple[str, ...] | None  # names of all devices offered (--gpu or visible); None: unknown
    unused_reason: str | None
    nvml_total_bytes: int | None  # of the rank that sets the budget (the tightest)
    cuda_total_bytes: int | None
    total_source: str | None  # "measured" (NVML), "catalog", or "pinned" (a bare --gpu size)
    engine_version_assumed: bool
    total_why: str | None = None  # a catalog CUDA total that spans setups (ECC state unknown)

    @property
    def unused(self) -> int:
        return 0 if self.given is None else len(self.given) - len(self.used)


def _tightest(devices: Sequence[GpuDevice], name: str | None) -> GpuDevice | None:
    """The rank with the least free memory (as the planner picks it), preferring the plan's GPU name."""
    named = [d for d in devices if d.name == name] or list(devices)
    return min(named, key=lambda d: (d.free_bytes or 0, d.usable_total_bytes)) if named else None


def plan_facts(plan: Plan, given: Sequence[GpuDevice] | None = None) -> PlanFacts:
    """`given`: the devices the request offered (request.gpus); the ranks use the first gpu_count."""
    assumed = bool(getattr(plan, "engine_version_assumed", False))
    if plan.device != "cuda":
        return PlanFacts((), None, None, None, None, None, assumed)
    if not given:
        return PlanFacts((plan.gpu_name or "?",) * plan.gpu_count, None, None, None, None, None, assumed)
    used = tuple(given[:plan.gpu_count])
    reason = None
    if len(given) > len(used):
        tp_flag = adapter(plan.engine).tp_flag
        reason = (f"no {tp_flag}" if plan.tp * plan.pp == 1 else
                  f"TP {plan.tp} x PP {plan.pp} uses {len(used)}")
    tight = _tightest(used, plan.gpu_name)
    nvml = tight.total_bytes if tight is not None and tight.total_bytes else None
    cuda = tight.usable_total_bytes if tight is not None else None
    source = (None if tight is None else "pinned" if tight.size_given else
              "catalog" if tight.source == "catalog" else "measured")
    return PlanFacts(tuple(d.name for d in used), tuple(d.name for d in given), reason, nvml, cuda, source, assumed,
                     tight.cuda_total_why if tight is not None else None)


def where_text(plan: Plan, facts: PlanFacts) -> str:
    """`1 of 2 x NVIDIA A100-SXM4-80GB (1 unused: no --tensor-parallel-size)`, or the mixed set named."""
    if plan.device != "cuda":
        return "CPU (host RAM)"
    names = list(dict.fromkeys(facts.used))  # distinct, in order
    count = len(facts.used)
    if len(names) <= 1:
        name = names[0] if names else (plan.gpu_name or "?")
        same = facts.given is not None and facts.unused and set(facts.given) == {name}
        of = f" of {len(facts.given or ())}" if same else ""
        text = f"{count}{of} x {name}"
    else:
        parts = [f"{facts.used.count(n)} x {n}" for n in names]
        text = f"{count} GPUs ({' + '.join(parts)}; the tightest, {plan.gpu_name}, sizes every rank)"
    if facts.unused and facts.given is not None:
        spare = list(dict.fromkeys(facts.given[count:]))
        what = "" if len(names) <= 1 and spare == names else " " + " + ".join(spare)
        text += f" ({facts.unused} unused{what}: {facts.unused_reason})"
    return text


def version_text(plan: Plan, facts: PlanFacts) -> str:
    return f"{plan.engine} {plan.engine_version}" + (" (assumed: not installed)" if facts.engine_version_assumed
                                                     else "")


def _total_rows(plan: Plan, facts: PlanFacts) -> list[str]:
    """The other of the two totals, right under the table's total, with the difference between them."""
    total = plan.item("total")
    if total is None or facts.nvml_total_bytes is None or facts.cuda_total_bytes is None:
        return []
    gap = facts.nvml_total_bytes - facts.cuda_total_bytes
    if gap == 0:
        return []
    source = facts.total_source or total.source
    if "(NVML)" in total.label:
        cuda = format_gib(facts.cuda_total_bytes, width=8, unit=False)
        if facts.total_why:  # the middle of a span, not this NVML total less a reserve
            return [f"  {'CUDA total (what the engine gets)':34} {cuda}  {source:14} "
                    "the middle of ECC on (in-band ECC) to ECC off; the rows below count from it"]
        return [f"  {'CUDA total (what the engine gets)':34} {cuda}  {source:14} "
                f"NVML total - {format_gib(gap)} the driver keeps back; the rows below count from it"]
    nvml = format_gib(facts.nvml_total_bytes, width=8, unit=False)
    if facts.total_why:  # the CUDA total is the middle of a span, not this card's total less a reserve
        return [f"  {'NVML total (nvidia-smi)':34} {nvml}  {source:14} "
                f"with ECC on (in-band ECC); more with ECC off: the CUDA total above spans both"]
    return [f"  {'NVML total (nvidia-smi)':34} {nvml}  {source:14} "
            f"CUDA total + {format_gib(gap)} the driver keeps back, never usable"]


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
    legend = "  ".join(f"{_BAR_GLYPH[n]} {n} {format_gib(segments[n], unit=False)}" for n in _BAR_ORDER if segments[n])
    return f"[{bar}]\n {legend} (GiB)"


def render_plan(plan: Plan, command: Sequence[str] | None = None, *,
                given: Sequence[GpuDevice] | None = None) -> str:
    facts = plan_facts(plan, given)
    lines = [
        f"safe-serve plan: {plan.model} on {where_text(plan, facts)}, {version_text(plan, facts)}"
        f" (rules {plan.rules_version}), TP {plan.tp} x PP {plan.pp}",
        "",
        f"  {'item':34} {'GiB':>8}  {'source':14} why",
    ]
    for item in plan.budget:
        column = format_gib(item.bytes, width=8, unit=False)
        lines.append(f"  {item.label[:34]:34} {column}  {item.source:14} {item.detail}")
        if item.key == "total":
            lines += _total_rows(plan, facts)
    lines += ["", *budget_bar(plan).split("\n"), ""]
    lines.append(f"  memory knob    {plan.memory_knob}")
    lines.append(f"  max length     {plan.max_model_len:,} ({plan.max_model_len_source})")
    lines.append(f"  KV cache       {format_gib(plan.kv_cache_bytes)} = {plan.kv_cache_tokens:,} tokens"
                 + (f" ({plan.num_blocks:,} blocks of {plan.block_size})" if plan.num_blocks is not None else ""))
    low, high = plan.kv_cache_bytes_low, plan.kv_cache_bytes_high
    if low is not None and high is not None and high != low:
        lines.append(f"  KV band        {format_gib(low, unit=False)} .. {format_gib(high)}"
                     " (the estimates' expected errors)")
    lines.extend(_length_band_lines(plan))
    lines.extend(_risk_lines(plan))
    requests = "request" if plan.max_concurrency == 1 else "requests"
    lines.append(f"  concurrency    {plan.max_concurrency:.2f} {requests} of {plan.max_model_len:,} tokens")
    added = " ".join(shlex.quote(a) for a in plan.engine_args) or "(none: everything pinned)"
    env = " ".join(f"{k}={v}" for k, v in plan.engine_env.items())
    lines.append(f"  flags added    {added}" + (f"   env {env}" if env else ""))
    if plan.pinned:
        written = adapter(plan.engine).pinned_as_written
        lines.append("  pinned (kept)  " + " ".join(written(k, v) for k, v in plan.pinned.items()))
    if facts.engine_version_assumed:
        lines.append(f"  note: {plan.engine} is not installed here: planned for {plan.engine_version}, the newest "
                     "version safe-serve knows (--engine-version X.Y.Z plans for another)")
    for warning in plan.warnings:
        lines.append(f"  warning: {warning}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    if command:
        lines += ["", "  command: " + shlex.join(command)]
    return "\n".join(printable(line) for line in lines)  # one element, one line: names cannot forge lines


def plan_to_json(plan: Plan, command: Sequence[str] | None = None, *,
                 given: Sequence[GpuDevice] | None = None) -> dict[str, Any]:
    """The documented `safe-serve.plan/1` schema (README: JSON output)."""
    facts = plan_facts(plan, given)
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "engine": plan.engine,
        "engine_version": plan.engine_version,
        "engine_version_assumed": facts.engine_version_assumed,
        "rules_version": plan.rules_version,
        "device": plan.device,
        "model": plan.model,
        "gpu": {"name": plan.gpu_name, "count": plan.gpu_count, "used": list(facts.used),
                "given": None if facts.given is None else list(facts.given), "unused": facts.unused,
                "unused_reason": facts.unused_reason, "nvml_total_bytes": facts.nvml_total_bytes,
                "cuda_total_bytes": facts.cuda_total_bytes, "cuda_total_spans": facts.total_why},
        "tensor_parallel_size": plan.tp,
        "pipeline_parallel_size": plan.pp,
        "max_model_len": plan.max_model_len,
        "max_model_len_source": plan.max_model_len_source,
        **{key: plan.engine_figures.get(key) for key in figure_keys()},  # each engine's knob, by its own name
        "kv_cache_bytes": plan.kv_cache_bytes,
        "kv_cache_tokens": plan.kv_cache_tokens,
        "kv_cache_bytes_low": plan.kv_cache_bytes_low if plan.kv_cache_bytes_low is not None else plan.kv_cache_bytes,
        "kv_cache_bytes_high": plan.kv_cache_bytes_high if plan.kv_cache_bytes_high is not None
        else plan.kv_cache_bytes,
        "max_model_len_low_end": plan.max_model_len_low_end,
        "max_model_len_central": plan.max_model_len_central,
        "fits": plan.may_not_fit is None,  # a plain yes; otherwise the risk and its reason say why not
        "risk": "may-not-fit" if plan.may_not_fit else "none",
        "may_not_fit": plan.may_not_fit,
        "at_risk": list(plan.at_risk),
        "alternatives": [a.to_json() for a in plan.alternatives],
        "engine_defaults": dict(plan.engine_defaults),
        "warnings": list(plan.warnings),
        "memory_knob": plan.memory_knob,
        "architecture_verified": plan.architecture_verified,
        "kv_sized_after_warmup": plan.kv_sized_after_warmup,
        "max_concurrency": plan.max_concurrency,
        "block_size": plan.block_size,
        "num_blocks": plan.num_blocks,
        "budget": [
            {"key": i.key, "label": i.label, "bytes": i.bytes, "source": i.source, "detail": i.detail, "bar": i.bar,
             "error_bytes": i.error_bytes}
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
_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _option_summary(option: Any) -> dict[str, Any]:
    plan = option.plan
    return {
        "gpu": option.gpu_name, "gpu_count": option.gpu_count, "kv_cache_dtype": option.kv_dtype,
        "checkpoint": option.checkpoint, "compromises": list(option.compromises),
        "engine_args": list(option.engine_args), "fits": option.fits, "shortfall": option.shortfall,
        "kv_cache_tokens": plan.kv_cache_tokens if plan else None,
        "kv_cache_bytes": plan.kv_cache_bytes if plan else None,
        "max_concurrency": plan.max_concurrency if plan else None,
        "memory_knob": plan.knob.value if plan and plan.knob.unit == "fraction" else None,
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
    from launcher.plan.fit import grouped_misses

    doc["reasons"] = [{"shortfall": why, "gpus": gpus} for why, gpus in grouped_misses(results)]
    if inverse is not None:
        doc["largest_concurrency_at_tokens"], doc["longest_tokens_at_concurrency"] = inverse
    return doc


def compute_dtype(option: Any, geometry: Any = None) -> str | None:
    """The dtype a fit option runs in: its own field when fit records it, else vLLM's rule for its GPU.

    T4 and V100 (compute capability < 8.0) have no bf16: a bf16 checkpoint runs fp16 there.
    None when neither is known (the row then names no dtype rather than guess one).
    """
    dtype = getattr(option, "dtype", None)
    if dtype is None and geometry is not None:
        from launcher.engines.dtypes import resolve_dtype  # vLLM's _resolve_auto_dtype, shared by both planners
        from launcher.model.catalog import find

        gpu = find(option.gpu_name)
        dtype, _ = resolve_dtype(geometry, compute_capability=gpu.compute_capability if gpu else None,
                                 device="cuda", pinned=None)
    return None if dtype is None else _DTYPE_SHORT.get(dtype, dtype)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def inverse_text(gpu_name: str, workload: Any, inverse: tuple[int, int]) -> str:
    """The inverse answers on the one GPU type asked for, in words that stay true at 0."""
    most, longest = inverse
    by_count = (f"not one request of {workload.tokens:,} tokens fits" if most == 0 else
                f"at most {_plural(most, 'request')} of {workload.tokens:,} tokens at once")
    by_length = (f"{_plural(workload.concurrency, 'request')} at once fit at no length" if longest == 0 else
                 f"{_plural(workload.concurrency, 'request')} of at most {longest:,} tokens each")
    return f"  on 1 x {gpu_name} as given (original checkpoint, KV cache in the model's dtype): {by_count}; {by_length}"


def _fit_row(result: Any, workload: Any, shared: Sequence[str]) -> str:
    """One GPU type's row: what carries the workload, or why not (a shared reason by its number)."""
    option = result.best
    if option is None or option.plan is None:
        miss = result.closest_miss
        why = miss.shortfall if miss and miss.shortfall else ""
        if why in shared:
            why = f"reason {list(shared).index(why) + 1} below"
        return f"  {result.gpu_name[:34]:34} {'no fit up to 8 GPUs':26} {'-':>11} {'-':>9}  {why}"
    needs = _plural(option.gpu_count, "GPU")
    if option.compromises:
        short = {"fp8 KV cache": "fp8 KV", "fp8 weights (quantized while loading)": "fp8 weights"}
        needs += " + " + ", ".join(short.get(c, "quantized") for c in option.compromises)
    headroom = f"{option.plan.max_concurrency / workload.concurrency - 1:+.0%}"
    flags = " ".join(a for a in option.engine_args)
    if option.quantized:
        flags = f"model {option.checkpoint}: {flags}"
    return f"  {result.gpu_name[:34]:34} {needs:26} {option.plan.kv_cache_tokens:>11,} {headroom:>9}  {flags}"


def _shared_reasons(results: Sequence[Any]) -> list[tuple[str, int]]:
    """Reasons several GPU types miss for, each once with how many (fit --tokens 99999999: one, 27)."""
    from launcher.plan.fit import grouped_misses

    return [(why, len(gpus)) for why, gpus in grouped_misses(results) if len(gpus) > 1]


def _length_band_lines(plan: Plan) -> list[str]:
    """The lengths that hold at the KV band's low end and at its centre, where they differ."""
    low, central = plan.max_model_len_low_end, plan.max_model_len_central
    if low is None or central is None or low == central:
        return []
    return [f"  length band    {low:,} holds at the KV band's low end"
            + ("" if low else " (none)") + f", {central:,} at the central estimate"
            + (" (the length added is the low end's)" if plan.max_model_len == low and low < central else "")]


def _risk_lines(plan: Plan) -> list[str]:
    """MAY NOT FIT and the planned alternatives (without the risk, or over every GPU given)."""
    at_risk = f"[at risk: {', '.join(plan.at_risk)}] " if plan.at_risk else ""
    lines = [f"  MAY NOT FIT    {at_risk}{plan.may_not_fit}"] if plan.may_not_fit else []
    label = "would fit:" if plan.may_not_fit else "or:"
    return lines + [f"  {label:14} {alternative}" for alternative in plan.alternatives]


def render_fit(results: Sequence[Any], workload: Any, model: str, engine: str,
               inverse: tuple[int, int] | None, *, geometry: Any = None) -> str:
    lines = [f"safe-serve fit: {printable(model)} on {engine}, {_plural(workload.concurrency, 'request')} x "
             f"{workload.tokens:,} tokens",
             "", f"  {'GPU':34} {'needs':26} {'KV tokens':>11} {'headroom':>9}  flags / why not"]
    need = workload.concurrency * workload.tokens
    shared = _shared_reasons(results)
    for result in results:
        option = result.best
        lines.append(_fit_row(result, workload, [why for why, _ in shared]))
        miss = result.closest_miss
        if option is not None and miss is not None and miss is not option \
                and miss.gpu_count == 1 and miss.kv_dtype == "auto":
            dtype = compute_dtype(miss, geometry)
            label = f"1 GPU, {dtype}, as is" if dtype else "1 GPU, as is"
            lines.append(f"  {'':34} {label:26} {'':>11} {'':>9}  short: {miss.shortfall}")
    for number, (why, count) in enumerate(shared, 1):
        lines.append(f"\n  reason {number} ({_plural(count, 'GPU type')}): {why}")
    lines.append(f"\n  workload: {need:,} KV tokens at once; headroom: how many more requests of "
                 f"{workload.tokens:,} tokens the KV cache holds, as a share of the {workload.concurrency} asked for")
    if inverse is not None and results:
        lines.append(inverse_text(results[0].gpu_name, workload, inverse))
    return "\n".join(lines)
