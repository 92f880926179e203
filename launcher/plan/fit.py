"""Reverse planning: from a workload (N requests of L tokens) to the hardware and flags that carry it.

Every answer is a plan from `launcher.plan.planner.make_plan`, so `safe-serve fit` and
`safe-serve plan` always agree: a fitted configuration, planned, carries the workload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.common.errors import UsageError, WontFit
from launcher.engines import adapter
from launcher.model.gpu import GpuDevice
from launcher.plan.choices import online_quantization_args
from launcher.plan.planner import GPU_COUNTS, Configuration, configuration_request, configurations, make_plan
from launcher.plan.search import largest_count
from launcher.plan.types import Plan, PlanRequest

__all__ = ["GPU_COUNTS", "FitReport", "GpuFit", "Option", "Workload", "fit", "fit_refusal", "fit_report",
           "grouped_misses", "largest_concurrency", "longest_length"]


@dataclass(frozen=True)
class Option:
    """One configuration tried for one GPU type."""

    gpu_name: str
    gpu_count: int
    kv_dtype: str  # "auto" or "fp8"
    checkpoint: str  # alias or repo of the checkpoint
    quantized: bool
    engine_args: tuple[str, ...]
    plan: Plan | None  # None: it does not fit
    shortfall: str | None = None  # why not, with the missing amount
    quantized_while_loading: bool = False  # the engine quantizes the weights to fp8 as it loads them

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def compromises(self) -> tuple[str, ...]:
        """What it costs beyond the GPUs: precision traded for memory."""
        found = []
        if self.kv_dtype == "fp8":
            found.append("fp8 KV cache")
        if self.quantized_while_loading:
            found.append("fp8 weights (quantized while loading)")
        if self.quantized:
            found.append(f"quantized checkpoint {self.checkpoint}")
        return tuple(found)


@dataclass(frozen=True)
class GpuFit:
    gpu_name: str
    best: Option | None  # the smallest configuration that carries the workload
    closest_miss: Option | None  # the single-GPU original configuration, when it does not fit


@dataclass(frozen=True)
class Workload:
    concurrency: int
    tokens: int


def try_option(base: PlanRequest, workload: Workload, gpu: GpuDevice, configuration: Configuration) -> Option:
    length_flag = adapter(base.engine).length_flag
    request = configuration_request(dataclasses.replace(base, concurrency=workload.concurrency), gpu, configuration,
                                    [*base.engine_args, length_flag, str(workload.tokens)])
    args = adapter(base.engine).shown_argv(request.engine_args)  # shown in the table and JSON: secrets masked
    checkpoint = configuration.checkpoint
    label = checkpoint.alias or checkpoint.name
    option = Option(gpu.name, configuration.count, configuration.kv_dtype, label, checkpoint is not base.model,
                    tuple(args), None, quantized_while_loading=bool(configuration.online_quantization))
    try:
        plan = make_plan(request)
    except WontFit as refusal:
        return dataclasses.replace(option, shortfall=refusal.message)
    if plan.may_not_fit:
        # fit answers what carries the workload at the central estimate, not what might.
        return dataclasses.replace(option, shortfall=plan.may_not_fit)
    return dataclasses.replace(option, plan=plan)


def fit(base: PlanRequest, workload: Workload, gpus: Sequence[GpuDevice]) -> list[GpuFit]:
    """For each GPU type, the smallest configuration that carries `workload`, or the miss."""
    if workload.concurrency < 1 or workload.tokens < 1:
        raise UsageError("--concurrency and --tokens must be at least 1")
    results = []
    for gpu in gpus:
        best = None
        first_miss = None
        online = online_quantization_args(base)
        for configuration in configurations(base.model, base.variants, online_quantization=online):
            option = try_option(base, workload, gpu, configuration)
            if option.fits:
                best = option
                break
            if first_miss is None:
                first_miss = option
        results.append(GpuFit(gpu.name, best, first_miss))
    return results


def largest_concurrency(base: PlanRequest, tokens: int) -> int:
    """Most requests of `tokens` that fit at once on `base.gpus` (0 if not one): the planner's own check."""
    engine = adapter(base.engine)
    pinned = dataclasses.replace(base, engine_args=(*base.engine_args, engine.length_flag, str(tokens)))

    def fits(concurrency: int) -> bool:
        try:
            return make_plan(dataclasses.replace(pinned, concurrency=concurrency)).may_not_fit is None
        except WontFit:
            return False

    return largest_count(fits)


def longest_length(base: PlanRequest, concurrency: int) -> int:
    """Longest length `concurrency` requests can each have at once (0 if none)."""
    try:
        plan = make_plan(dataclasses.replace(base, concurrency=concurrency))
    except WontFit:
        return 0
    return plan.max_model_len if plan.may_not_fit is None else 0


@dataclass(frozen=True)
class FitReport:
    """`safe-serve fit`'s whole answer: per GPU type, the inverse questions, and the refusal if none fits."""

    results: tuple[GpuFit, ...]
    workload: Workload
    inverse: tuple[int, int] | None  # (most requests of the length, longest length at the concurrency)
    refusal: WontFit | None


def fit_report(base: PlanRequest, workload: Workload, gpus: Sequence[GpuDevice], *, asked: Sequence[str],
               inverse: bool) -> FitReport:
    """`fit` over `gpus` (`asked`: their names as the operator gave them); `inverse` (one GPU type
    asked for) adds the largest concurrency and the longest length."""
    refuse_flags_fit_chooses(base)
    results = tuple(fit(base, workload, gpus))
    answers = None
    if inverse:
        answers = (largest_concurrency(base, workload.tokens), longest_length(base, workload.concurrency))
    return FitReport(results, workload, answers, fit_refusal(results, workload, asked))


def refuse_flags_fit_chooses(base: PlanRequest) -> None:
    """fit chooses the GPU count (tensor parallel), the KV dtype and the length (--tokens) itself: one of
    them pinned after `--` would be overridden by each configuration, or (the length) given twice to the
    engine, so it is exit 2 naming `plan`, which keeps pinned flags."""
    engine = adapter(base.engine)
    for flag in (engine.length_flag, engine.tp_flag, engine.kv_dtype_flag):
        if flag in base.pinned.values:
            raise UsageError(f"fit chooses {flag} itself (the length from --tokens, the GPU count and the KV "
                             f"dtype per configuration): {flag} after `--` would be overridden",
                             hint=f"drop {flag} after `--`, or plan that setup with `safe-serve plan`")


def fit_refusal(results: Sequence[GpuFit], workload: Workload, asked: Sequence[str]) -> WontFit | None:
    """None when some GPU type carries the workload, else the refusal (exit 78) with each miss."""
    if any(result.best for result in results):
        return None
    names = ", ".join(asked)
    misses = "; ".join(f"{', '.join(gpus)}: {shortfall}" for shortfall, gpus in grouped_misses(results))
    return WontFit(f"no configuration of {names} (up to {max(GPU_COUNTS)} GPUs, fp8 KV, quantized checkpoints) "
                   f"carries {workload.concurrency} x {workload.tokens} tokens", rule="fit",
                   figures={"concurrency": workload.concurrency, "tokens": workload.tokens, "misses": misses})


def grouped_misses(results: Sequence[GpuFit]) -> list[tuple[str, list[str]]]:
    """Why the GPU types that carry nothing miss, each distinct reason once with its GPUs (27 GPUs
    refused for the same length rule are one reason, not 27 paragraphs)."""
    groups: dict[str, list[str]] = {}
    for result in results:
        if result.best is None and result.closest_miss is not None and result.closest_miss.shortfall:
            groups.setdefault(result.closest_miss.shortfall, []).append(result.gpu_name)
    return list(groups.items())
