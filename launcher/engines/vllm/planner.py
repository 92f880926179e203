"""vLLM's planner: from a `PlanRequest` to the flags and the KV cache vLLM will give, per rank.

GPU (`plan_gpu`): `requested = ceil(cuda_total x utilization)` must not exceed the free memory
at start (vLLM refuses otherwise), and `KV = requested - weights - non-torch - activation
peak - CUDA-graph estimate` (`budget.py`); tokens follow vLLM's own block accounting
(`kv.py`). CPU (`plan_cpu`): the KV space is VLLM_CPU_KVCACHE_SPACE whole GiB of host RAM.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import SafeServeError, UnsupportedModel, UsageError, WontFit
from launcher.common.units import GiB, format_gib
from launcher.engines.checks_common import CheckInput, EngineRule, refuse_bad_argument
from launcher.engines.draft import request_without_draft
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.layers import request_with_cached_layers
from launcher.engines.online_quant import ELEMENT_BYTES
from launcher.engines.versions import version_key
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import context_parallel as vcp
from launcher.engines.vllm import hybrid
from launcher.engines.vllm import kv as vk
from launcher.engines.vllm import parallel as vpar
from launcher.engines.vllm import rules as vr
from launcher.engines.vllm import weight_segments as vs
from launcher.engines.vllm.architectures import (
    LAYER_PATTERNS,
    SUPPORTED_UNTIL,
    architecture_status,
    cpu_unservable,
    removed_in,
    uses_mla,
)
from launcher.engines.vllm.checks import start_checks
from launcher.engines.vllm.compilation import GraphPins, compiles_model, graph_mode
from launcher.engines.vllm.kv import CPU_BLOCK_SIZE, KvCapacity, KvLayout, kv_capacity
from launcher.model.config import SLIDING, ModelGeometry
from launcher.model.gpu import GpuDevice, HostMemory
from launcher.plan.budget import (
    not_modelled_warnings,
    rank_devices,
    tenants_detail,
    tightest,
    unplanned,
    weights_source,
)
from launcher.plan.search import largest_length
from launcher.plan.types import (
    CALIBRATED,
    CATALOG,
    COMPUTED,
    ENGINE_DEFAULT,
    FORMULA,
    MEASURED,
    PINNED,
    BudgetItem,
    Calibration,
    MemoryKnob,
    Plan,
    PlanRequest,
)

# The band added for an architecture whose KV layout is not proven against the engine: the 13
# wrong cases on 7 unverified architectures were off by -67 % to +300 % before their layouts were
# encoded; a third of the KV bytes either way keeps the plan from a confident wrong number.
UNVERIFIED_KV_ERROR_FRACTION = 0.33


def plan(request: PlanRequest) -> Plan:
    """The vLLM plan for `request`'s device, or `WontFit`."""
    request = request_with_cached_layers(request, LAYER_PATTERNS)
    request = request_without_draft(request, engine="vLLM",
                                    speculating=vr.speculative(request.pinned.values, request.pinned.argv),
                                    source="model_executor/models/utils.py:642-668 in 0.34.0")
    return plan_cpu(request) if request.device == "cpu" else plan_gpu(request)


@dataclass(frozen=True)
class _VllmSetup:
    rules: vr.VllmRules
    rules_note: str | None
    pinned: Mapping[str, Any]
    tp: int
    pp: int
    dtype: str
    dtype_reason: str
    kv_bytes_per_elem: int
    kv_reason: str
    block: int
    block_reason: str
    layout: KvLayout
    model_max_len: int
    model_max_len_reason: str
    parallel: vpar.Parallelism  # data and expert parallelism
    state_notes: tuple[str, ...] = ()


def _vllm_setup(request: PlanRequest, compute_capability: tuple[int, int] | None,
                gpu_name: str | None = None) -> _VllmSetup:
    rules, note = vr.rules_for(request.engine_version)
    pinned = request.pinned.values
    tp, pp = vr.ranks(pinned)
    geometry = request.model.geometry
    dtype, dtype_reason = resolve_dtype(geometry, compute_capability=compute_capability,
                                           device=request.device, pinned=pinned.get("--dtype"))
    dtype, dtype_reason = _without_fallback(rules, geometry, dtype, dtype_reason, pinned.get("--dtype"))
    # The engine's own start-time rules first: what it refuses is its refusal (exit 78).
    max_len, max_len_reason = vr.derived_max_model_len(geometry, rules=rules)
    refuse_what_vllm_refuses(start_checks(CheckInput(
        geometry=geometry, device=request.device, compute_capability=compute_capability,
        gpu_count=len(request.gpus), tp=tp, pp=pp, dtype=dtype, kv_cache_dtype=pinned.get("--kv-cache-dtype"),
        block_size=pinned.get("--block-size"), max_model_len=pinned.get("--max-model-len") or None,
        model_max_len=max_len, engine_version=request.engine_version, gpu_name=gpu_name,
        max_len_key=vr.max_len_key(geometry),
        allow_long_max_model_len=request.allow_long_max_model_len, quantization=pinned.get("--quantization"),
        pinned_dtype=pinned.get("--dtype"), nnodes=int(pinned.get("--nnodes", 1)),
        cpu_amx=request.host.cpu_amx if request.host else None, moe_backend=pinned.get("--moe-backend"),
        cpu_avx512=request.host.cpu_avx512 if request.host else None)))
    refuse_what_vllm_refuses(tuple(vpar.refusals(pinned, geometry, tp=tp, pp=pp, version=rules.version,
                                                  gpu_count=len(request.gpus) if request.device == "cuda" else None)))
    version = request.engine_version or rules.version
    refuse_what_vllm_refuses(tuple(vcp.refusals(pinned, geometry, tp=tp, version=version,
                                                 compute_capability=compute_capability)))
    vcp.refuse_unsized(pinned, geometry, device=request.device)
    parallel = vpar.parallelism(pinned, geometry, tp=tp, pp=pp, version=rules.version)
    moe_refusal = vb.mxfp4_backend_refusal(geometry, version=rules.version, moe_backend=pinned.get("--moe-backend"),
                                           compute_capability=compute_capability if request.device == "cuda" else None,
                                           lora=bool(pinned.get("--enable-lora")))
    if moe_refusal is not None:
        refuse_what_vllm_refuses((EngineRule("moe-backend", moe_refusal[0], moe_refusal[1],
                                             hint="--moe-backend auto (vLLM's own pick for this card)"),))
    try:
        kv_bytes, kv_reason = vk.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    block, block_reason = vk.block_size(geometry, device=request.device, compute_capability=compute_capability,
                                        pinned=pinned.get("--block-size"),
                                        cpu_amx=request.host.cpu_amx if request.host else None, rules=rules,
                                        kv_cache_dtype=pinned.get("--kv-cache-dtype"))
    if request.device == "cpu":
        _refuse_cpu_combinations(request, geometry, block, kv_bytes, rules, pinned.get("--block-size"))
    refuse_unsized_state(geometry, pp, rules.version)
    hybrid.refuse_pinned_state_dtype(geometry, pinned)
    model_bytes = vk.kv_dtype_bytes(None, dtype)[0]
    state = vk.hybrid_layout_for(geometry, block=block, kv_bytes=kv_bytes, model_dtype_bytes=model_bytes, tp=tp,
                                 device=request.device, pinned=pinned, rules=rules,
                                 cpu_amx=request.host.cpu_amx if request.host else None,
                                 cpu_avx512_bf16=request.host.cpu_avx512_bf16 if request.host else None,
                                 compute_capability=compute_capability)
    if state is not None:
        return _VllmSetup(rules, note, pinned, tp, pp, dtype, dtype_reason, kv_bytes, kv_reason, state.block,
                          state.block_reason, state.layout, max_len, max_len_reason, parallel, state.notes)
    layout = dataclasses.replace(vk.layout_for(geometry, block=block, kv_bytes=kv_bytes, tp=tp, pp=pp, pinned=pinned),
                                 context_shards=vcp.dcp_size(pinned))
    return _VllmSetup(rules, note, pinned, tp, pp, dtype, dtype_reason, kv_bytes, kv_reason, block, block_reason,
                      layout, max_len, max_len_reason, parallel)


def refuse_unsized_state(geometry: ModelGeometry, pp: int, version: str) -> None:
    """Hybrid models whose per-request state vLLM's table here does not size: refused, not guessed."""
    if not geometry.has_linear_layers and hybrid.family_of(geometry) is None:
        return
    linear = hybrid.state_layer_count(geometry)
    gone = removed_in(geometry.architecture)
    if gone is not None and version_key(version) >= version_key(gone):
        until = SUPPORTED_UNTIL[geometry.architecture]
        raise WontFit(f"vLLM refuses this at start: Model architecture {geometry.architecture} was supported in vLLM "
                      f"until v{until}, and is not supported anymore. Please use an older version of vLLM if you want "
                      "to use this model architecture. [vllm/model_executor/models/registry.py:1310-1318 "
                      "(vLLM 0.34.0)]", hint=f"vLLM {until} or earlier", rule="removed-architecture")
    if hybrid.family_of(geometry) is None or pp > 1:
        why = hybrid.UNSIZED.get(geometry.architecture, "safe-serve does not size that state yet")
        if pp > 1:
            why = "safe-serve does not size a state model's cache per pipeline stage yet"
        raise UnsupportedModel(
            f"{geometry.architecture} is a hybrid model ({linear} of {geometry.num_layers} layers keep a "
            f"linear-attention/Mamba state per request); {why}",
            hint="pin --kv-cache-memory-bytes, or pass --trust-engine")


def _without_fallback(rules: vr.VllmRules, geometry: ModelGeometry, dtype: str, reason: str,
                      pinned: str | None) -> tuple[str, str]:
    """Before 0.9.0 (`bf16_fallback` False) vLLM keeps a bf16 checkpoint's dtype on a GPU without bf16,
    and its start-time check refuses it; float32 checkpoints run in float16."""
    if rules.bf16_fallback or (pinned and pinned != "auto"):
        return dtype, reason
    config = geometry.config_dtype or "float32"
    if config in ("bfloat16", "bf16") and dtype != "bfloat16":
        return "bfloat16", f"config.json dtype bfloat16: vLLM {rules.version} has no fp16 fallback (added in 0.9.0)"
    if config in ("float32", "float") and dtype != "float16":
        return "float16", f"config dtype float32 runs in float16 on vLLM {rules.version} (vllm/config.py:2904)"
    return dtype, reason


def refuse_what_vllm_refuses(rules: tuple[EngineRule, ...]) -> None:
    """The first start-time rule vLLM would stop on, as a refusal (exit 78) before any budget;
    an argument its argparse refuses first, as a usage error (exit 2)."""
    refuse_bad_argument(rules, "vLLM")
    if rules:
        first = rules[0]
        others = f" (and {len(rules) - 1} more: {', '.join(r.rule for r in rules[1:])})" if len(rules) > 1 else ""
        message = " ".join(first.message.split())  # one line, whatever the engine's own layout
        raise WontFit(f"vLLM refuses this at start: {message}{others} [{first.source}]", hint=first.hint,
                      rule=first.rule, source=first.source)


def _refuse_cpu_combinations(request: PlanRequest, geometry: ModelGeometry, block: int, kv_bytes: int,
                             rules: vr.VllmRules, pinned_block: int | None) -> None:
    """Combinations the vLLM CPU backend accepts at start but cannot run (seen on the real engine,
    tests/data/vllm_cpu_truth.json and vllm_cpu_truth_versions.json)."""
    if uses_mla(geometry) and not rules.cpu_mla:
        raise WontFit(f"vLLM {rules.version} cannot run MLA models on CPU ('MLA is not supported on CPU', "
                      "vllm/platforms/cpu.py:83 in 0.27; 0.28's MLA prefill needs FlashAttention)",
                      hint="vLLM 0.29 or newer runs MLA on CPU", rule="cpu-mla")
    amx = request.host.cpu_amx if request.host else None
    unservable = cpu_unservable(geometry, kv_dtype_bytes=kv_bytes, cpu_amx=amx)  # MLA kernel limits
    if unservable:
        raise WontFit(unservable[0], hint=unservable[1], rule="cpu-kernel")
    state_failure = hybrid.cpu_failure(geometry, rules, amx, request.pinned.values,  # vllm_cpu_truth*.json
                                       request.host.cpu_avx512_bf16 if request.host else None)
    if state_failure:
        raise WontFit(state_failure, hint="serve it on a GPU", rule="cpu-kernel")
    if not rules.cpu_kernel_block_sizes:  # 0.19-0.20: no kernel block sizes to disagree with (rules.py)
        return
    multiple = rules.cpu_block_multiple
    if block % multiple and not uses_mla(geometry) and SLIDING not in geometry.layer_kinds:
        raise WontFit(f"--block-size {block}: vLLM's CPU attention needs a multiple of {multiple} and stops after "
                      f"sizing the cache ('No common block size for {block} (CPU_ATTN: [MultipleOf({multiple})])')",
                      hint=f"use --block-size {multiple * 2} or leave it unset (128)", rule="cpu-block-size")
    configured = pinned_block or CPU_BLOCK_SIZE
    if rules.cpu_sliding_block == 16 and all(k == SLIDING for k in geometry.layer_kinds) and configured % 32 == 0:
        # The worker picks its kernel from the configured block, the cache is cut in blocks of 16:
        # "cpu_attn.cpp:244 Check failed: input.block_size % attn_impl::BlockSizeAlignment == 0".
        raise WontFit(f"vLLM {rules.version} on CPU sizes this sliding-window model in blocks of 16 but runs the "
                      f"kernel for block {configured}: every request fails (cpu_attn.cpp:244)",
                      hint="pin --block-size 16", rule="cpu-sliding-kernel")


@dataclass(frozen=True)
class _Band:
    """The KV capacity at the two ends of the estimates' error band, by length."""

    low: Callable[[int], KvCapacity]  # the unfavourable end: every estimated term at its worst
    high: Callable[[int], KvCapacity]  # the favourable end


@dataclass(frozen=True)
class _Length:
    """The planned --max-model-len, the capacity there, and what holds at each end of the KV band."""

    value: int
    reason: str
    capacity: KvCapacity
    doubt: str | None = None
    at_risk: tuple[str, ...] = ()  # the figures a doubt is about, by their JSON names
    low_end: int | None = None  # the longest length carrying the concurrency at the band's low end (0: none)
    central: int | None = None  # ... at the central estimate


def _carries(request: PlanRequest, at: Callable[[int], KvCapacity]) -> Callable[[int], bool]:
    """Whether `request.concurrency` requests of a length fit, with vLLM's one spare block."""
    def fits(length: int) -> bool:
        cap = at(length)
        return bool(cap.fits_one_request and (cap.num_blocks - 1) / cap.blocks_per_request >= request.concurrency)
    return fits


def _band_lengths(request: PlanRequest, setup: _VllmSetup, capacity_at: Callable[[int], KvCapacity],
                  band: _Band | None) -> tuple[int, int]:
    """The longest lengths carrying the concurrency at the band's low end and at the central estimate."""
    central = largest_length(_carries(request, capacity_at), setup.model_max_len, setup.block)
    if band is None or central <= 0:
        return central, central
    # The low end carries no more than the centre: search below it.
    return largest_length(_carries(request, band.low), central, setup.block), central


def _vllm_length(request: PlanRequest, setup: _VllmSetup, capacity_at: Callable[[int], KvCapacity],
                 band: _Band | None = None, cause: str = "") -> _Length:
    """Keep a pinned --max-model-len, or choose the longest that carries `concurrency` requests
    at the low end of the KV estimate's error band.

    The safe side: vLLM refuses to start when one request of max_model_len needs more KV than it
    has (vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`, "the estimated maximum
    model length is N"), so the length the plan adds must hold when every estimated term lands at
    its unfavourable end. Only when nothing does is the central length kept, with the doubt
    said; a configuration is refused only when it fails at the favourable end too.
    """
    pinned_len = setup.pinned.get("--max-model-len")
    low_end, central = _band_lengths(request, setup, capacity_at, band)
    if pinned_len is not None and pinned_len > 0:
        # Above the model's maximum is start_checks' to decide (VLLM_ALLOW_LONG_MAX_MODEL_LEN).
        capacity = capacity_at(pinned_len)
        doubt, risk = _checked_in_band(request, capacity, pinned_len, band)
        return _Length(pinned_len, "pinned --max-model-len", capacity, doubt, risk, low_end, central)
    if pinned_len == -1:
        return _auto_length(request, setup, capacity_at, band)
    if low_end > 0:
        return _Length(low_end, _chosen_reason(request, setup, low_end, central), capacity_at(low_end),
                       low_end=low_end, central=central)
    if central > 0:
        low = band.low(central) if band is not None else capacity_at(central)
        doubt = (f"{request.concurrency} request(s) of {central} tokens fit at the central estimate "
                 f"({format_gib(capacity_at(central).kv_bytes)} KV) but not at the low end of its error band "
                 f"({format_gib(low.kv_bytes)}): vLLM refuses to start there ('estimated maximum model length "
                 f"is {low.estimated_max_model_len}', kv_cache_utils.py check_enough_kv_cache_memory)"
                 if not low.fits_one_request else
                 f"{request.concurrency} request(s) of {central} tokens fit at the central estimate "
                 f"({format_gib(capacity_at(central).kv_bytes)} KV); at the low end of its error band "
                 f"({format_gib(low.kv_bytes)}) only {max((low.num_blocks - 1) / low.blocks_per_request, 0):.2f} do")
        risk = ("max_model_len",) if not low.fits_one_request else ("max_concurrency",)
        return _Length(central, _chosen_reason(request, setup, central, central), capacity_at(central), doubt, risk,
                       0, central)
    return _favourable_length(request, setup, capacity_at, band, cause)


def _chosen_reason(request: PlanRequest, setup: _VllmSetup, length: int, central: int) -> str:
    if length == setup.model_max_len:
        return f"model maximum ({setup.model_max_len_reason})"
    if length < central:
        return (f"longest that fits {request.concurrency} request(s) at the low end of the KV band "
                f"(model maximum {setup.model_max_len})")
    return f"longest that fits {request.concurrency} request(s) (model maximum {setup.model_max_len})"


def _auto_length(request: PlanRequest, setup: _VllmSetup, capacity_at: Callable[[int], KvCapacity],
                 band: _Band | None) -> _Length:
    """--max-model-len auto: vLLM's own auto-fit sizes for ONE request (binary search on the KV
    check) from the KV it finds, so it never refuses the length; predict its answer at the centre
    and at the band's low end, then hold it to the concurrency asked for."""
    def predicted(at: Callable[[int], KvCapacity]) -> int:
        at_max = at(setup.model_max_len)
        return setup.model_max_len if at_max.fits_one_request else at_max.estimated_max_model_len

    length = predicted(capacity_at)
    if length <= 0:
        raise WontFit("vLLM will fail with 'Cannot auto-fit max_model_len': no KV room for a single token")
    low_length = predicted(band.low) if band is not None else length
    capacity = capacity_at(length)
    doubt, risk = _checked_in_band(request, capacity, length, band, low_length=low_length)
    return _Length(length, "vLLM auto-fit (pinned --max-model-len auto), predicted", capacity, doubt, risk,
                   max(low_length, 0), length)


def _favourable_length(request: PlanRequest, setup: _VllmSetup, capacity_at: Callable[[int], KvCapacity],
                       band: _Band | None, cause: str) -> _Length:
    """Nothing fits at the central estimate: the longest that fits at the favourable end, as a doubt,
    or the refusal."""
    length = largest_length(_carries(request, band.high), setup.model_max_len, setup.block) if band else 0
    if length > 0 and band is not None:
        doubt = (f"{request.concurrency} request(s) of {length} tokens fit only at the favourable end of the "
                 f"estimate's error band ({format_gib(capacity_at(length).kv_bytes)} KV at the central "
                 f"estimate, {format_gib(band.high(length).kv_bytes)} at best)")
        return _Length(length, _chosen_reason(request, setup, length, length), capacity_at(length), doubt,
                       ("max_model_len",), 0, 0)
    capacity = (band.high if band else capacity_at)(setup.block)
    raise WontFit(
        f"no KV room for {request.concurrency} request(s) of even {setup.block} tokens: "
        + (f"{format_gib(capacity.kv_bytes)} left for the KV cache" if capacity.kv_bytes >= 0 else
           f"{format_gib(-capacity.kv_bytes)} short of any KV cache")
        + (" at the favourable end of the estimate" if band is not None else "") + cause,
        rule="kv-capacity", figures={"kv_cache_bytes": capacity.kv_bytes, "concurrency": request.concurrency})


def _plus_minus(low: int, high: int) -> str:
    return f"+/- {format_gib(low)}" if low == high else f"-{format_gib(low)} / +{format_gib(high)}"


def _pinned_kv_fits(kv: int, available: int, error: int, favourable_error: int, flag: str) -> str | None:
    """A pinned KV size must fit what the weights, activations and graphs leave, or vLLM runs out
    of memory allocating it: refused beyond the band's favourable end (`favourable_error` above, less than
    `error` where the band is one-sided), doubted beyond its low end (`error` below)."""
    if kv <= available - error:
        return None
    message = (f"{flag}: {format_gib(kv)} of KV cache, but only ~{format_gib(max(available, 0))} is left after "
               "the weights, activations and CUDA graphs at the central estimate"
               + (f" ({format_gib(max(available - error, 0))} at the low end of its error band)" if error else "")
               + ": vLLM runs out of memory allocating it")
    if kv > available + favourable_error:
        raise WontFit(message, hint=f"lower {flag}", rule="pinned-kv")
    return message + (" (inside the estimate's error band)" if kv > available else " if the estimates land low")


def _checked_in_band(request: PlanRequest, capacity: KvCapacity, length: int, band: _Band | None,
                     low_length: int | None = None) -> tuple[str | None, tuple[str, ...]]:
    """(None, ()) when `length` holds at the low end of the KV band; else the doubt and the figure at
    risk: it fits at the central estimate only, or only at the favourable end; `WontFit` when it fails
    there too. `low_length`: the length checked at the low end (vLLM's auto-fit picks its own)."""
    try:
        _check_vllm_capacity(request, capacity, length)
    except WontFit as central:
        if band is None:
            raise
        try:
            _check_vllm_capacity(request, band.high(length), length)
        except WontFit as favourable:
            raise WontFit(f"{favourable.message} (at the favourable end of the estimate)", hint=favourable.hint,
                          rule=favourable.rule, figures=favourable.figures) from None
        risk = "max_model_len" if not capacity.fits_one_request else "max_concurrency"
        return f"{central.message} at the central estimate; it fits at the favourable end of the error band", (risk,)
    if band is None:
        return None, ()
    at_low = low_length if low_length is not None else length
    if at_low <= 0:
        return ("at the low end of the KV band vLLM's auto-fit finds no room for a single token ('Cannot auto-fit "
                "max_model_len'); it fits at the central estimate", ("max_model_len",))
    low = band.low(at_low)
    try:
        _check_vllm_capacity(request, low, at_low)
    except WontFit as unfavourable:
        one_fits = low.kv_bytes > 0 and low.fits_one_request
        return (f"at the low end of the KV band, {unfavourable.message}"
                + ("" if one_fits else " (vLLM refuses to start there)") + "; it fits at the central estimate",
                ("max_concurrency",) if one_fits else ("max_model_len",))
    return None, ()


def _check_vllm_capacity(request: PlanRequest, capacity: KvCapacity, length: int) -> None:
    if capacity.kv_bytes <= 0:
        raise WontFit(f"no memory left for the KV cache ({format_gib(capacity.kv_bytes)}): "
                      "vLLM fails with 'No available memory for the cache blocks'")
    if not capacity.fits_one_request:
        raise WontFit(
            f"max seq len {length} needs more KV cache than the {format_gib(capacity.kv_bytes)} available; "
            f"vLLM estimates the maximum model length at {capacity.estimated_max_model_len}",
            hint=f"--max-model-len {capacity.estimated_max_model_len} fits")
    usable = (capacity.num_blocks - 1) / capacity.blocks_per_request
    if usable < request.concurrency:
        bytes_per_block = capacity.kv_bytes // max(capacity.num_blocks, 1) if capacity.num_blocks else 0
        needed = (math.ceil(request.concurrency * capacity.blocks_per_request) + 1) * bytes_per_block
        raise WontFit(f"{request.concurrency} concurrent request(s) of {length} tokens need ~{format_gib(needed)} "
                      f"of KV cache: only {usable:.2f} fit in {format_gib(capacity.kv_bytes)}")


@dataclass(frozen=True)
class _Utilization:
    value: float
    source: str
    detail: str


@dataclass(frozen=True)
class VllmBudget:
    """vLLM's budget on the tightest rank at the planned length (bytes): each figure is a row."""

    total: int  # CUDA total
    requested: int  # ceil(total x utilization)
    weights: int  # per rank, less --cpu-offload-gb
    non_torch: int
    activation: int  # the profile run's peak plus the V2 runner's persistent state
    cudagraph: int
    kv: int
    kv_error: int  # - on kv: the sum of the estimated budget terms' errors (the layout does not enter)
    kv_error_high: int  # + on kv: the same less the one-sided terms (0.34's reservation growth)
    segments: int = 0  # torch's segments around the weights, counted from 0.27 (weight_segments.py)


@dataclass(frozen=True)
class _Sizing:
    """Everything the KV figure depends on besides the length; its methods give each term at a length."""

    setup: _VllmSetup
    geometry: ModelGeometry
    gpu_name: str
    defaults: vb.BatchDefaults
    utilization: float
    total: int
    free_at_init: int
    requested: int
    weights: int
    repack: int  # weights as loaded beyond the checkpoint's share (in weights): MXFP4 repacking, online fp8,
    # the rotary tables
    repack_rule: str
    repack_error: int  # +/- on repack: the MXFP4 layout the install may pick instead, online fp8's
    transformed: bool  # the checkpoint's tensors are changed while loading (not only tables added)
    non_torch: int
    non_torch_error: int
    cudagraph: int  # the graphs' estimate where the version subtracts it, else 0
    cudagraph_error: int
    graphs: vb.CudaGraphs  # none captured with --enforce-eager, -O0, cudagraph_mode NONE
    total_error: int
    verified: bool
    calibrated_non_kv: int | None  # an earlier start's non-KV bytes on the same key
    pinned_kv_bytes: int | None
    blocks_override: int | None
    extensible: bool = False  # 0.34's extensible KV cache: sized after warmup and capture (budget.py)
    kv_segments: int = 1  # layer segments its pages are committed in (granule rounding)
    rank_weights_how: str = ""  # how data/expert parallelism splits the checkpoint (parallel.py), if it does
    compute_capability: tuple[int, int] | None = None  # attention workspaces, MLA's v padding (extensible)
    flashinfer_sampler: bool | None = False  # the profile's sampler before 0.17 (vb.uses_flashinfer_sampler)
    fp8: str | None = None  # an FP8 checkpoint's input quantization where its forward was traced (vb.fp8_activations)
    # The multimodal flags that size the profile's dummy item, read once (vb.mm_limits, vb.mm_max_pixels).
    mm_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    mm_max_pixels: int | None = None
    vision_tp: int | None = None  # 1 under --mm-encoder-tp-mode data: the tower whole on each rank
    segments: vs.WeightSegments | None = None  # counted from 0.27 (weight_segments.py)
    compiled: bool = True  # Dynamo and Inductor compile the model (not --enforce-eager, -O0, mode NONE)

    @property
    def segment_bytes(self) -> int:
        return self.segments.bytes if self.segments is not None else 0

    def peak_at(self, length: int) -> tuple[int, int, vb.ProfilePeak]:
        """(batched tokens, sequences, the profile run's peak) at `length`."""
        pinned = self.setup.pinned
        batched, seqs = vb.resolve_batch(defaults=self.defaults, max_model_len=length,
                                         pinned_batched_tokens=pinned.get("--max-num-batched-tokens"),
                                         pinned_num_seqs=pinned.get("--max-num-seqs"),
                                         chunked_prefill=not pinned.get("--no-enable-chunked-prefill", False))
        peak = vb.profile_peak(self.geometry, rules=self.setup.rules, batched_tokens=batched, num_seqs=seqs,
                               tp=self.setup.tp, gpu_name=self.gpu_name,
                               act_dtype_bytes=ELEMENT_BYTES.get(self.setup.dtype, 2),
                               language_only=not vb.encoder_profiled(self.geometry, pinned),
                               dp=self.setup.parallel.dp, expert_parallel=self.setup.parallel.expert_parallel,
                               flashinfer_sampler=self.flashinfer_sampler, max_model_len=length,
                               mm_limits=self.mm_limits, mm_max_pixels=self.mm_max_pixels, vision_tp=self.vision_tp,
                               compiled_as_traced=self.compiled and not pinned.get("--quantization"),
                               moe_on_triton=vb.moe_runs_triton(self.compute_capability, pinned.get("--moe-backend"),
                                                                dp=self.setup.parallel.dp),
                               int4=vb.int4_gemm(self.geometry, tp=self.setup.tp,
                                                 compute_capability=self.compute_capability, gpu_name=self.gpu_name,
                                                 tokens=batched),
                               fp8=self.fp8)
        return batched, seqs, peak

    def activation_at(self, length: int) -> int:
        peak = self.peak_at(length)[2]
        return peak.total_bytes + peak.persistent_bytes

    def extensible_at(self, length: int) -> vb.ExtensibleKv:
        """0.34's `measure_kv_cache_bytes` at this length: T is the profile run's transient peak plus the
        graphs' estimate (gpu_worker.py:771-773, :944-948); what stays is everything else: the captured
        graphs, the profile's terms that persist (the MoE workspace, the fitted constant) and the attention
        backend's workspaces allocated after the profile run (`vb.post_profile_workspaces`)."""
        batched, seqs, peak = self.peak_at(length)
        kept = peak.persistent_bytes + sum(b for name, b in peak.terms if name in vb.PERSISTENT_PEAK_TERMS)
        workspaces = self.workspaces_at(length)[0]
        pinned = self.setup.pinned
        # The sizing warmup's steps at this length (budget.py sizing_step), from the same batch limits.
        step = vb.sizing_step(self.geometry, batched_tokens=batched, tp=self.setup.tp,
                              act_dtype_bytes=ELEMENT_BYTES.get(self.setup.dtype, 2),
                              max_logprobs=int(pinned.get("--max-logprobs", vb.DEFAULT_MAX_LOGPROBS)),
                              max_model_len=length, max_num_seqs=seqs, block=self.setup.block,
                              dcp=vcp.dcp_size(pinned), compute_capability=self.compute_capability, fp8=self.fp8)
        return vb.extensible_kv(requested=self.requested, free_at_init=self.free_at_init,
                                resident=self.weights + self.segment_bytes + self.non_torch + kept + self.cudagraph
                                + workspaces,
                                transient=peak.total_bytes - (kept - peak.persistent_bytes) + self.cudagraph,
                                step=step)

    def workspaces_at(self, length: int) -> tuple[int, str]:
        """(bytes, rule) of the attention workspaces vLLM allocates after the profile run, at this length."""
        return vb.post_profile_workspaces(self.geometry, compute_capability=self.compute_capability,
                                          tp=self.setup.tp, batched_tokens=self.peak_at(length)[0])

    def available_at(self, length: int) -> int:
        """What vLLM's own accounting leaves for the KV cache at this length (under the extensible KV cache
        no calibration reaches here: plan_gpu drops it)."""
        if self.extensible:
            return vb.extensible_pages(self.extensible_at(length).kv_bytes, segments=self.kv_segments)
        if self.pinned_kv_bytes is not None:
            # vLLM skips the profile's budget: the cache is the pinned bytes, on top of what
            # the weights, activations and graphs take from the free memory (gpu_worker.py:649).
            return self.free_at_init - self.weights - self.segment_bytes - self.non_torch \
                - self.activation_at(length) - self.cudagraph
        if self.calibrated_non_kv is not None:
            return self.requested - self.calibrated_non_kv
        return self.requested - self.weights - self.segment_bytes - self.non_torch - self.activation_at(length) \
            - self.cudagraph

    def kv_at(self, length: int) -> int:
        if self.pinned_kv_bytes is not None:
            return int(self.pinned_kv_bytes)
        if self.blocks_override is not None:  # vLLM allocates exactly that many blocks
            return int(self.blocks_override) * self.setup.layout.bytes_per_block
        return self.available_at(length)

    def available_error(self, length: int, *, favourable: bool = False) -> int:
        """- on what vLLM leaves for the KV cache (+ with `favourable`): the sum of the estimated terms' errors.
        One term only ever lowers it: 0.34 keeps max(T, G) free, and G (torch's reservation growth over the
        sizing steps, or T's own growth where the step is not derived) is never below the centre's T; the
        favourable end leaves it out."""
        capped_total = int(math.ceil(self.total_error * self.utilization))
        in_t = self.peak_at(length)[2].error_bytes + self.cudagraph_error  # the two estimates T is made of
        estimated = self.non_torch_error + self.repack_error + in_t \
            + (self.segments.error if self.segments is not None else 0)
        if not self.extensible:
            return capped_total + estimated
        # Below the cap the free memory at init bounds it: the whole total's error (a catalog card's free
        # memory is its total) and the CUDA context's. The graphs' estimate is counted twice (captured, and
        # in T), the margin follows T, and G may exceed it (or T grow, where the sizing step is not derived:
        # `sized.error_bytes`, budget.py extensible_kv); the band's ends lose up to
        # a granule per layer segment to the pages' rounding, as the centre does.
        sized = self.extensible_at(length)
        follows = vb.EXTENSIBLE_MARGIN_FRACTION if sized.margin > vb.EXTENSIBLE_MARGIN_FLOOR_BYTES else 0.0
        free_error = capped_total if sized.capped else self.total_error + vb.CONTEXT_ERROR_BYTES
        return (free_error + estimated + self.cudagraph_error + int(in_t * follows)
                + (0 if favourable else sized.error_bytes) + vb.EXTENSIBLE_GRANULE_BYTES * self.kv_segments)

    def bytes_error_at(self, length: int, *, favourable: bool = False) -> int:
        """+/- on the KV bytes vLLM reports: the sum of the estimated budget terms' errors (0 when none
        is estimated: pinned or calibrated). The KV layout does not enter: vLLM's figure is requested - non-KV."""
        if self.pinned_kv_bytes is not None or self.blocks_override is not None or self.calibrated_non_kv is not None:
            return 0
        return self.available_error(length, favourable=favourable)

    def kv_error_at(self, length: int, *, favourable: bool = False) -> int:
        """+/- on what the KV bytes hold, in bytes of a proven layout: the budget's error, and for an
        architecture whose layout is not proven a third of the bytes (its bytes per token may be off)."""
        unverified = 0 if self.verified else int(max(self.kv_at(length), 0) * UNVERIFIED_KV_ERROR_FRACTION)
        return self.bytes_error_at(length, favourable=favourable) + unverified

    def capacity_for(self, length: int, kv_bytes: int) -> KvCapacity:
        batched = self.peak_at(length)[0]
        return kv_capacity(self.setup.layout, kv_bytes, max_model_len=length,
                           tokens_from_concurrency=self.setup.rules.tokens_from_concurrency,
                           in_flight_tokens=vk.in_flight_tokens(
                               batched_tokens=batched, device="cuda", pp=self.setup.pp,
                               v2_runner=vr.uses_v2_runner(self.setup.rules, self.geometry.architecture)))

    def capacity_at(self, length: int) -> KvCapacity:
        return self.capacity_for(length, self.kv_at(length))

    def favourable_at(self, length: int) -> KvCapacity:
        return self.capacity_for(length, self.kv_at(length) + self.kv_error_at(length, favourable=True))

    def unfavourable_at(self, length: int) -> KvCapacity:
        return self.capacity_for(length, self.kv_at(length) - self.kv_error_at(length))

    def band(self) -> _Band:
        return _Band(low=self.unfavourable_at, high=self.favourable_at)

    def budget_at(self, length: int) -> VllmBudget:
        return VllmBudget(total=self.total, requested=self.requested, weights=self.weights,
                          non_torch=self.non_torch, activation=self.activation_at(length),
                          cudagraph=self.cudagraph, kv=self.kv_at(length), kv_error=self.bytes_error_at(length),
                          kv_error_high=self.bytes_error_at(length, favourable=True),
                          segments=self.segment_bytes)


def _batch_defaults(setup: _VllmSetup, gpu: GpuDevice) -> vb.BatchDefaults:
    defaults = vb.batch_defaults(nvml_total_bytes=gpu.total_bytes, gpu_name=gpu.name, device="cuda",
                                 world_size=setup.tp * setup.pp, b200_tier=setup.rules.b200_tier)
    return defaults.doubled() if setup.pinned.get("--performance-mode") == "throughput" else defaults


def _queued_beyond_max_num_seqs(request: PlanRequest, setup: _VllmSetup, defaults: vb.BatchDefaults,
                                warnings: list[str]) -> PlanRequest:
    """vLLM never runs more than max_num_seqs requests at once: the rest queue. Sizing the KV
    cache for more would only shorten every request for nothing."""
    pinned = setup.pinned
    running = int(pinned.get("--max-num-seqs", defaults.max_num_seqs))
    if request.concurrency <= running:
        return request
    source = "pinned --max-num-seqs" if "--max-num-seqs" in pinned else f"vLLM's default here ({defaults.reason})"
    warnings.append(f"--concurrency {request.concurrency}: vLLM runs at most {running} requests at once "
                    f"(max_num_seqs {running}, {source}); planned for {running}, the rest wait in the queue "
                    "(raise --max-num-seqs to run more)")
    return dataclasses.replace(request, concurrency=running)


def _cuda_graphs(request: PlanRequest, setup: _VllmSetup, defaults: vb.BatchDefaults,
                 gpu: GpuDevice) -> vb.CudaGraphs:
    """The graphs vLLM captures on a rank, in the mode the pinned flags leave (none with --enforce-eager
    or -O0), from the batch limits it runs with."""
    pinned = setup.pinned
    mode = graph_mode(GraphPins.from_pinned(pinned), enforce_eager=bool(pinned.get("--enforce-eager", False)),
                      version=request.engine_version or setup.rules.version)
    try:
        return vb.cuda_graphs(request.model.geometry, rules=setup.rules, version=request.engine_version,
                              layers=setup.layout.group_size * len(setup.layout.groups),
                              max_num_seqs=int(pinned.get("--max-num-seqs", defaults.max_num_seqs)),
                              max_num_batched_tokens=int(pinned.get("--max-num-batched-tokens",
                                                                    defaults.max_num_batched_tokens)),
                              compute_capability=gpu.compute_capability,
                              interactivity=pinned.get("--performance-mode") == "interactivity", mode=mode)
    except vb.CaptureSizesRefused as refused:
        refuse_what_vllm_refuses((EngineRule("cudagraph-capture-sizes", refused.message, refused.source,
                                             hint="pin the prefill and decode capture sizes within their "
                                                  "ceilings, and not beside the deprecated keys"),))
        raise  # unreachable: the refusal above raises


def _graphs_outside(graphs: vb.CudaGraphs) -> int:
    """Where the estimate is not subtracted, the graphs are captured after the KV cache from what vLLM
    did not request (gpu_worker.py compile_or_warm_up_model): keep their band's unfavourable end out."""
    if graphs.subtracted:
        return 0
    return graphs.estimate_bytes + graphs.error_bytes


def _utilization(request: PlanRequest, setup: _VllmSetup, gpu: GpuDevice, context: int,
                 graphs: vb.CudaGraphs, warnings: list[str], extensible: bool = False) -> _Utilization:
    """Pinned, or the most we can request from *free* memory (other tenants make vLLM refuse to
    start when free < total x utilization), capped by the engine default. Under 0.34's extensible KV
    cache the value is only a cap (1.0 by default); the same share of free memory is asked for, so that
    the cap leaves the margin to other tenants and vLLM still starts where it falls back to sizing
    before warmup."""
    cal, rules, total = request.calibration, setup.rules, gpu.usable_total_bytes
    default = vb.EXTENSIBLE_UTILIZATION if extensible else rules.default_utilization
    free = gpu.free_bytes or 0
    headroom = cal.extra_headroom_bytes if cal is not None else 0
    if "--gpu-memory-utilization" in setup.pinned:
        if headroom:
            warnings.append(f"a CUDA out-of-memory while serving was seen on this setup: the pinned "
                            f"--gpu-memory-utilization is kept; lower it by ~{format_gib(headroom)} to leave room")
        return _Utilization(setup.pinned["--gpu-memory-utilization"], PINNED, "pinned --gpu-memory-utilization")
    room = free - context - request.margin_bytes
    if request.max_gpu_memory_bytes is not None:
        room = min(room, request.max_gpu_memory_bytes - context)
    graphs_outside = _graphs_outside(graphs)
    room -= graphs_outside
    if extensible and "--kv-transfer-config" in setup.pinned:
        # Whether a KV connector keeps the extensible KV cache depends on the connector (config/vllm.py:
        # 3180-3262): the request stays at what sizing before warmup would take, where both fit.
        default = rules.default_utilization
        warnings.append(f"--kv-transfer-config: vLLM {rules.version} may size the KV cache before warmup for this "
                        f"connector; --gpu-memory-utilization is kept at most {default:g}, where both sizings fit")
    value = min(default, vb.utilization_for(max(room, 0), total))
    source = ENGINE_DEFAULT if value == default else FORMULA
    detail = (f"vLLM {rules.version} default" if source == ENGINE_DEFAULT
              else f"free {format_gib(free)} - context {format_gib(context)} - margin "
                   f"{format_gib(request.margin_bytes)}"
                   + (f" - CUDA graphs captured outside the request (up to {format_gib(graphs_outside)})"
                      if graphs_outside else "")
                   + (f" (capped at {format_gib(request.max_gpu_memory_bytes)}: --max-gpu-memory or preset)"
                      if request.max_gpu_memory_bytes else ""))
    if headroom:
        # A CUDA OOM while serving on this setup: request that much less, so the engine
        # leaves it free for runtime peaks (bounded in launcher.plan.calibration), and the
        # systemd restart loop converges instead of repeating.
        value = vb.utilization_for(max(vb.requested_bytes(total, value) - headroom, 0), total)
        source = CALIBRATED
        detail += f"; - {format_gib(headroom)} headroom after a runtime CUDA OOM on this setup"
    return _Utilization(value, source, detail)


def _refuse_no_room(request: PlanRequest, gpu: GpuDevice, context: int) -> None:
    free = gpu.free_bytes or 0
    if request.max_gpu_memory_bytes is not None and request.max_gpu_memory_bytes - context < free - context - \
            request.margin_bytes:
        cause = (f"--max-gpu-memory {format_gib(request.max_gpu_memory_bytes)} leaves nothing after the CUDA "
                 f"context ({format_gib(context)})")
    else:
        cause = (f"{format_gib(free)} free - CUDA context {format_gib(context)} - margin "
                 f"{format_gib(request.margin_bytes)} (--margin) leaves nothing")
    raise WontFit(f"{gpu.label}: no room for vLLM at all: {cause}", rule="no-room",
                  figures={"free_bytes": free, "context_bytes": context, "margin_bytes": request.margin_bytes,
                           "max_gpu_memory_bytes": request.max_gpu_memory_bytes})


def _load_peak_doubt(gpu: GpuDevice, sizing: _Sizing) -> str | None:
    """vLLM 0.27+ converts an AWQ checkpoint for Marlin after loading every layer, through int32 copies eight
    times each packed tensor (weight_segments.awq_marlin_replay): torch must find the weights and those copies
    in the memory free at start, whatever the utilization. Beyond it (and its error) the load runs out of
    memory ("Failed to load model - not enough GPU memory", gpu_model_runner.py load_model); inside the error,
    a doubt."""
    extra = sizing.segments.load_peak_extra if sizing.segments is not None else 0
    if not extra or sizing.weights >= sizing.requested:  # the weights alone do not fit: that refusal says so
        return None
    peak = sizing.weights + extra
    error = sizing.total_error + vb.CONTEXT_ERROR_BYTES
    what = (f"converting the AWQ checkpoint for Marlin after loading holds {format_gib(extra)} of int32 copies "
            f"beside the {format_gib(sizing.weights)} of weights ({format_gib(peak)}), with "
            f"~{format_gib(sizing.free_at_init)} free on {gpu.label} at start")
    if peak > sizing.free_at_init + error:
        raise WontFit(f"vLLM runs out of memory loading the model: {what}",
                      hint="add a GPU (--tensor-parallel-size) or stop the other processes on it", rule="load-peak")
    if peak > sizing.free_at_init - error:
        return f"{what}: within the free memory's error, the load may run out of memory"
    return None


def _startup_doubt(gpu: GpuDevice, utilization: float, requested: int, free_at_init: int,
                   setup: _VllmSetup, graphs: vb.CudaGraphs, extensible: bool = False) -> str | None:
    """vLLM refuses to start when it requests more than is free at init: refused beyond the
    CUDA context's error, doubted inside it. Not under 0.34's extensible KV cache, where the request
    is only a cap (v1/worker/utils.py:783-797)."""
    total = gpu.usable_total_bytes
    if extensible:
        return None
    if requested > free_at_init + vb.CONTEXT_ERROR_BYTES:
        raise WontFit(
            f"vLLM will refuse to start: free memory on {gpu.label} at start ~{format_gib(free_at_init)} is less "
            f"than --gpu-memory-utilization {utilization} x {format_gib(total)} = {format_gib(requested)}",
            hint="lower --gpu-memory-utilization or stop the other processes on the GPU")
    if requested > free_at_init:
        return (f"--gpu-memory-utilization {utilization} x {format_gib(total)} = {format_gib(requested)} is "
                f"above the ~{format_gib(free_at_init)} free at start by less than the CUDA context's "
                "error: vLLM may refuse to start")
    graphs_outside = _graphs_outside(graphs)
    if graphs_outside > free_at_init - requested:
        return (f"vLLM {setup.rules.version} captures CUDA graphs after sizing the KV cache, from the "
                f"~{format_gib(free_at_init - requested)} it did not request; they may take up to "
                f"{format_gib(graphs_outside)}: capture may run out of memory (--enforce-eager avoids it)")
    return None


def _gpu_sizing(request: PlanRequest, setup: _VllmSetup, gpu: GpuDevice, defaults: vb.BatchDefaults,
                utilization: float, context: int, verified: bool, graphs: vb.CudaGraphs,
                extensible: bool = False) -> _Sizing:
    """The length-independent terms: requested, weights, non-torch, graphs and their errors."""
    pinned, rules, tp, pp = setup.pinned, setup.rules, setup.tp, setup.pp
    offloaded = int(pinned.get("--cpu-offload-gb", 0) * GiB)  # vLLM keeps this much of each rank's weights on the host
    non_torch, non_torch_error = vb.non_torch_bytes(
        setup.parallel.reducing_ranks(bool(request.model.geometry.num_experts)), 1,
        since_019=version_key(rules.version) >= version_key("0.19"),
        graphs_profiled=graphs.count > 0 and (rules.graphs_profiled_in_budget or extensible),
        compute_capability=gpu.compute_capability)
    subtracted = graphs.subtracted
    cal = request.calibration
    parallel = setup.parallel
    # The experts' split (parallel.py): whole experts under expert parallelism, else their intermediate size
    # over every D x T rank.
    mxfp4 = vb.mxfp4_as_loaded(request.model.geometry, version=rules.version, tp=parallel.moe_tp, pp=pp,
                               compute_capability=gpu.compute_capability, moe_backend=pinned.get("--moe-backend"),
                               marlin_env=vb.marlin_env_set(request.engine_env, rules.version),
                               lora=bool(pinned.get("--enable-lora")))
    if parallel.expert_parallel and mxfp4.extra:
        share, of = vpar.experts_on_rank(parallel, request.model.geometry.num_experts or 1)
        mxfp4 = dataclasses.replace(mxfp4, extra=mxfp4.extra * share // of, error=mxfp4.error * share // of)
    repack, repack_rule = mxfp4.extra, mxfp4.rule
    online, online_error, online_rule = vb.online_quant_delta_bytes(
        request.model.geometry, quantization=pinned.get("--quantization"), checkpoint_bytes=request.model.weight_bytes,
        model_dtype=setup.dtype, version=request.engine_version or rules.version)
    # The change splits like the weights it changes (parallel.py): the experts' part by the rank's expert share.
    routed = vpar.routed_experts(request.model.geometry)
    experts_delta = vpar.quantized_experts_delta(
        routed, online, vb.ONLINE_FP8_BYTES_PER_ELEMENT.get(pinned.get("--quantization") or ""))
    repack += (vpar.rank_share(online, experts_delta, parallel, routed)
               if vpar.splits_experts(parallel, routed, request.model.weight_bytes) else online // (tp * pp))
    tables = vb.counted_rope_tables(request.model.geometry, dtype=setup.dtype,
                                    version=request.engine_version or rules.version)
    repack += tables.bytes
    mla = vb.mla_decode_weights(request.model.geometry, dtype=setup.dtype, tp=tp, pp=pp,
                                online_quantization=pinned.get("--quantization"))
    repack += mla.bytes
    rank_weights, rank_how = vpar.rank_weights(request.model.weight_bytes, parallel, routed, request.model.geometry)
    upcast, upcast_rule = vb.upcast_weights_delta(request.model.geometry, checkpoint_bytes=rank_weights,
                                                  model_dtype=setup.dtype, quantization=pinned.get("--quantization"))
    repack += upcast
    eplb, eplb_rule = vpar.eplb_bytes(parallel, routed, version=rules.version,
                                      checkpoint_bytes=request.model.weight_bytes, geometry=request.model.geometry)
    repack += eplb
    if online:
        # Dynamic per-token fp8 activations: the profile run also holds an fp8 copy of the widest linear
        # input, which the bf16-fitted peak does not count; kept in the band.
        geometry = request.model.geometry
        widest = max(geometry.hidden_size, (geometry.intermediate_size or 0) // tp)
        online_error += int(pinned.get("--max-num-batched-tokens", defaults.max_num_batched_tokens)) * widest * tp * pp
    # Decode context parallelism's gathers and workspaces: bounded, in the band (context_parallel.py).
    dcp_error, dcp_rule = vcp.workspace_bound(
        request.model.geometry, dcp=vcp.dcp_size(pinned), tp=tp, version=request.engine_version or rules.version,
        batched_tokens=int(pinned.get("--max-num-batched-tokens", defaults.max_num_batched_tokens)),
        dtype_bytes=vk.kv_dtype_bytes(None, setup.dtype)[0])
    segments = vs.weight_segments(request.model.geometry, element=ELEMENT_BYTES.get(setup.dtype, 2), tp=tp, pp=pp,
                                  rope=tables.bytes, compute_capability=gpu.compute_capability,
                                  quantization=pinned.get("--quantization"),
                                  experts_tp=None if parallel.expert_parallel else parallel.moe_tp) \
        if rules.budget_from_consumed else None
    return _Sizing(
        setup=setup, geometry=request.model.geometry, gpu_name=gpu.name, defaults=defaults, utilization=utilization,
        total=gpu.usable_total_bytes, free_at_init=(gpu.free_bytes or 0) - context,
        requested=vb.requested_bytes(gpu.usable_total_bytes, utilization),
        # vLLM's "Model loading took": the weights as its kernels hold them.
        weights=max(rank_weights - offloaded, 0) + repack, repack=repack, rank_weights_how=rank_how,
        transformed=repack != tables.bytes,
        repack_rule="; ".join(rule for rule in (repack_rule, online_rule, upcast_rule, eplb_rule,
                                                 f"rotary tables {format_gib(tables.bytes)}: {tables.rule}"
                                                 if tables.bytes else "",
                                                 f"{format_gib(mla.bytes)} {mla.rule}" if mla.bytes else "",
                                                 f"+/- {format_gib(dcp_error)}: {dcp_rule}" if dcp_error else "")
                             if rule),
        repack_error=online_error // (tp * pp) + mxfp4.error + dcp_error,
        non_torch=non_torch, non_torch_error=non_torch_error, graphs=graphs,
        cudagraph=graphs.estimate_bytes if subtracted else 0,
        cudagraph_error=graphs.error_bytes if subtracted else 0,
        total_error=gpu.usable_total_error_bytes,  # the spread of published totals, or of NVML's reserve
        verified=verified, calibrated_non_kv=cal.non_kv_bytes if cal is not None else None,
        pinned_kv_bytes=pinned.get("--kv-cache-memory-bytes"), blocks_override=pinned.get("--num-gpu-blocks-override"),
        extensible=extensible, kv_segments=max(setup.layout.group_size, 1), compute_capability=gpu.compute_capability,
        flashinfer_sampler=vb.uses_flashinfer_sampler(rules, request.engine_packages, request.engine_env,
                                                      pinned.get("--logprobs-mode")),
        fp8=vb.fp8_activations(request.model.geometry, compute_capability=gpu.compute_capability,
                               version=rules.version),
        mm_limits=vb.mm_limits(pinned), mm_max_pixels=vb.mm_max_pixels(pinned),
        vision_tp=1 if pinned.get("--mm-encoder-tp-mode") == "data" else None, segments=segments,
        compiled=compiles_model(GraphPins.from_pinned(pinned), enforce_eager=bool(pinned.get("--enforce-eager"))))


def _vision_note(peak: vb.ProfilePeak) -> tuple[str, ...]:
    """Where the vision tower's own forward is the profile's peak: what vLLM encodes, and how to shrink it."""
    beyond = dict(peak.terms).get("vision forward beyond", 0)
    if not beyond:
        return ()
    if peak.encoder_item == "video":
        smaller = ("--limit-mm-per-prompt '{\"video\": 0}', a shorter --max-model-len (fewer dummy frames) or a "
                   "smaller --mm-processor-kwargs max_pixels profiles a smaller item")
    elif peak.encoder_item == "fixed image":  # config.json fixes the size (Gemma 3, Mistral 3): only fewer of them
        smaller = ("a smaller --max-num-batched-tokens profiles fewer images (the encoder budget follows it, "
                   "config/scheduler.py:350-351, multimodal/encoder_budget.py:142-191)")
    else:
        smaller = "a smaller --mm-processor-kwargs max_pixels profiles a smaller item"
    return (f"vLLM's profile run encodes its largest dummy item before the language model runs, and that forward "
            f"is the activation peak ({format_gib(beyond)} above the language model's; {peak.encoder_rule}): "
            f"{smaller} (--skip-mm-profiling profiles none, and reserves nothing for it)",)


def _sampler_note(setup: _VllmSetup, peak: vb.ProfilePeak) -> tuple[str, ...]:
    """Before 0.17, where FlashInfer's sampler would run if installed beside vLLM and that is not known here."""
    if not peak.flashinfer_saves_bytes:
        return ()
    where = ("a FlashInfer older than 0.2.3 is installed beside it" if setup.rules.flashinfer_sampler == "below_0.2.3"
             else "FlashInfer is installed beside it (every vllm/vllm-openai image)")
    return (f"this vLLM profiles FlashInfer's top-k/top-p where {where}: not known here, so planned with the "
            f"sort, the larger peak; with "
            f"FlashInfer the KV cache is {format_gib(peak.flashinfer_saves_bytes)} more "
            "(v1/sample/ops/topk_topp_sampler.py; VLLM_USE_FLASHINFER_SAMPLER=0 keeps the sort)",)


def _extensible_headroom(request: PlanRequest, setup: _VllmSetup, gpu: GpuDevice, defaults: vb.BatchDefaults,
                         utilization: _Utilization, sizing: _Sizing, headroom: int, *, context: int,
                         verified: bool, graphs: vb.CudaGraphs) -> tuple[_Utilization, _Sizing]:
    """After a CUDA OOM while serving: under 0.34's extensible KV cache a smaller request alone frees nothing
    (vLLM's own margin binds first), so the cap goes below the free memory less that margin by the headroom,
    where it binds (extensible_kv_cache.py:609-612)."""
    margin = sizing.extensible_at(setup.model_max_len).margin
    room = sizing.free_at_init - margin - headroom
    value = min(utilization.value, vb.utilization_for(max(room, 0), gpu.usable_total_bytes))
    if value >= utilization.value:
        return utilization, sizing
    detail = (f"{utilization.detail}; under vLLM {setup.rules.version}'s extensible KV cache, below the free memory "
              f"less its margin {format_gib(margin)} by the {format_gib(headroom)} headroom")
    return (_Utilization(value, CALIBRATED, detail),
            _gpu_sizing(request, setup, gpu, defaults, value, context, verified, graphs, True))


# What turns 0.34's extensible KV cache off at config time, and vLLM's reason (config/vllm.py:3201-3217 in
# 0.34.0); asked for beside one of them, it refuses: "enable_extensible_kv_cache: <reason>." (:3262-3263).
_EXTENSIBLE_OFF = (
    ("--kv-cache-memory-bytes", "it sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides"),
    ("--num-gpu-blocks-override",
     "it sizes the KV cache from measured memory, which num_gpu_blocks_override overrides"),
    ("--enable-elastic-ep", "elastic EP scale-up skips warmup and reuses the profiled KV cache size, so no "
                            "measurement would size the cache"),
)


def _extensible(request: PlanRequest, setup: _VllmSetup) -> tuple[bool, str | None]:
    """Whether vLLM sizes the KV cache after warmup (0.34's extensible KV cache), and why not where the
    release has it (config/vllm.py:3180-3263 in 0.34.0): off by flag, by a pinned size or elastic EP, or
    where the driver cannot map memory virtually (WSL2, utils/vmm_driver.py:513-547)."""
    pinned = setup.pinned
    if not setup.rules.extensible_kv_cache:
        return False, None
    off = [(flag, reason) for flag, reason in _EXTENSIBLE_OFF if pinned.get(flag)]
    if off and pinned.get("--enable-extensible-kv-cache"):
        refuse_what_vllm_refuses((EngineRule(
            "extensible-kv-cache", f"enable_extensible_kv_cache: {off[0][1]}.",
            f"vllm/config/vllm.py:3262-3263 (vLLM {setup.rules.version})",
            hint=f"drop --enable-extensible-kv-cache or {off[0][0]}"),))
    if pinned.get("--no-enable-extensible-kv-cache"):
        return False, "the extensible KV cache is off (--no-enable-extensible-kv-cache): sized before warmup"
    if off:
        return False, f"the extensible KV cache is off ({off[0][0]}: {off[0][1]}): sized before warmup"
    if request.vmm_unavailable:
        # Found by the workers at start, even when asked for: a warning, then the estimate-based sizing
        # (v1/engine/core.py:308-313, v1/executor/abstract.py:163-181).
        return False, (f"the extensible KV cache is off ({request.vmm_unavailable}; vLLM warns \"Disabling the "
                       f"extensible KV cache\"): sized before warmup, at {setup.rules.default_utilization:g} by "
                       "default")
    return True, (f"extensible KV cache (vLLM {setup.rules.version} default on CUDA): the KV cache is the memory "
                  "free after warmup and CUDA-graph capture, less max(1 GiB, 0.75 T) and T, the profiled transient "
                  "peak plus the graphs' estimate (v1/worker/extensible_kv_cache.py:592-617)")


def _talking_ranks(setup: _VllmSetup, geometry: ModelGeometry) -> int:
    """The ranks NCCL connects a rank with (its context and buffers): T x P, and a MoE model's DP and EP groups
    count like more tensor-parallel ranks (parallel.py)."""
    return setup.parallel.communicating_ranks(bool(geometry.num_experts))


def _devices(request: PlanRequest, tp: int, pp: int) -> tuple[GpuDevice, ...]:
    """The GPUs this node's ranks take: P x T for each data-parallel rank on it (parallel.py). Too few for
    the DP ranks is vLLM's own refusal (`vpar.refusals`), so then only the first rank's are taken here."""
    pinned = request.pinned.values
    ranks, nnodes = vpar.node_ranks(pinned, tp=tp, pp=pp)
    if ranks > tp * pp and len(request.gpus) >= ranks // max(nnodes, 1):
        return rank_devices(request, ranks, nnodes, tp_flag=vr.TP_FLAG, kind="tensor x pipeline x data parallel")
    return rank_devices(request, tp * pp, pinned.get("--nnodes", 1), tp_flag=vr.TP_FLAG)


def plan_gpu(request: PlanRequest) -> Plan:
    """Devices, setup, batch defaults, utilization, the terms, the length, then the table."""
    # Parallelism picks the devices, whose compute capability then sets dtype and block size.
    pinned = request.pinned.values
    tp, pp = vr.ranks(pinned)
    devices = _devices(request, tp, pp)
    gpu = tightest(devices)
    setup = _vllm_setup(request, gpu.compute_capability, gpu.name)
    context = vb.context_bytes(_talking_ranks(setup, request.model.geometry), 1)
    defaults = _batch_defaults(setup, gpu)
    warnings = not_modelled_warnings(pinned, vr.NOT_MODELLED) + vpar.warnings(setup.parallel)
    request = _queued_beyond_max_num_seqs(request, setup, defaults, warnings)
    graphs = _cuda_graphs(request, setup, defaults, gpu)
    extensible, extensible_note = _extensible(request, setup)
    if extensible and request.calibration is not None and request.calibration.non_kv_bytes is not None:
        # An earlier start's non-KV figure assumed a cache sized from the request; this one follows the free
        # memory after warmup (VllmMeasurements records none for it).
        request = dataclasses.replace(request, calibration=dataclasses.replace(request.calibration, non_kv_bytes=None))
    utilization = _utilization(request, setup, gpu, context, graphs, warnings, extensible)
    if utilization.value <= 0:
        _refuse_no_room(request, gpu, context)
    verified, architecture_note = architecture_status(request.model.geometry)
    sizing = _gpu_sizing(request, setup, gpu, defaults, utilization.value, context, verified, graphs, extensible)
    headroom = request.calibration.extra_headroom_bytes if request.calibration is not None else 0
    if extensible and headroom and "--gpu-memory-utilization" not in setup.pinned:
        utilization, sizing = _extensible_headroom(request, setup, gpu, defaults, utilization, sizing, headroom,
                                                   context=context, verified=verified, graphs=graphs)
    # In vLLM's order: the request against the free memory at init, then loading (which may refuse alone).
    init_doubt = _startup_doubt(gpu, utilization.value, sizing.requested, sizing.free_at_init, setup, graphs,
                                extensible)
    startup_doubt = "; ".join(doubt for doubt in (init_doubt, _load_peak_doubt(gpu, sizing)) if doubt) or None
    if not verified:
        warnings.append(architecture_note)
    if vb.encoder_profiled(request.model.geometry, pinned) and not vb.vision_forward_derived(request.model.geometry):
        warnings.append(f"vLLM's profile run encodes dummy items with {request.model.geometry.architecture}'s own "
                        "tower before the language model runs; that forward is not derived here (the plan counts "
                        "what stays: the encoder outputs and dummy pixels): where it is the larger peak, vLLM keeps "
                        "more out of the KV cache (Qwen2.5-VL's: 17.2 GiB for one 114,688-token dummy video at "
                        "128,000 tokens)")
    chosen = _vllm_length(request, setup, sizing.capacity_at, sizing.band(), _weights_cause(sizing))
    length, capacity, doubt, at_risk = chosen.value, chosen.capacity, chosen.doubt, chosen.at_risk
    if sizing.pinned_kv_bytes is not None or sizing.blocks_override is not None:
        flag = "--kv-cache-memory-bytes" if sizing.pinned_kv_bytes is not None else "--num-gpu-blocks-override"
        kv_doubt = _pinned_kv_fits(sizing.kv_at(length), sizing.available_at(length), sizing.available_error(length),
                                   sizing.available_error(length, favourable=True), flag)
        doubt = "; ".join(d for d in (doubt, kv_doubt) if d) or None
        at_risk += (flag.lstrip("-").replace("-", "_"),) if kv_doubt else ()
    if startup_doubt:
        at_risk = ("gpu_memory_utilization", *at_risk)
    budget = sizing.budget_at(length)
    peak = sizing.peak_at(length)[2]
    if not verified:
        warnings.append(f"KV tokens +/- {UNVERIFIED_KV_ERROR_FRACTION:.0%} (the layout is not proven); the KV bytes "
                        f"{format_gib(budget.kv)} {_plus_minus(budget.kv_error, budget.kv_error_high)} "
                        "do not depend on it")
    knob = (MemoryKnob("--kv-cache-memory-bytes", int(sizing.pinned_kv_bytes), "bytes",
                       f"--kv-cache-memory-bytes {format_gib(int(sizing.pinned_kv_bytes))} (pinned; utilization "
                       "ignored)", "pinned --kv-cache-memory-bytes")
            if sizing.pinned_kv_bytes is not None else
            MemoryKnob("--gpu-memory-utilization", utilization.value, "fraction",
                       f"--gpu-memory-utilization {utilization.value:g}", utilization.detail))
    return Plan(
        engine="vllm", engine_version=request.engine_version or vr.NEWEST, rules_version=setup.rules.version,
        device="cuda", model=request.model.name, max_model_len=length, max_model_len_source=chosen.reason,
        kv_cache_bytes=budget.kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=_gpu_items(request, sizing, gpu, utilization, length, capacity, context),
        engine_args=tuple(_gpu_args(pinned, utilization.value, length)), engine_env={}, pinned=dict(pinned),
        tp=tp, pp=pp, knob=knob, block_size=setup.block, num_blocks=capacity.num_blocks,
        engine_figures={"gpu_memory_utilization": None if sizing.pinned_kv_bytes is not None else utilization.value},
        gpu_name=gpu.name, gpu_count=len(devices),
        notes=(*_gpu_notes(setup, request.calibration), *((extensible_note,) if extensible_note else ()),
               *_sampler_note(setup, peak), *_vision_note(peak)),
        engine_version_assumed=request.engine_version_assumed,
        kv_cache_bytes_low=budget.kv - budget.kv_error,
        kv_cache_bytes_high=budget.kv + budget.kv_error_high,
        may_not_fit="; ".join(d for d in (startup_doubt, doubt) if d) or None, at_risk=at_risk,
        max_model_len_low_end=chosen.low_end, max_model_len_central=chosen.central, warnings=tuple(warnings),
        architecture_verified=verified, kv_sized_after_warmup=extensible,
        engine_defaults={"gpu_memory_utilization": vb.EXTENSIBLE_UTILIZATION if extensible
                         else setup.rules.default_utilization,
                         "max_num_batched_tokens": defaults.max_num_batched_tokens,
                         "max_num_seqs": defaults.max_num_seqs},
    )


def _weights_cause(sizing: _Sizing) -> str:
    if sizing.weights < sizing.requested:
        return ""
    return (f": the weights alone ({format_gib(sizing.weights)} per rank) exceed the {format_gib(sizing.requested)} "
            f"vLLM requests at --gpu-memory-utilization {sizing.utilization:g}")


def _gpu_args(pinned: Mapping[str, Any], utilization: float, length: int) -> list[str]:
    """The flags the launch adds: only those the operator left unset."""
    args: list[str] = []
    if "--gpu-memory-utilization" not in pinned and "--kv-cache-memory-bytes" not in pinned:
        args += ["--gpu-memory-utilization", f"{utilization:g}"]
    if "--max-model-len" not in pinned:
        args += ["--max-model-len", str(length)]
    return args


def _gpu_notes(setup: _VllmSetup, cal: Calibration | None) -> list[str]:
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    notes += setup.state_notes
    if cal is not None and cal.non_kv_bytes is not None:
        notes.append(f"non-KV memory from an earlier start of the same configuration ({cal.key})")
    if setup.layout.padding_layers:
        notes.append(f"vLLM pads {setup.layout.padding_layers} layer(s) to even KV groups")
    if setup.layout.context_shards > 1:
        notes.append(vcp.note(setup.layout.context_shards, setup.layout.block_size))
    return notes


def _gpu_items(request: PlanRequest, sizing: _Sizing, gpu: GpuDevice, utilization: _Utilization, length: int,
               capacity: KvCapacity, context: int) -> tuple[BudgetItem, ...]:
    """The table: one row per term of `VllmBudget`, with where each figure comes from."""
    setup, model = sizing.setup, request.model
    budget = sizing.budget_at(length)
    items = [
        _total_item(gpu, budget.total, sizing.total_error),
        BudgetItem("other", "held by others", max(gpu.usable_total_bytes - (gpu.free_bytes or 0), 0),
                   MEASURED if gpu.source == "nvml" else CATALOG, tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", context, FORMULA,
                   "before vLLM's init snapshot; only tightens the startup check", bar="other"),
        BudgetItem("requested", f"requested = ceil(total x {utilization.value:g})", budget.requested,
                   utilization.source, utilization.detail),
        BudgetItem("weights", "weights (per rank)", budget.weights,
                   COMPUTED if sizing.transformed or sizing.rank_weights_how else weights_source(model),
                   model.weight_bytes_source
                   + (f": {sizing.rank_weights_how}" if sizing.rank_weights_how
                      else f" / {setup.tp * setup.pp} ranks" if setup.tp * setup.pp > 1 else "")
                   + _offload_detail(setup)
                   + (f", {'+' if sizing.repack > 0 else '-'} {format_gib(abs(sizing.repack))} as loaded "
                      f"({sizing.repack_rule})" if sizing.repack else f"; {sizing.repack_rule}" if sizing.repack_rule
                      else ""),
                   bar="weights", error_bytes=sizing.repack_error),
        *_segments_items(sizing),
        _non_torch_item(sizing),
        _activation_item(sizing, length),
        _cudagraph_item(sizing),
        *_kept_free_items(sizing, length, budget.kv),
        _kv_item(sizing, budget.kv, capacity),
        BudgetItem("free", "left free", max(sizing.free_at_init - budget.requested, 0), FORMULA,
                   "not requested by vLLM: margin for other tenants", bar="free"),
    ]
    cal = request.calibration
    if cal is not None and cal.non_kv_bytes is not None:
        # The engine's own measurement replaces our estimates; the rows still add up.
        estimates = ("segments", "non_torch", "activation", "cudagraph")
        items = [i for i in items if i.key not in estimates]
        items.insert(-2, BudgetItem("measured_non_kv", "non-KV besides weights", cal.non_kv_bytes - budget.weights,
                                    CALIBRATED, f"measured by vLLM at an earlier start ({cal.key})",
                                    bar="activations"))
    return tuple(items)


def _total_item(gpu: GpuDevice, total: int, error: int) -> BudgetItem:
    if gpu.size_given:  # --gpu 80GB: the operator's figure, not a card's published total
        return BudgetItem("total", "GPU total (CUDA)", total, PINNED,
                          "cudaMemGetInfo total (the --gpu size given, taken as the CUDA total)", error_bytes=error)
    why = {"cuda driver": " (measured here: the CUDA driver's cuDeviceTotalMem)",
           "catalog": f" (catalog: {gpu.cuda_total_why or 'published totals for this card'})",
           "nvml reserved": " = NVML total - driver reserve",
           "typical reserve": " ~ NVML total - the typical driver reserve (not measured for this GPU)"}
    return BudgetItem("total", "GPU total (CUDA)", total, CATALOG if gpu.source == "catalog" else MEASURED,
                      "cudaMemGetInfo total" + why[gpu.usable_total_source], error_bytes=error)


def _offload_detail(setup: _VllmSetup) -> str:
    offloaded = int(setup.pinned.get("--cpu-offload-gb", 0) * GiB)
    return f", less {format_gib(offloaded)} --cpu-offload-gb" if offloaded else ""


def _segments_items(sizing: _Sizing) -> tuple[BudgetItem, ...]:
    """From 0.27 the budget counts what torch reserves around the weights (weight_segments.py)."""
    segments = sizing.segments
    if segments is None:
        return ()
    return (BudgetItem("segments", "allocator segments", segments.bytes, COMPUTED if segments.derived else FORMULA,
                       f"torch's caching allocator around the weights, counted from vLLM 0.27 (non-KV = memory "
                       f"consumed + transient peak, utils/mem_utils.py:317-326): {segments.rule}", bar="weights",
                       error_bytes=segments.error),)


def _non_torch_item(sizing: _Sizing) -> BudgetItem:
    parallel = sizing.setup.tp * sizing.setup.pp > 1
    return BudgetItem("non_torch", "non-torch after snapshot", sizing.non_torch, FORMULA,
                      "cuBLAS, allocator" + (", NCCL and all-reduce buffers" if parallel else "")
                      + ("; vLLM 0.19 H100 logs 2.07-2.10 GiB (symmetric-memory all-reduce)"
                         if sizing.non_torch == vb.NON_TORCH_BYTES_TP_V019 else
                         "; published logs 0.34-0.43 GiB per rank" if parallel else
                         "; with the CUDA-graph profile's own: vLLM 0.18-0.19 logs 0.25-0.27 GiB"
                         if sizing.non_torch == vb.NON_TORCH_BYTES_TP1_V019 else
                         "; no CUDA-graph profile inside the measurement: vLLM 0.15-0.17 logs 0.13 GiB"),
                      bar="other", error_bytes=sizing.non_torch_error)


def _activation_item(sizing: _Sizing, length: int) -> BudgetItem:
    batched, seqs, peak = sizing.peak_at(length)
    return BudgetItem("activation", f"activation ({peak.runner} profile run)", sizing.activation_at(length), FORMULA,
                      f"{peak.describe()} at {batched} batched tokens, {min(seqs, batched)} sampler rows "
                      f"({sizing.defaults.reason})"
                      + (f"; + penalty state {format_gib(peak.persistent_bytes)}" if peak.persistent_bytes else "")
                      + (f"; {peak.forward_rule}" if peak.forward_rule else "")
                      + (f"; multimodal profile: {peak.encoder_rule}" if peak.encoder_rule else ""),
                      bar="activations", error_bytes=peak.error_bytes)


def _cudagraph_item(sizing: _Sizing) -> BudgetItem:
    cudagraph, rules, graphs = sizing.cudagraph, sizing.setup.rules, sizing.graphs
    if not graphs.count:
        detail = graphs.describe()
    elif not graphs.subtracted:
        detail = (f"not subtracted by vLLM {rules.version} (no estimate: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS "
                  "off, or the V2 runner before 0.29); captured after the KV cache: " + graphs.describe())
    else:
        detail = graphs.describe()
    source = FORMULA if cudagraph else (PINNED if graphs.mode_reason else ENGINE_DEFAULT)
    return BudgetItem("cudagraph", "CUDA graph estimate", cudagraph, source,
                      detail, bar="graphs", error_bytes=sizing.cudagraph_error)


def _kept_free_items(sizing: _Sizing, length: int, kv: int) -> tuple[BudgetItem, ...]:
    """0.34's extensible KV cache keeps T (the transient peak, the graphs' estimate in it again) and a margin
    free, or stops at the utilization's cap: the row that makes the table add up to the request."""
    if not sizing.extensible:
        return ()
    sized, budget = sizing.extensible_at(length), sizing.budget_at(length)
    counted = budget.weights + budget.segments + budget.non_torch + budget.activation + budget.cudagraph + kv
    limit = (f"the --gpu-memory-utilization cap binds ({format_gib(sizing.requested)})" if sized.capped else
             f"margin max(1 GiB, 0.75 x T) = {format_gib(sized.margin)} below the free memory")
    workspaces, rule = sizing.workspaces_at(length)
    held = f"; {rule} {format_gib(workspaces)}" if workspaces else ""
    step = sized.step
    t_rule = ("T = max(activation peak + graphs' estimate, the sizing warmup's steps "
              f"{format_gib(step.bytes)} ({step.phase}))" if step is not None else
              "T = activation peak + graphs' estimate")
    g_rule = (f"; torch's reservation growth over those steps up to {vb.EXTENSIBLE_RESERVE_GROWTH:.0%} above their "
              "peak in the band (warmup.py:452-477)" if step is not None else
              f"; T up to {vb.EXTENSIBLE_TRANSIENT_GROWTH:.0%} higher in the band (a warmup step not derived here)")
    return (BudgetItem("kept_free", "kept free after warmup", budget.requested - counted, FORMULA,
                       f"vLLM {sizing.setup.rules.version} extensible KV cache: {t_rule} "
                       f"= {format_gib(sized.transient)} kept for transients{g_rule}; {limit}{held}; KV pages in "
                       f"whole {vb.EXTENSIBLE_GRANULE_BYTES >> 20} MiB granules per layer "
                       "(v1/worker/extensible_kv_cache.py:592-617, :305-318)", bar="activations",
                       error_bytes=sized.error_bytes),)


def _kv_item(sizing: _Sizing, kv: int, capacity: KvCapacity) -> BudgetItem:
    layout = sizing.setup.layout
    pinned = sizing.pinned_kv_bytes is not None or sizing.blocks_override is not None
    return BudgetItem("kv", "KV cache", kv, PINNED if pinned else
                      (CALIBRATED if sizing.calibrated_non_kv is not None else FORMULA),
                      f"{capacity.num_blocks} blocks x {layout.bytes_per_block} B "
                      f"({layout.group_size} layers x {layout.page_bytes} B page, block {sizing.setup.block})",
                      bar="kv")


# --------------------------------------------------------------------------- vLLM on CPU


@dataclass(frozen=True)
class _CpuSpace:
    """The CPU KV cache: VLLM_CPU_KVCACHE_SPACE whole GiB (None: pinned bytes) and why."""

    gib: int | None
    kv_bytes: int
    source: str
    detail: str


def _cpu_activation_at(request: PlanRequest, setup: _VllmSetup, defaults: vb.BatchDefaults,
                       length: int) -> tuple[int, int]:
    """(batched tokens, host RAM the activations take) at `length`."""
    batched, seqs = vb.resolve_batch(defaults=defaults, max_model_len=length,
                                     pinned_batched_tokens=setup.pinned.get("--max-num-batched-tokens"),
                                     pinned_num_seqs=setup.pinned.get("--max-num-seqs"))
    return batched, vb.cpu_activation_peak_bytes(request.model.geometry, batched_tokens=batched,
                                                 num_seqs=min(seqs, batched), tp=setup.tp)


def _cpu_capacity(request: PlanRequest, setup: _VllmSetup, defaults: vb.BatchDefaults, kv_bytes: int,
                  length: int) -> KvCapacity:
    batched = _cpu_activation_at(request, setup, defaults, length)[0]
    return kv_capacity(setup.layout, kv_bytes, max_model_len=length,
                       tokens_from_concurrency=setup.rules.tokens_from_concurrency,
                       in_flight_tokens=vk.in_flight_tokens(batched_tokens=batched, device="cpu", pp=setup.pp))


def _cpu_space(request: PlanRequest, setup: _VllmSetup, defaults: vb.BatchDefaults, host: HostMemory) -> _CpuSpace:
    """VLLM_CPU_KVCACHE_SPACE from the environment, a pinned --kv-cache-memory-bytes, or what the
    requests need (whole GiB, at least 1), not the whole host."""
    pinned = setup.pinned
    env_space = request.engine_env.get("VLLM_CPU_KVCACHE_SPACE")
    if env_space not in (None, ""):
        try:
            space_gib = int(env_space)
        except ValueError:
            raise UsageError(f"VLLM_CPU_KVCACHE_SPACE={env_space!r}: vLLM needs whole GiB") from None
        return _CpuSpace(space_gib, space_gib * GiB, PINNED, "VLLM_CPU_KVCACHE_SPACE from the environment")
    if "--kv-cache-memory-bytes" in pinned:
        return _CpuSpace(None, pinned["--kv-cache-memory-bytes"], PINNED, "pinned --kv-cache-memory-bytes")
    room = host.available_bytes - request.model.weight_bytes - request.margin_bytes
    if request.max_gpu_memory_bytes is not None:
        room = min(room, request.max_gpu_memory_bytes - request.model.weight_bytes)
    pinned_len = pinned.get("--max-model-len")
    target_len = pinned_len if pinned_len and pinned_len > 0 else setup.model_max_len
    batched, activation = _cpu_activation_at(request, setup, defaults, target_len)
    needed = setup.layout.bytes_per_block * (math.ceil(request.concurrency * setup.layout.blocks_per_request(
        target_len, vk.in_flight_tokens(batched_tokens=batched, device="cpu", pp=setup.pp))) + 1)
    most = max((room - activation) // GiB, 0)
    space_gib = max(1, min(math.ceil(needed / GiB), most))
    detail = (f"enough for {request.concurrency} x {target_len} tokens" if space_gib * GiB >= needed
              else f"all the host can spare ({format_gib(room)} after weights and margin)")
    return _CpuSpace(space_gib, space_gib * GiB, FORMULA, detail)


def plan_cpu(request: PlanRequest) -> Plan:
    """KV space is VLLM_CPU_KVCACHE_SPACE whole GiB; weights and activations share host RAM."""
    model = request.model
    setup = _vllm_setup(request, None)
    host = request.host
    if host is None:
        raise WontFit("host memory unknown: cannot plan the CPU backend")
    defaults = vb.batch_defaults(nvml_total_bytes=None, gpu_name="cpu", device="cpu", world_size=setup.tp * setup.pp)
    space = _cpu_space(request, setup, defaults, host)
    kv = space.kv_bytes

    def capacity_at(length: int) -> KvCapacity:
        return _cpu_capacity(request, setup, defaults, kv, length)

    chosen = _vllm_length(request, setup, capacity_at)
    length, length_reason, capacity = chosen.value, chosen.reason, chosen.capacity
    batched, activation = _cpu_activation_at(request, setup, defaults, length)
    weights = model.weight_bytes
    if weights + activation + kv + request.margin_bytes > host.available_bytes:
        raise WontFit(
            f"host RAM: weights {format_gib(weights)} + activations {format_gib(activation)} + KV {format_gib(kv)} "
            f"exceed the {format_gib(host.available_bytes)} available",
            hint="lower VLLM_CPU_KVCACHE_SPACE or --max-model-len")
    from_env = request.engine_env.get("VLLM_CPU_KVCACHE_SPACE") not in (None, "")
    env = {} if from_env or space.gib is None else {"VLLM_CPU_KVCACHE_SPACE": str(space.gib)}
    items = (
        BudgetItem("total", "host RAM available", host.available_bytes, MEASURED,
                   "psutil available" + (", cgroup limit applied" if host.cgroup_limit_bytes else "")),
        BudgetItem("weights", "weights", weights, weights_source(model), model.weight_bytes_source, bar="weights"),
        BudgetItem("activation", "activation peak", activation, FORMULA,
                   f"{batched} batched tokens ({defaults.reason})", bar="activations"),
        BudgetItem("kv", "KV cache (VLLM_CPU_KVCACHE_SPACE)", kv, space.source,
                   f"{space.detail}; {capacity.num_blocks} blocks x {setup.layout.bytes_per_block} B, "
                   f"block {setup.block}", bar="kv"),
        BudgetItem("free", "left free", max(host.available_bytes - weights - activation - kv, 0), FORMULA,
                   "host RAM not planned for", bar="free"),
    )
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    notes += setup.state_notes
    verified, architecture_note = architecture_status(model.geometry)
    knob = (MemoryKnob("VLLM_CPU_KVCACHE_SPACE", space.gib, "GiB", f"VLLM_CPU_KVCACHE_SPACE={space.gib}",
                       space.detail) if space.gib is not None else
            MemoryKnob("--kv-cache-memory-bytes", kv, "bytes", f"--kv-cache-memory-bytes {format_gib(kv)} (pinned)",
                       space.detail))
    return Plan(
        engine="vllm", engine_version=request.engine_version or vr.NEWEST, rules_version=setup.rules.version,
        device="cpu", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=items, engine_args=tuple([] if "--max-model-len" in setup.pinned else ["--max-model-len", str(length)]),
        engine_env=env, pinned=dict(setup.pinned), tp=setup.tp, pp=setup.pp,
        knob=knob, engine_figures={"cpu_kvcache_space_gib": space.gib},
        block_size=setup.block, num_blocks=capacity.num_blocks,
        gpu_name="cpu", gpu_count=0, notes=tuple(notes), architecture_verified=verified,
        warnings=() if verified else (architecture_note,),
        engine_version_assumed=request.engine_version_assumed,
    )


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; vLLM sizes itself."""
    request = request_with_cached_layers(request, LAYER_PATTERNS)
    pinned = request.pinned.values
    rules, _ = vr.rules_for(request.engine_version)
    block, _ = vk.block_size(request.model.geometry, device=request.device, compute_capability=None,
                             pinned=pinned.get("--block-size"), cpu_amx=request.host.cpu_amx if request.host else None,
                             rules=rules)
    return unplanned(request, refusal, newest=vr.NEWEST, rules_version=rules.version, pinned=pinned,
                     length=pinned.get("--max-model-len") or 0, tp=vr.ranks(pinned)[0], block=block)
