"""Alternatives wherever the answer is not a plain yes, beside `planner.alternatives_for`:

* the engine's memory knob at the value that fits (SGLang: "raise --mem-fraction-static" says
  by how much: the smallest fraction, in hundredths, whose plan fits);
* weights offloaded to the CPU (`--cpu-offload-gb`, where the engine's plan models it): the
  fewest whole GiB that fit;
* an unquantized checkpoint quantized to fp8 while the engine loads it (vLLM `--quantization
  fp8_per_tensor`, where the engine's plan models it);
* several GPUs given without a tensor-parallel flag: the plan over all of them, as a choice.

Each is a plan made for real by the planner (`attempt`), never a guess. Pure functions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from launcher.common.errors import Alternative
from launcher.common.units import GiB
from launcher.engines import adapter
from launcher.plan.types import Plan, PlanRequest

Attempt = Callable[[PlanRequest], Plan | None]  # a plan that fits at the central estimate, or None
# A knob value that fits only a few hundred tokens is no answer: the value that serves the
# pinned length, or this one, comes first; the bare minimum only when nothing reaches it.
USEFUL_LENGTH = 4096


def _useful_value(request: PlanRequest, attempt: Attempt, args_at: Callable[[int], tuple[str, ...]],
                  low: int, high: int) -> tuple[int, Plan] | None:
    """The smallest knob value whose plan serves a useful length (else any length), with its plan."""
    engine = adapter(request.engine)
    pinned_len = request.pinned.values.get(engine.length_flag)
    target = pinned_len if isinstance(pinned_len, int) and pinned_len > 0 else USEFUL_LENGTH

    def plan_at(value: int) -> Plan | None:
        return attempt(dataclasses.replace(request, engine_args=args_at(value)))

    def serves(value: int, floor: int) -> bool:
        plan = plan_at(value)
        return plan is not None and plan.max_model_len >= floor

    for wanted in (target, 1):
        found = smallest(functools.partial(lambda floor, value: serves(value, floor), wanted), low, high)
        plan = plan_at(found) if found is not None else None
        if found is not None and plan is not None:
            return found, plan
    return None


def smallest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest n in [low, high] with fits(n), for a predicate that only gets truer as n grows."""
    if not fits(high):
        return None
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid + 1, high)
    return low


def _alternative(request: PlanRequest, text: str, plan: Plan, args: tuple[str, ...],
                 gpu_count: int | None = None) -> Alternative:
    engine = adapter(request.engine)
    # An alternative is shown and printed as JSON: the operator's secret flags stay masked.
    return Alternative(f"{text}: {plan.kv_cache_tokens:,} KV tokens, {engine.length_flag} {plan.max_model_len}",
                       engine_args=tuple(engine.shown_argv(args)), kv_cache_tokens=plan.kv_cache_tokens,
                       max_model_len=plan.max_model_len,
                       gpu_count=gpu_count)


def knob_choice(request: PlanRequest, attempt: Attempt, free_len: tuple[str, ...]) -> Alternative | None:
    """The engine's memory fraction at the smallest value (0.50-0.98) that fits, when not pinned."""
    engine = adapter(request.engine)
    flag = engine.memory_knob_flag
    if flag is None or flag in request.pinned.values:
        return None

    def args_at(hundredths: int) -> tuple[str, ...]:
        return tuple(engine.set_flag(free_len, flag, f"{hundredths / 100:.2f}"))

    answer = _useful_value(request, attempt, args_at, 50, 98)
    if answer is None:
        return None
    found, plan = answer
    return _alternative(request, f"{flag} {found / 100:.2f} (less left for activations and CUDA graphs: "
                                 "a load peak may run out of memory)", plan, args_at(found))


def offload_choice(request: PlanRequest, attempt: Attempt, free_len: tuple[str, ...]) -> Alternative | None:
    """The fewest whole GiB of weights offloaded to CPU memory that fit (slower: weights cross PCIe)."""
    engine = adapter(request.engine)
    flag = engine.cpu_offload_flag
    if flag is None or request.device != "cuda" or flag in request.pinned.values:
        return None
    most = max(1, -(-request.model.weight_bytes // GiB))

    def args_at(gib: int) -> tuple[str, ...]:
        return tuple(engine.set_flag(free_len, flag, str(gib)))

    answer = _useful_value(request, attempt, args_at, 1, most)
    if answer is None:
        return None
    found, plan = answer
    return _alternative(request, f"{flag} {found} (weights offloaded to CPU memory: every step reads them over "
                                 "PCIe, much slower)", plan, args_at(found))


def online_quantization_args(request: PlanRequest) -> tuple[str, ...] | None:
    """The flags that quantize this request's checkpoint while the engine loads it, where that applies:
    the engine's plan models it for the version, a GPU, an unquantized checkpoint, no quantization pinned."""
    args = adapter(request.engine).online_quantization_args(request.engine_version)
    if args is None or request.device != "cuda" or request.model.geometry.quantization is not None \
            or args[0] in request.pinned.values:
        return None
    return args


def online_quantization_choice(request: PlanRequest, attempt: Attempt, free_len: tuple[str, ...]
                               ) -> Alternative | None:
    """The unquantized checkpoint quantized while the engine loads it, when no quantization is pinned."""
    args = online_quantization_args(request)
    if args is None:
        return None
    quantized = (*free_len, *args)
    plan = attempt(dataclasses.replace(request, engine_args=quantized))
    if plan is None:
        return None
    return _alternative(request, f"{' '.join(args)} (weights quantized while loading: about half the memory, "
                                 "a small change in output quality)", plan, quantized)


def tensor_parallel_choice(request: PlanRequest, plan: Plan, attempt: Attempt) -> Alternative | None:
    """Several GPUs given or visible, no TP flag, the plan uses one: the plan over all of them."""
    engine = adapter(request.engine)
    pinned = request.pinned.values
    if request.device != "cuda" or engine.tp_flag in pinned or plan.tp * plan.pp >= len(request.gpus):
        return None
    for tp in (8, 4, 2):
        if tp <= len(request.gpus):
            args = tuple(engine.set_flag(request.engine_args, engine.tp_flag, str(tp)))
            wide = attempt(dataclasses.replace(request, engine_args=args))
            if wide is not None:
                return _alternative(request, f"{engine.tp_flag} {tp} over {tp} of the {len(request.gpus)} GPUs",
                                    wide, args, gpu_count=tp)
    return None
