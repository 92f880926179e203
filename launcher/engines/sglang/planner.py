"""SGLang's planner: from a `PlanRequest` to `--mem-fraction-static`, `--context-length` and the pool.

SGLang sizes its pool from the free memory it saw before loading (P) and after (A):
`pool = A - P x (1 - fraction)`, in cells of `cell_size_bytes` per token, floored to the page
(`mem_cache/kv_cache_configurator.py`); the default fraction is SGLang's own reserve formula
(`default_fraction`, checked against SGLang's code in tests/data/sglang_oracle.json).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from launcher.common.errors import SafeServeError, UsageError, WontFit
from launcher.common.units import MiB, floor_to, format_gib
from launcher.engines.checks_common import CheckInput
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.layers import request_with_cached_layers
from launcher.engines.sglang import architectures as layouts
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import kv as sk
from launcher.engines.sglang import rules as sr
from launcher.engines.sglang.checks import start_checks
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


def plan(request: PlanRequest) -> Plan:
    request = request_with_cached_layers(request, layouts.LAYER_PATTERNS)
    if request.device == "cpu":
        raise UsageError("SGLang on CPU is not planned yet: use --engine vllm --device cpu")
    model, geometry = request.model, request.model.geometry
    rules, rules_note = sr.rules_for(request.engine_version)
    pinned = request.pinned.values
    # SGLang's own config classes may refuse the config; state families it has no model class for are
    # refused there too (--trust-engine lets SGLang decide).
    layout = layouts.layout(geometry)
    # SGLang runs some wrappers text-only unless --enable-multimodal (configs/model_config.py:690-717).
    geometry = dataclasses.replace(geometry, is_multimodal=layouts.multimodal(geometry, pinned))
    tp, pp = sr.ranks(pinned)
    devices = rank_devices(request, tp * pp, pinned.get("--nnodes", 1), tp_flag=sr.TP_FLAG)
    gpu = tightest(devices)
    # SGLang's tier heuristic reads nvidia-smi's memory.total: the smallest card listed.
    gpu_mem_mib = min(d.total_bytes for d in (request.gpus or devices)) / MiB
    derivation = sb.default_fraction(geometry, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, pinned=pinned, rules=rules)
    context = sb.CUDA_CONTEXT_BYTES + (sb.NCCL_BYTES if tp * pp > 1 else 0)
    pre_load = min(d.free_bytes or 0 for d in devices) - context  # P: min over ranks
    cal = request.calibration
    load_overhead = cal.load_overhead_bytes if cal and cal.load_overhead_bytes is not None else sb.LOAD_OVERHEAD_BYTES
    weights = model.weight_bytes // (tp * pp)
    after_load = pre_load - weights - load_overhead  # A

    dtype, dtype_reason = resolve_dtype(geometry, compute_capability=gpu.compute_capability, device="cuda",
                                           pinned=pinned.get("--dtype"))
    derived_len, derived_reason = sr.derived_context_length(geometry)
    refusals = start_checks(CheckInput(
        geometry=geometry, device="cuda", compute_capability=gpu.compute_capability, gpu_count=len(request.gpus),
        tp=tp, pp=pp, dtype=dtype, kv_cache_dtype=pinned.get("--kv-cache-dtype"), block_size=pinned.get("--page-size"),
        max_model_len=pinned.get("--context-length"), model_max_len=derived_len, engine_version=request.engine_version,
        gpu_name=gpu.name, allow_long_max_model_len=request.allow_long_max_model_len,
        quantization=pinned.get("--quantization"), pinned_dtype=pinned.get("--dtype")))
    if refusals:
        first = refusals[0]
        raise WontFit(f"SGLang refuses this at start: {' '.join(first.message.split())} [{first.source}]",
                      hint=first.hint, rule=first.rule, source=first.source)
    try:  # after the engine's own checks: what it refuses is its refusal, not our sizing gap
        kv_elem, kv_reason = sk.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype, geometry)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cell = layouts.cell_size_bytes(layout, kv_bytes=kv_elem, kv_fp8=kv_elem == 1, tp=tp, pp=pp, pinned=pinned)
    page, page_reason = sk.default_page_size(geometry, gpu.compute_capability)
    if layouts.dsa_page_size(geometry) is not None:
        page = layouts.dsa_page_size(geometry) or page
        page_reason = f"DeepSeek DSA pages of {page} tokens (arg_groups/model_overrides/deepseek_v2.py:161-173)"
    if "--page-size" in pinned:
        page, page_reason = pinned["--page-size"], "pinned --page-size"
    if geometry.is_multimodal and not pinned.get("--language-only", False):
        after_load -= sb.MULTIMODAL_RESERVE_BYTES
    # Above the derived length is start_checks' to decide (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN).
    context_len_pinned = pinned.get("--context-length")

    def req_to_token_bytes(tokens: int, length: int) -> int:
        mrr = sb.max_running_requests(max(tokens, 2), length, pinned.get("--max-running-requests"))
        return (mrr + 1) * (length + 4) * 4

    # Fraction: pinned, or keep SGLang's absolute slack (its own reserve) against *free*
    # memory, so other tenants don't shrink the room for activations and graphs.
    if "--mem-fraction-static" in pinned:
        fraction_value = pinned["--mem-fraction-static"]
        f_source, f_detail = PINNED, "pinned --mem-fraction-static"
    else:
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
        fraction_value = min(derivation.fraction, from_free)
        f_source = ENGINE_DEFAULT if fraction_value == derivation.fraction else FORMULA
        f_detail = (f"SGLang {rules.version} default: reserve {derivation.reserved_mib:.0f} MiB "
                    f"of {gpu_mem_mib:.0f} MiB"
                    if f_source == ENGINE_DEFAULT else
                    f"keeps the {format_gib(idle_pre_load * (1 - derivation.fraction))} slack SGLang's default "
                    f"{derivation.fraction:g} leaves on an idle card"
                    + (" + margin for other tenants" if tenants else "")
                    + f", out of {format_gib(pre_load)} free")
    state_slot = _state_slot(layout, pinned, tp=tp, pp=pp)
    state_ratio = float(pinned.get("--mamba-full-memory-ratio", layouts.DEFAULT_MAMBA_FULL_MEMORY_RATIO))

    def sized(pre: int, after: int) -> layouts.PoolSizing:
        return layouts.pool(pre_load_bytes=pre, after_load_bytes=after, fraction_value=fraction_value,
                            cell_bytes=cell, page_size=page, max_total_tokens=pinned.get("--max-total-tokens"),
                            state_slot=state_slot, state_ratio=state_ratio,
                            context_len=pinned.get("--context-length") or derived_len)

    central = sized(pre_load, after_load)
    tokens, budget = central.tokens, central.budget_bytes
    # The favourable end of the error band: our CUDA-context and loader estimates too high, and on a
    # catalog card (free = its CUDA total) the spread of the totals published for it.
    context_error = sb.CONTEXT_ERROR_BYTES + (gpu.usable_total_error_bytes if gpu.source == "catalog" else 0)
    overhead_error = 0 if cal and cal.load_overhead_bytes is not None else sb.LOAD_OVERHEAD_ERROR_BYTES
    tokens_high = sized(pre_load + context_error, after_load + context_error + overhead_error).tokens
    request_cap = _state_request_cap(central, layout, geometry.architecture, pinned, pp=pp,
                                     concurrency=request.concurrency)
    doubt = None
    tokens_central = tokens
    if tokens <= 0:
        minimum = 1 - after_load / pre_load if pre_load > 0 else 1.0
        if tokens_high <= 0:
            hint = ("raise --mem-fraction-static, quantize, or use tensor parallel" if minimum < 0.99 else
                    "no --mem-fraction-static can fit: the weights alone need more than the free memory; "
                    "quantize or use tensor parallel")
            raise WontFit(f"SGLang will fail: the weights leave no KV pool under --mem-fraction-static "
                          f"{fraction_value:g} (minimum viable {minimum:.4f})", hint=hint)
        doubt = (f"the weights leave a KV pool under --mem-fraction-static {fraction_value:g} only at the favourable "
                 f"end of the estimate (minimum viable {minimum:.4f} at the central estimate)")
        tokens = tokens_high  # plan the length on what may be there; the band keeps the central 0
    if context_len_pinned is not None:
        length, length_reason = context_len_pinned, "pinned --context-length"
        if tokens < request.concurrency * length and tokens_high >= request.concurrency * length:
            doubt = (f"the pool holds ~{tokens} tokens at the central estimate ({tokens_high} at best): "
                     f"{request.concurrency} request(s) of {length} may not fit")
        elif tokens < request.concurrency * length:
            raise WontFit(f"the pool holds {tokens} tokens: {request.concurrency} request(s) of {length} do not fit; "
                          "SGLang would cap requests at the pool size silently")
    else:
        length = min(derived_len, tokens // request.concurrency // page * page)
        length_reason = (f"model maximum ({derived_reason})" if length == derived_len
                         else f"longest that fits {request.concurrency} request(s) in the pool (SGLang would cap "
                              f"silently at {tokens} tokens)")
        if length <= 0:
            raise WontFit(f"the pool holds only {tokens} tokens: not one per request for {request.concurrency}")
    req_table = req_to_token_bytes(tokens, length)
    slack = int(pre_load * (1 - fraction_value))
    kv = int(tokens * cell)
    args: list[str] = []
    if "--mem-fraction-static" not in pinned:
        args += ["--mem-fraction-static", f"{fraction_value:g}"]
    if context_len_pinned is None:
        args += ["--context-length", str(length)]
    others = gpu.usable_total_bytes - (gpu.free_bytes or 0)
    items = (
        BudgetItem("total", "GPU total (NVML)", gpu.total_bytes, MEASURED if gpu.source == "nvml" else CATALOG,
                   f"tier heuristic uses {gpu_mem_mib:.0f} MiB"),
        BudgetItem("other", "held by others", max(others, 0), MEASURED if gpu.source == "nvml" else CATALOG,
                   tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", context, FORMULA, "before SGLang's pre-load baseline",
                   bar="other"),
        BudgetItem("pre_load", "free at baseline (P)", pre_load, FORMULA, "min over ranks of free - context"),
        BudgetItem("weights", "weights (per rank)", weights, weights_source(model), model.weight_bytes_source,
                   bar="weights"),
        BudgetItem("load_overhead", "loader leftovers", load_overhead, CALIBRATED if cal else FORMULA,
                   "allocated between baseline and pool sizing besides weights", bar="other"),
        BudgetItem("slack", f"slack P x (1 - {fraction_value:g})", slack, f_source,
                   f"{f_detail}; activations, CUDA graphs and the {format_gib(req_table)} request table live here",
                   bar="activations"),
        BudgetItem("kv", "KV pool", kv, FORMULA,
                   f"{tokens} tokens x {cell:g} B/token (page {page}); budget {format_gib(budget)}", bar="kv"),
        *_state_items(central, state_slot, layout, geometry.architecture, pinned, pp=pp),
    )
    notes = [n for n in (rules_note, dtype_reason, kv_reason, page_reason) if n]
    verified, architecture_note = layouts.architecture_status(geometry)
    unverified_error = 0 if verified else int(kv * layouts.UNVERIFIED_KV_ERROR_FRACTION)
    notes.append(f"default fraction {derivation.fraction:g}: chunked prefill {derivation.chunked_prefill_size}, "
                 f"decode graph bs {derivation.decode_max_bs}, {derivation.prefill_buckets} prefill buckets"
                 + (", 10 GiB floor" if derivation.floor_applied else ""))
    return Plan(
        engine="sglang", engine_version=request.engine_version or sr.NEWEST, rules_version=rules.version,
        device="cuda", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=tokens,
        max_concurrency=min(round(tokens / length, 2) if length else 0.0, request_cap or float("inf")),
        budget=items, engine_args=tuple(args), engine_env={}, pinned=dict(pinned), tp=tp, pp=pp,
        knob=MemoryKnob("--mem-fraction-static", fraction_value, "fraction",
                        f"--mem-fraction-static {fraction_value:g}", f_detail),
        engine_figures={"mem_fraction_static": fraction_value},
        block_size=page, gpu_name=gpu.name, gpu_count=len(devices),
        notes=tuple(notes),
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


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; SGLang sizes itself."""
    request = request_with_cached_layers(request, layouts.LAYER_PATTERNS)
    pinned = request.pinned.values
    rules, _ = sr.rules_for(request.engine_version)
    return unplanned(request, refusal, newest=sr.NEWEST, rules_version=rules.version, pinned=pinned,
                     length=pinned.get("--context-length") or 0, tp=sr.ranks(pinned)[0], block=None)


def _state_slot(layout: layouts.SglangLayout, pinned: Mapping[str, Any], *, tp: int, pp: int) -> int | None:
    """Bytes of one request's linear/Mamba state on the fullest stage, or None without state layers."""
    if layout.state is None or not layout.state.layers:
        return None
    return layouts.state_slot_bytes(layout.state, tp=tp, ssm_dtype=pinned.get("--mamba-ssm-dtype"), pp=pp,
                                    num_layers=layout.num_layers)


def _state_request_cap(sizing: layouts.PoolSizing, layout: layouts.SglangLayout, architecture: str,
                       pinned: Mapping[str, Any], *, pp: int, concurrency: int) -> int | None:
    """Requests the state pool lets SGLang run at once (`resolve_max_num_reqs`, kv_cache_configurator.py:3119-3170)."""
    if sizing.state_slots is None:
        return None
    per_request = layouts.state_slots_per_request(architecture, pinned, pp=pp)
    cap = sizing.state_slots // per_request
    if cap <= 0:
        raise WontFit(f"SGLang will fail: its state pool holds {sizing.state_slots} slots, {per_request} per request "
                      "('Hybrid (mamba/linear-attention) state cache is too small to serve any requests')",
                      hint="raise --mem-fraction-static or --mamba-full-memory-ratio, or use tensor parallel")
    if cap < concurrency:
        raise WontFit(f"SGLang's state pool runs {cap} request(s) at once ({sizing.state_slots} slots, {per_request} "
                      f"per request), fewer than the {concurrency} asked for",
                      hint="raise --mamba-full-memory-ratio, use --mamba-ssm-dtype bfloat16, or use tensor parallel")
    return cap


def _state_items(sizing: layouts.PoolSizing, slot: int | None, layout: layouts.SglangLayout, architecture: str,
                 pinned: Mapping[str, Any], *, pp: int) -> tuple[BudgetItem, ...]:
    if sizing.state_slots is None or slot is None or layout.state is None:
        return ()
    per_request = layouts.state_slots_per_request(architecture, pinned, pp=pp)
    return (BudgetItem("state", "state pool (mamba / linear attention)", sizing.state_bytes, FORMULA,
                       f"{sizing.state_slots} + 1 slots x {slot} B ({len(layout.state.layers)} state layers, "
                       f"{per_request} slots per request; {layout.state.config_class}.mamba2_cache_params)",
                       bar="kv"),)
