"""The planner's front door: dispatch a `PlanRequest` to its engine, and plan the alternatives.

Pure: no I/O and no environment reads; everything arrives in the `PlanRequest`. When nothing
fits, `WontFit` carries alternatives that were each planned, not guessed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher.engines import adapter
from launcher.engines.flags import drop_flag
from launcher.errors import SafeServeError, UsageError, WontFit
from launcher.model import refuse_unsupported
from launcher.plan import Plan, PlanRequest


def make_plan(request: PlanRequest) -> Plan:
    """Plan a start, or raise `WontFit` with computed alternatives."""
    if request.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    refuse_unsupported(request.model.geometry)  # --trust-engine turns this into engine_decides()
    try:
        return _plan_once(request)
    except WontFit as failure:
        raise WontFit(failure.message, hint=failure.hint, alternatives=alternatives_for(request)) from None


def _plan_once(request: PlanRequest) -> Plan:
    try:
        engine = adapter(request.engine)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return engine.plan(request)


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: the engine sizes itself; see `launcher.budget.unplanned`."""
    return adapter(request.engine).engine_decides(request, refusal)


def alternatives_for(request: PlanRequest) -> tuple[str, ...]:
    """Each alternative is planned for real; only the ones that fit are offered."""
    found: list[str] = []
    args = list(request.engine_args)
    engine = adapter(request.engine)
    length_flag, kv_flag_value, tp_flag = engine.length_flag, engine.fp8_kv_dtype, engine.tp_flag

    def attempt(label: str, **changes: Any) -> Plan | None:
        # What an earlier start measured holds for its own setup only, not for another
        # checkpoint, parallelism or KV dtype.
        try:
            return _plan_once(dataclasses.replace(request, calibration=None, **changes))
        except (WontFit, UsageError):
            return None

    # Alternatives free the length (the usual reason nothing fits) and report what it becomes.
    free_len = drop_flag(args, length_flag)
    if free_len != args or request.concurrency > 1:
        plan = attempt("length", engine_args=tuple(free_len))
        if plan is not None:
            found.append(f"{length_flag} {plan.max_model_len} (the longest that fits)")
    if "--kv-cache-dtype" not in " ".join(args):
        plan = attempt("fp8", engine_args=tuple([*free_len, "--kv-cache-dtype", kv_flag_value]))
        if plan is not None:
            found.append(f"--kv-cache-dtype {kv_flag_value}: {plan.kv_cache_tokens:,} KV tokens, "
                         f"{length_flag} {plan.max_model_len}")
    if request.device == "cuda" and tp_flag not in " ".join(args):
        for tp in (2, 4, 8):
            if len(request.gpus) >= tp:
                plan = attempt("tp", engine_args=tuple([*args, tp_flag, str(tp)]))
                if plan is not None:
                    found.append(f"{tp_flag} {tp} over {tp} GPUs: {plan.kv_cache_tokens:,} KV tokens, "
                                 f"{length_flag} {plan.max_model_len}")
                    break
    for variant in request.variants:
        plan = attempt("quantized", model=variant, variants=(), engine_args=tuple(free_len))
        if plan is not None:
            found.append(f"quantized checkpoint {variant.alias or variant.name} ({variant.name}): "
                         f"{plan.kv_cache_tokens:,} KV tokens, {length_flag} {plan.max_model_len}")
    return tuple(found)
