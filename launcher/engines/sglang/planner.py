"""SGLang's planner: from a `PlanRequest` to `--mem-fraction-static`, `--context-length` and the pool.

SGLang sizes its pool from the free memory it saw before loading (P) and after (A):
`pool = A - P x (1 - fraction)`, in cells of `cell_size_bytes` per token, floored to the page
(`mem_cache/kv_cache_configurator.py`); the default fraction is SGLang's own reserve formula
(`default_fraction`, checked against SGLang's code in tests/data/sglang_oracle.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import SafeServeError, UsageError, WontFit
from launcher.common.units import MiB, floor_to, format_gib
from launcher.engines.checks_common import CheckInput
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.layers import request_with_cached_layers
from launcher.engines.sglang import architectures as sa
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import kv as sk
from launcher.engines.sglang import rules as sr
from launcher.engines.sglang.checks import start_checks
from launcher.model.config import refuse_unsupported
from launcher.model.gpu import GpuDevice
from launcher.plan.budget import (
    not_modelled_warnings,
    rank_devices,
    tenants_detail,
    tightest,
    unplanned,
    weights_source,
)
from launcher.plan.types import (
    CALIBRATED,
    CATALOG,
    ENGINE_DEFAULT,
    FORMULA,
    MEASURED,
    PINNED,
    BudgetItem,
    MemoryKnob,
    Plan,
    PlanRequest,
)


@dataclass(frozen=True)
class _SglangSetup:
    """What the plan depends on before the fraction: rules, ranks, the card, the cell and the page."""

    rules: sr.SglangRules
    rules_note: str | None
    pinned: Mapping[str, Any]
    tp: int
    pp: int
    devices: tuple[GpuDevice, ...]
    gpu: GpuDevice  # the tightest rank
    gpu_mem_mib: float  # what SGLang's tier heuristic reads
    derivation: sb.FractionDerivation  # SGLang's own default fraction
    derived_len: int
    derived_reason: str
    cell: float  # bytes per token in the pool
    page: int
    notes: tuple[str, ...]  # rules, dtype, KV dtype and page reasons


@dataclass(frozen=True)
class SglangBudget:
    """SGLang's budget on the tightest rank (bytes): `pool = A - P x (1 - fraction)`; each figure is a row."""

    total: int  # NVML total
    context: int  # CUDA context (+NCCL), before the pre-load baseline
    pre_load: int  # P: free at the baseline, min over ranks
    weights: int  # per rank
    load_overhead: int  # allocated between the baseline and pool sizing besides the weights
    after_load: int  # A
    fraction: float
    slack: int  # P x (1 - fraction): activations, graphs and the request table live here


@dataclass(frozen=True)
class _Fraction:
    value: float
    source: str
    detail: str


def _sglang_setup(request: PlanRequest) -> _SglangSetup:
    """Rules, ranks, devices, SGLang's own refusals first, then cell and page."""
    geometry = request.model.geometry
    rules, rules_note = sr.rules_for(request.engine_version)
    pinned = request.pinned.values
    tp, pp = sr.ranks(pinned)
    devices = rank_devices(request, tp * pp, pinned.get("--nnodes", 1), tp_flag=sr.TP_FLAG)
    gpu = tightest(devices)
    # SGLang's tier heuristic reads nvidia-smi's memory.total: the smallest card listed.
    gpu_mem_mib = min(d.total_bytes for d in (request.gpus or devices)) / MiB
    derivation = sb.default_fraction(geometry, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, pinned=pinned, rules=rules)
    dtype, dtype_reason = resolve_dtype(geometry, compute_capability=gpu.compute_capability, device="cuda",
                                        pinned=pinned.get("--dtype"))
    derived_len, derived_reason = sr.derived_context_length(geometry)
    _refuse_what_sglang_refuses(request, pinned, gpu, tp, pp, dtype, derived_len)
    try:  # after the engine's own checks: what it refuses is its refusal, not our sizing gap
        kv_elem, kv_reason = sk.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype, geometry)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cell = sk.cell_size_bytes(geometry, kv_bytes=kv_elem, tp=tp, pp=pp, pinned=pinned)
    page, page_reason = sk.default_page_size(geometry, gpu.compute_capability)
    if "--page-size" in pinned:
        page, page_reason = pinned["--page-size"], "pinned --page-size"
    notes = tuple(n for n in (rules_note, dtype_reason, kv_reason, page_reason) if n)
    return _SglangSetup(rules, rules_note, pinned, tp, pp, devices, gpu, gpu_mem_mib, derivation, derived_len,
                        derived_reason, cell, page, notes)


def _refuse_what_sglang_refuses(request: PlanRequest, pinned: Mapping[str, Any], gpu: GpuDevice, tp: int, pp: int,
                                dtype: str, derived_len: int) -> None:
    """The first start-time rule SGLang would stop on, as a refusal (exit 78) before any budget."""
    refusals = start_checks(CheckInput(
        geometry=request.model.geometry, device="cuda", compute_capability=gpu.compute_capability,
        gpu_count=len(request.gpus), tp=tp, pp=pp, dtype=dtype, kv_cache_dtype=pinned.get("--kv-cache-dtype"),
        block_size=pinned.get("--page-size"), max_model_len=pinned.get("--context-length"),
        model_max_len=derived_len, engine_version=request.engine_version, gpu_name=gpu.name,
        allow_long_max_model_len=request.allow_long_max_model_len, quantization=pinned.get("--quantization"),
        pinned_dtype=pinned.get("--dtype")))
    if refusals:
        first = refusals[0]
        raise WontFit(f"SGLang refuses this at start: {' '.join(first.message.split())} [{first.source}]",
                      hint=first.hint, rule=first.rule, source=first.source)


def _baseline(request: PlanRequest, setup: _SglangSetup) -> tuple[int, int, int, int, int]:
    """(context, P, weights, loader leftovers, A): the free memory SGLang sees before and after loading."""
    context = sb.CUDA_CONTEXT_BYTES + (sb.NCCL_BYTES if setup.tp * setup.pp > 1 else 0)
    pre_load = min(d.free_bytes or 0 for d in setup.devices) - context  # P: min over ranks
    cal = request.calibration
    load_overhead = cal.load_overhead_bytes if cal and cal.load_overhead_bytes is not None else sb.LOAD_OVERHEAD_BYTES
    weights = request.model.weight_bytes // (setup.tp * setup.pp)
    after_load = pre_load - weights - load_overhead  # A
    if request.model.geometry.is_multimodal and not setup.pinned.get("--language-only", False):
        after_load -= sb.MULTIMODAL_RESERVE_BYTES
    return context, pre_load, weights, load_overhead, after_load


def _fraction(request: PlanRequest, setup: _SglangSetup, context: int, pre_load: int) -> _Fraction:
    """Pinned, or keep SGLang's absolute slack (its own reserve) against *free* memory, so other
    tenants don't shrink the room for activations and graphs."""
    if "--mem-fraction-static" in setup.pinned:
        return _Fraction(setup.pinned["--mem-fraction-static"], PINNED, "pinned --mem-fraction-static")
    gpu, derivation, cal = setup.gpu, setup.derivation, request.calibration
    # The slack SGLang's default leaves on this card when idle, kept in bytes. On an idle
    # card that is the default itself: its slack already holds activations and graphs, and
    # there is no tenant to keep a margin for. Other tenants add the margin for their drift.
    idle_pre_load = gpu.usable_total_bytes - context
    tenants = gpu.usable_total_bytes - (gpu.free_bytes or 0) > 0
    slack_needed = idle_pre_load * (1 - derivation.fraction) + (request.margin_bytes if tenants else 0)
    # A CUDA OOM while serving on this setup: keep that much more slack (launcher.plan.calibration).
    slack_needed += cal.extra_headroom_bytes if cal else 0
    room = pre_load
    if request.max_gpu_memory_bytes is not None:
        room = min(room, request.max_gpu_memory_bytes - context)
    from_free = floor_to(1 - (slack_needed + (pre_load - room)) / pre_load, 3) if pre_load > 0 else 0.0
    value = min(derivation.fraction, from_free)
    if value == derivation.fraction:
        return _Fraction(value, ENGINE_DEFAULT, f"SGLang {setup.rules.version} default: reserve "
                                                f"{derivation.reserved_mib:.0f} MiB of {setup.gpu_mem_mib:.0f} MiB")
    return _Fraction(value, FORMULA,
                     f"keeps the {format_gib(idle_pre_load * (1 - derivation.fraction))} slack SGLang's default "
                     f"{derivation.fraction:g} leaves on an idle card"
                     + (" + margin for other tenants" if tenants else "") + f", out of {format_gib(pre_load)} free")


def _pool(request: PlanRequest, setup: _SglangSetup, budget: SglangBudget) -> tuple[int, int, int]:
    """(tokens, tokens at the favourable end of the band, budget bytes) of the pool."""
    max_total = setup.pinned.get("--max-total-tokens")
    tokens, pool_bytes = sb.pool_tokens(pre_load_bytes=budget.pre_load, after_load_bytes=budget.after_load,
                                        fraction_value=budget.fraction, cell_bytes=setup.cell, page_size=setup.page,
                                        max_total_tokens=max_total)
    # The favourable end of the error band: our CUDA-context and loader estimates too high, and on a
    # catalog card (free = its CUDA total) the spread of the totals published for it.
    cal, gpu = request.calibration, setup.gpu
    context_error = sb.CONTEXT_ERROR_BYTES + (gpu.usable_total_error_bytes if gpu.source == "catalog" else 0)
    overhead_error = 0 if cal and cal.load_overhead_bytes is not None else sb.LOAD_OVERHEAD_ERROR_BYTES
    tokens_high, _ = sb.pool_tokens(pre_load_bytes=budget.pre_load + context_error,
                                    after_load_bytes=budget.after_load + context_error + overhead_error,
                                    fraction_value=budget.fraction, cell_bytes=setup.cell, page_size=setup.page,
                                    max_total_tokens=max_total)
    return tokens, tokens_high, pool_bytes


def _planned_tokens(budget: SglangBudget, tokens: int, tokens_high: int) -> tuple[int, str | None]:
    """The tokens the length is planned on: the central pool, or the favourable one when only it holds any."""
    if tokens > 0:
        return tokens, None
    minimum = 1 - budget.after_load / budget.pre_load if budget.pre_load > 0 else 1.0
    if tokens_high <= 0:
        hint = ("raise --mem-fraction-static, quantize, or use tensor parallel" if minimum < 0.99 else
                "no --mem-fraction-static can fit: the weights alone need more than the free memory; "
                "quantize or use tensor parallel")
        raise WontFit(f"SGLang will fail: the weights leave no KV pool under --mem-fraction-static "
                      f"{budget.fraction:g} (minimum viable {minimum:.4f})", hint=hint)
    doubt = (f"the weights leave a KV pool under --mem-fraction-static {budget.fraction:g} only at the favourable "
             f"end of the estimate (minimum viable {minimum:.4f} at the central estimate)")
    return tokens_high, doubt  # plan the length on what may be there; the band keeps the central 0


def _sglang_length(request: PlanRequest, setup: _SglangSetup, tokens: int, tokens_high: int,
                   doubt: str | None) -> tuple[int, str, str | None]:
    """A pinned --context-length checked against the pool, or the longest that fits `concurrency`."""
    pinned_len = setup.pinned.get("--context-length")
    concurrency = request.concurrency
    if pinned_len is not None:
        if tokens < concurrency * pinned_len and tokens_high >= concurrency * pinned_len:
            doubt = (f"the pool holds ~{tokens} tokens at the central estimate ({tokens_high} at best): "
                     f"{concurrency} request(s) of {pinned_len} may not fit")
        elif tokens < concurrency * pinned_len:
            raise WontFit(f"the pool holds {tokens} tokens: {concurrency} request(s) of {pinned_len} do not fit; "
                          "SGLang would cap requests at the pool size silently")
        return pinned_len, "pinned --context-length", doubt
    length = min(setup.derived_len, tokens // concurrency // setup.page * setup.page)
    reason = (f"model maximum ({setup.derived_reason})" if length == setup.derived_len
              else f"longest that fits {concurrency} request(s) in the pool (SGLang would cap "
                   f"silently at {tokens} tokens)")
    if length <= 0:
        raise WontFit(f"the pool holds only {tokens} tokens: not one per request for {concurrency}")
    return length, reason, doubt


def plan(request: PlanRequest) -> Plan:
    """Setup, baseline, fraction, pool, length, then the table."""
    request = request_with_cached_layers(request, sa.LAYER_PATTERNS)
    if request.device == "cpu":
        raise UsageError("SGLang on CPU is not planned yet: use --engine vllm --device cpu")
    refuse_unsupported(request.model.geometry)  # SGLang's state pools are not sized yet; --trust-engine lets it decide
    setup = _sglang_setup(request)
    context, pre_load, weights, load_overhead, after_load = _baseline(request, setup)
    fraction = _fraction(request, setup, context, pre_load)
    budget = SglangBudget(total=setup.gpu.total_bytes, context=context, pre_load=pre_load, weights=weights,
                          load_overhead=load_overhead, after_load=after_load, fraction=fraction.value,
                          slack=int(pre_load * (1 - fraction.value)))
    tokens_central, tokens_high, pool_bytes = _pool(request, setup, budget)
    tokens, doubt = _planned_tokens(budget, tokens_central, tokens_high)
    length, length_reason, doubt = _sglang_length(request, setup, tokens, tokens_high, doubt)
    kv = int(tokens * setup.cell)
    verified, architecture_note = sa.architecture_status(request.model.geometry)
    unverified_error = 0 if verified else int(kv * sa.UNVERIFIED_KV_ERROR_FRACTION)
    derivation, pinned, cell = setup.derivation, setup.pinned, setup.cell
    return Plan(
        engine="sglang", engine_version=request.engine_version or sr.NEWEST, rules_version=setup.rules.version,
        device="cuda", model=request.model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=tokens, max_concurrency=round(tokens / length, 2) if length else 0.0,
        budget=_sglang_items(request, setup, budget, fraction, tokens, length, kv, pool_bytes),
        engine_args=tuple(_sglang_args(pinned, fraction.value, length)), engine_env={}, pinned=dict(pinned),
        tp=setup.tp, pp=setup.pp,
        knob=MemoryKnob("--mem-fraction-static", fraction.value, "fraction",
                        f"--mem-fraction-static {fraction.value:g}", fraction.detail),
        engine_figures={"mem_fraction_static": fraction.value},
        block_size=setup.page, gpu_name=setup.gpu.name, gpu_count=len(setup.devices),
        notes=(*setup.notes, f"default fraction {derivation.fraction:g}: chunked prefill "
               f"{derivation.chunked_prefill_size}, decode graph bs {derivation.decode_max_bs}, "
               f"{derivation.prefill_buckets} prefill buckets"
               + (", 10 GiB floor" if derivation.floor_applied else "")),
        engine_version_assumed=request.engine_version_assumed,
        architecture_verified=verified,
        warnings=(*not_modelled_warnings(pinned, sr.NOT_MODELLED), *(() if verified else (architecture_note,))),
        kv_cache_bytes_low=max(int(max(tokens_central, 0) * cell) - int(max(tokens_high - tokens, 0) * cell)
                               - unverified_error, 0),
        kv_cache_bytes_high=int(max(tokens_high, tokens) * cell) + unverified_error,
        may_not_fit=doubt,
        engine_defaults={"mem_fraction_static": derivation.fraction,
                         "chunked_prefill_size": derivation.chunked_prefill_size},
    )


def _sglang_args(pinned: Mapping[str, Any], fraction: float, length: int) -> list[str]:
    """The flags the launch adds: only those the operator left unset."""
    args: list[str] = []
    if "--mem-fraction-static" not in pinned:
        args += ["--mem-fraction-static", f"{fraction:g}"]
    if "--context-length" not in pinned:
        args += ["--context-length", str(length)]
    return args


def _sglang_items(request: PlanRequest, setup: _SglangSetup, budget: SglangBudget, fraction: _Fraction,
                  tokens: int, length: int, kv: int, pool_bytes: int) -> tuple[BudgetItem, ...]:
    """The table: one row per term of `SglangBudget`, with where each figure comes from."""
    gpu, model, cal = setup.gpu, request.model, request.calibration
    mrr = sb.max_running_requests(max(tokens, 2), length, setup.pinned.get("--max-running-requests"))
    req_table = (mrr + 1) * (length + 4) * 4
    source = MEASURED if gpu.source == "nvml" else CATALOG
    return (
        BudgetItem("total", "GPU total (NVML)", budget.total, source,
                   f"tier heuristic uses {setup.gpu_mem_mib:.0f} MiB"),
        BudgetItem("other", "held by others", max(gpu.usable_total_bytes - (gpu.free_bytes or 0), 0), source,
                   tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", budget.context, FORMULA, "before SGLang's pre-load baseline",
                   bar="other"),
        BudgetItem("pre_load", "free at baseline (P)", budget.pre_load, FORMULA, "min over ranks of free - context"),
        BudgetItem("weights", "weights (per rank)", budget.weights, weights_source(model), model.weight_bytes_source,
                   bar="weights"),
        BudgetItem("load_overhead", "loader leftovers", budget.load_overhead, CALIBRATED if cal else FORMULA,
                   "allocated between baseline and pool sizing besides weights", bar="other"),
        BudgetItem("slack", f"slack P x (1 - {budget.fraction:g})", budget.slack, fraction.source,
                   f"{fraction.detail}; activations, CUDA graphs and the {format_gib(req_table)} request table "
                   "live here", bar="activations"),
        BudgetItem("kv", "KV pool", kv, FORMULA,
                   f"{tokens} tokens x {setup.cell:g} B/token (page {setup.page}); budget {format_gib(pool_bytes)}",
                   bar="kv"),
    )


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; SGLang sizes itself."""
    request = request_with_cached_layers(request, sa.LAYER_PATTERNS)
    pinned = request.pinned.values
    rules, _ = sr.rules_for(request.engine_version)
    return unplanned(request, refusal, newest=sr.NEWEST, rules_version=rules.version, pinned=pinned,
                     length=pinned.get("--context-length") or 0, tp=sr.ranks(pinned)[0], block=None)
