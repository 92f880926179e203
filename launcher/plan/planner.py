"""The planner's front door: dispatch a `PlanRequest` to its engine, and plan the alternatives.

Pure: no I/O and no environment reads; everything arrives in the `PlanRequest`. When nothing
fits, `WontFit` carries alternatives that were each planned, not guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.common.errors import Alternative, SafeServeError, UnsupportedModel, UsageError, WontFit
from launcher.engines import adapter
from launcher.model.gpu import GpuDevice
from launcher.model.resolve import ResolvedModel
from launcher.plan.search import largest_count
from launcher.plan.types import Plan, PlanRequest


def make_plan(request: PlanRequest, *, choices: bool = False) -> Plan:
    """Plan a start, or raise `WontFit` with computed alternatives. `choices` (the CLI's plan and
    serve; not fit's searches) adds the alternatives of a plan that is not a plain yes."""
    if request.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    try:
        plan = _plan_once(request)
    except WontFit as failure:
        raise WontFit(failure.message, hint=failure.hint, alternatives=alternatives_for(request), rule=failure.rule,
                      source=failure.source, figures=failure.figures) from None
    warnings = (*request.warnings, *_version_warnings(request))
    if request.notes or warnings:
        plan = dataclasses.replace(plan, notes=(*request.notes, *plan.notes), warnings=(*warnings, *plan.warnings))
    return _with_choices(request, plan) if choices else plan


def _version_warnings(request: PlanRequest) -> tuple[str, ...]:
    """A release newer than our rules, or older than the oldest whose code we read, is a warning."""
    from launcher.engines.versions import version_key

    engine = adapter(request.engine)
    rules, note = engine.rules_version(request.engine_version)
    if note and "newer than" in note:
        return (note,)
    if request.engine_version and version_key(request.engine_version) < version_key(engine.oldest):
        return (f"{request.engine} {request.engine_version} is older than {engine.oldest}, the oldest release "
                f"whose code safe-serve read: planned with the {rules} rules, which may not be that release's",)
    return ()


def _attempt(request: PlanRequest) -> Plan | None:
    """A plan that fits at the central estimate, or None."""
    try:
        plan = _plan_once(dataclasses.replace(request, calibration=None))
    except (WontFit, UsageError):
        return None
    return plan if plan.may_not_fit is None else None


def _with_choices(request: PlanRequest, plan: Plan) -> Plan:
    from launcher.plan.choices import tensor_parallel_choice

    found: list[Alternative] = list(alternatives_for(request)) if plan.may_not_fit else []
    wide = tensor_parallel_choice(request, plan, _attempt)
    if wide is not None and all(a.engine_args != wide.engine_args for a in found):
        found.append(wide)
    return dataclasses.replace(plan, alternatives=tuple(found)) if found else plan


def _plan_once(request: PlanRequest) -> Plan:
    try:
        engine = adapter(request.engine)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not request.model.weights_sized:  # only with --trust-engine: the engine sizes it
        raise UnsupportedModel(f"the weight size is {request.model.weight_bytes_source}",
                               hint="safe-serve plans nothing here; serve --trust-engine lets the engine size it")
    return engine.plan(request)


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: the engine sizes itself; see `launcher.plan.budget.unplanned`."""
    return adapter(request.engine).engine_decides(request, refusal)


GPU_COUNTS = (1, 2, 4, 8)  # the tensor-parallel sizes `fit` and the alternatives try


@dataclass(frozen=True)
class Configuration:
    """One configuration `fit` and the alternatives try: GPUs, KV dtype, checkpoint, and whether the
    engine quantizes an unquantized checkpoint while loading it (its flags, else empty)."""

    count: int
    kv_dtype: str  # "auto" or "fp8"
    checkpoint: ResolvedModel
    online_quantization: tuple[str, ...] = ()


def configurations(model: ResolvedModel, variants: Sequence[ResolvedModel], counts: Sequence[int] = GPU_COUNTS,
                   online_quantization: tuple[str, ...] | None = None) -> list[Configuration]:
    """Cheapest first: fewer GPUs, then full precision, fp8 KV, the weights quantized to fp8 while
    loading (where the engine's plan models it), a quantized checkpoint, both."""
    weights: list[tuple[ResolvedModel, tuple[str, ...]]] = [(model, ())]
    if online_quantization:
        weights.append((model, online_quantization))
    weights += [(variant, ()) for variant in variants]
    return [Configuration(count, kv_dtype, checkpoint, online)
            for count in counts for checkpoint, online in weights for kv_dtype in ("auto", "fp8")]


def configuration_request(base: PlanRequest, gpu: GpuDevice, configuration: Configuration,
                          engine_args: Sequence[str]) -> PlanRequest:
    """`base` on the configuration's GPUs (like `gpu`) with its tensor parallel size, KV dtype, checkpoint
    and online quantization."""
    engine = adapter(base.engine)
    args = [*engine_args, *configuration.online_quantization]
    if configuration.count > 1:
        args = engine.set_flag(args, engine.tp_flag, str(configuration.count))
    if configuration.kv_dtype == "fp8":
        args = engine.set_flag(args, engine.kv_dtype_flag, engine.fp8_kv_dtype)
    devices = tuple(dataclasses.replace(gpu, index=i) for i in range(configuration.count))
    # What an earlier start measured holds for its own setup only.
    return dataclasses.replace(base, model=configuration.checkpoint, gpus=devices, engine_args=tuple(args),
                               variants=(), calibration=None)


def _memory_choices(request: PlanRequest, free_len: tuple[str, ...]) -> list[Alternative]:
    """The engine's memory fraction at the value that fits, and weights offloaded to the CPU."""
    from launcher.plan.choices import knob_choice, offload_choice, online_quantization_choice

    choices = (knob_choice, online_quantization_choice, offload_choice)
    return [a for a in (choice(request, _attempt, free_len) for choice in choices) if a is not None]


def alternatives_for(request: PlanRequest) -> tuple[Alternative, ...]:
    """Each alternative is planned for real; only the ones that fit (at the central estimate) are offered."""
    search = _Alternatives(request)
    search.longest_length()
    search.fewer_requests()
    search.fp8_cache()
    search.tensor_parallel()
    search.quantized_checkpoints()
    search.more_gpus()
    # After the rest: they cost speed or headroom.
    search.found.extend(_memory_choices(request, tuple(search.free_len)))
    return tuple(search.found)


class _Alternatives:
    """The alternatives to a refused request, one kind per method, in the order they are offered.

    Alternatives free the length (the usual reason nothing fits) and report what it becomes.
    """

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        self.engine = adapter(request.engine)
        self.args = list(request.engine_args)
        self.pinned = request.pinned.values
        self.free_len = self.engine.drop_flag(self.args, self.engine.length_flag)
        self.found: list[Alternative] = []

    def attempt(self, changed: PlanRequest) -> Plan | None:
        return _attempt(changed)

    def with_args(self, args: Sequence[str]) -> Plan | None:
        return self.attempt(dataclasses.replace(self.request, engine_args=tuple(args)))

    def offer(self, text: str, plan: Plan, engine_args: Sequence[str], *, model: str | None = None,
              gpu_count: int | None = None) -> None:
        self.found.append(Alternative(
            f"{text}: {plan.kv_cache_tokens:,} KV tokens, {self.engine.length_flag} {plan.max_model_len}",
            # An alternative is shown and printed as JSON: the operator's secret flags stay masked.
            engine_args=tuple(self.engine.shown_argv(engine_args)), kv_cache_tokens=plan.kv_cache_tokens,
            max_model_len=plan.max_model_len, model=model, gpu_count=gpu_count))

    def longest_length(self) -> None:
        if self.free_len == self.args and self.request.concurrency <= 1:
            return
        plan = self.with_args(self.free_len)
        if plan is not None:
            length_flag = self.engine.length_flag
            args = self.engine.set_flag(self.free_len, length_flag, str(plan.max_model_len))
            self.found.append(Alternative(
                f"{length_flag} {plan.max_model_len} (the longest that fits)",
                engine_args=tuple(self.engine.shown_argv(args)),  # printed: secret flags stay masked
                kv_cache_tokens=plan.kv_cache_tokens, max_model_len=plan.max_model_len))

    def fewer_requests(self) -> None:
        request = self.request
        if request.concurrency <= 1 or self.free_len == self.args:
            return
        most = largest_count(lambda n: n < request.concurrency and self.attempt(
            dataclasses.replace(request, concurrency=n)) is not None)
        plan = self.attempt(dataclasses.replace(request, concurrency=most)) if most else None
        if plan is not None:
            self.offer(f"--concurrency {most} (at most {most} requests of this length at once)", plan, self.args)

    def fp8_cache(self) -> None:
        engine = self.engine
        if engine.kv_dtype_flag in self.pinned:
            return
        fp8_args = engine.set_flag(self.free_len, engine.kv_dtype_flag, engine.fp8_kv_dtype)
        plan = self.with_args(fp8_args)
        if plan is not None:
            self.offer(f"--kv-cache-dtype {engine.fp8_kv_dtype}", plan, fp8_args)

    def tensor_parallel(self) -> None:
        """Without a pinned size: 2, 4, 8 over the GPUs given. With one the engine refuses (heads not
        divisible, too few GPUs): the sizes that do work, largest first."""
        tp_flag = self.engine.tp_flag
        if self.request.device != "cuda":
            return
        sizes = (2, 4, 8) if tp_flag not in self.pinned else tuple(t for t in (8, 4, 2, 1)
                                                                   if t != self.pinned[tp_flag])
        for tp in sizes:
            if len(self.request.gpus) >= tp:
                tp_args = self.engine.set_flag(self.args, tp_flag, str(tp))
                plan = self.with_args(tp_args)
                if plan is not None:
                    gpus = max(plan.gpu_count, tp)  # with data parallelism, each DP rank's tp
                    self.offer(f"{tp_flag} {tp} over {gpus} GPU{'s' if gpus > 1 else ''}", plan, tp_args)
                    return

    def quantized_checkpoints(self) -> None:
        for variant in self.request.variants:
            plan = self.attempt(dataclasses.replace(self.request, model=variant, variants=(),
                                                    engine_args=tuple(self.free_len)))
            if plan is not None:
                self.offer(f"quantized checkpoint {variant.alias or variant.name} ({variant.name})", plan,
                           self.free_len, model=variant.repo_id or variant.name)

    def more_gpus(self) -> None:
        """What `fit` would find: the cheapest configuration of this GPU type that carries the
        request, with as many of them as it takes (and precision traded for memory)."""
        request = self.request
        if request.device != "cuda" or not request.gpus or self.engine.tp_flag in self.pinned or self.found:
            return
        from launcher.plan.choices import online_quantization_args

        gpu = request.gpus[0]
        online = online_quantization_args(request)
        for configuration in configurations(request.model, request.variants, online_quantization=online):
            if configuration.count == 1 and configuration.online_quantization:
                continue  # on one GPU that is the online-quantization choice itself (`_memory_choices`)
            changed = configuration_request(request, gpu, configuration, self.free_len)
            plan = self.attempt(changed)
            if plan is not None:
                count, checkpoint = configuration.count, configuration.checkpoint
                what = [f"{count} x {gpu.name}" + (f" ({count - len(request.gpus)} more than given)"
                                                   if count > len(request.gpus) else "")]
                if checkpoint is not request.model:
                    what.append(f"quantized checkpoint {checkpoint.alias or checkpoint.name}")
                shown = " ".join(self.engine.shown_argv(changed.engine_args))
                self.offer(", ".join(what) + " " + shown, plan, changed.engine_args,
                           model=None if checkpoint is request.model else checkpoint.repo_id or checkpoint.name,
                           gpu_count=count)
                return
