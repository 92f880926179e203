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
from launcher.common.units import GiB, MiB, format_gib
from launcher.engines import vllm as vl
from launcher.engines.checks_common import CheckInput, EngineRule
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.versions import version_key
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import hybrid
from launcher.engines.vllm.architectures import REMOVED, architecture_status, cpu_unservable, uses_mla
from launcher.engines.vllm.checks import start_checks
from launcher.engines.vllm.kv import CPU_BLOCK_SIZE, KvCapacity, KvLayout, kv_capacity
from launcher.model.config import SLIDING, ModelGeometry
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
    Plan,
    PlanRequest,
)

# The band added for an architecture whose KV layout is not proven against the engine: the 13
# wrong cases on 7 unverified architectures were off by -67 % to +300 % before their layouts were
# encoded; a third of the KV bytes either way keeps the plan from a confident wrong number.
UNVERIFIED_KV_ERROR_FRACTION = 0.33


def plan(request: PlanRequest) -> Plan:
    """The vLLM plan for `request`'s device, or `WontFit`."""
    return plan_cpu(request) if request.device == "cpu" else plan_gpu(request)


@dataclass(frozen=True)
class _VllmSetup:
    rules: vl.VllmRules
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
    state_notes: tuple[str, ...] = ()


def _vllm_setup(request: PlanRequest, compute_capability: tuple[int, int] | None,
                gpu_name: str | None = None) -> _VllmSetup:
    rules, note = vl.rules_for(request.engine_version)
    pinned = vl.pinned_flags(request.engine_args)
    tp, pp = vl.ranks(pinned)
    geometry = request.model.geometry
    dtype, dtype_reason = resolve_dtype(geometry, compute_capability=compute_capability,
                                           device=request.device, pinned=pinned.get("--dtype"))
    dtype, dtype_reason = _without_fallback(rules, geometry, dtype, dtype_reason, pinned.get("--dtype"))
    # The engine's own start-time rules first: what it refuses is its refusal (exit 78).
    max_len, max_len_reason = vl.derived_max_model_len(geometry, rules=rules)
    refuse_what_vllm_refuses(start_checks(CheckInput(
        geometry=geometry, device=request.device, compute_capability=compute_capability,
        gpu_count=len(request.gpus), tp=tp, pp=pp, dtype=dtype, kv_cache_dtype=pinned.get("--kv-cache-dtype"),
        block_size=pinned.get("--block-size"), max_model_len=pinned.get("--max-model-len") or None,
        model_max_len=max_len, engine_version=request.engine_version, gpu_name=gpu_name,
        max_len_key=vl.max_len_key(geometry),
        allow_long_max_model_len=request.allow_long_max_model_len, quantization=pinned.get("--quantization"),
        pinned_dtype=pinned.get("--dtype"), nnodes=int(pinned.get("--nnodes", 1)))))
    try:
        kv_bytes, kv_reason = vl.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    block, block_reason = vl.block_size(geometry, device=request.device, compute_capability=compute_capability,
                                        pinned=pinned.get("--block-size"),
                                        cpu_amx=request.host.cpu_amx if request.host else None, rules=rules,
                                        kv_cache_dtype=pinned.get("--kv-cache-dtype"))
    if request.device == "cpu":
        _refuse_cpu_combinations(request, geometry, block, kv_bytes, rules, pinned.get("--block-size"))
    refuse_unsized_state(geometry, pp, rules.version)
    model_bytes = vl.kv_dtype_bytes(None, dtype)[0]
    state = vl.hybrid_layout_for(geometry, block=block, kv_bytes=kv_bytes, model_dtype_bytes=model_bytes, tp=tp,
                                 device=request.device, pinned=pinned)
    if state is not None:
        return _VllmSetup(rules, note, pinned, tp, pp, dtype, dtype_reason, kv_bytes, kv_reason, state.block,
                          state.block_reason, state.layout, max_len, max_len_reason, state.notes)
    layout = vl.layout_for(geometry, block=block, kv_bytes=kv_bytes, tp=tp, pp=pp, pinned=pinned)
    return _VllmSetup(rules, note, pinned, tp, pp, dtype, dtype_reason, kv_bytes, kv_reason, block, block_reason,
                      layout, max_len, max_len_reason)


def refuse_unsized_state(geometry: ModelGeometry, pp: int, version: str) -> None:
    """Hybrid models whose per-request state vLLM's table here does not size: refused, not guessed."""
    if not geometry.has_linear_layers and hybrid.family_of(geometry) is None:
        return
    linear = hybrid.state_layer_count(geometry)
    if geometry.architecture in REMOVED and version_key(version) >= version_key(REMOVED[geometry.architecture]):
        raise WontFit(f"vLLM {version} no longer serves {geometry.architecture} (removed in "
                      f"{REMOVED[geometry.architecture]}, model_executor/models/registry.py "
                      "_PREVIOUSLY_SUPPORTED_MODELS): the engine refuses it at start",
                      hint="use a vLLM release before the removal", rule="removed-architecture")
    if hybrid.family_of(geometry) is None or pp > 1:
        why = hybrid.UNSIZED.get(geometry.architecture, "safe-serve does not size that state yet")
        if pp > 1:
            why = "safe-serve does not size a state model's cache per pipeline stage yet"
        raise UnsupportedModel(
            f"{geometry.architecture} is a hybrid model ({linear} of {geometry.num_layers} layers keep a "
            f"linear-attention/Mamba state per request); {why}",
            hint="pin --kv-cache-memory-bytes, or pass --trust-engine")


def _without_fallback(rules: vl.VllmRules, geometry: ModelGeometry, dtype: str, reason: str,
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
    """The first start-time rule vLLM would stop on, as a refusal (exit 78) before any budget."""
    if rules:
        first = rules[0]
        others = f" (and {len(rules) - 1} more: {', '.join(r.rule for r in rules[1:])})" if len(rules) > 1 else ""
        message = " ".join(first.message.split())  # one line, whatever the engine's own layout
        raise WontFit(f"vLLM refuses this at start: {message}{others} [{first.source}]", hint=first.hint,
                      rule=first.rule, source=first.source)


def _refuse_cpu_combinations(request: PlanRequest, geometry: ModelGeometry, block: int, kv_bytes: int,
                             rules: vl.VllmRules, pinned_block: int | None) -> None:
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
    state_failure = hybrid.cpu_failure(geometry)  # state kernels: tests/data/vllm_cpu_truth.json
    if state_failure:
        raise WontFit(state_failure, hint="serve it on a GPU", rule="cpu-kernel")
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


def _vllm_length(request: PlanRequest, setup: _VllmSetup, capacity_at: Callable[[int], KvCapacity],
                 favourable_at: Callable[[int], KvCapacity] | None = None,
                 cause: str = "") -> tuple[int, str, KvCapacity, str | None]:
    """Keep a pinned --max-model-len, or choose the longest that carries `concurrency` requests.

    `favourable_at` is the capacity at the favourable end of the estimate's error band: a
    configuration is refused only when it fails there too. When it fails at the central
    estimate only, the plan keeps it and says why it may not fit (the fourth value); the
    engine's own numbers then decide, and the watch retunes.
    """
    pinned_len = setup.pinned.get("--max-model-len")
    if pinned_len is not None and pinned_len > 0:
        # Above the model's maximum is start_checks' to decide (VLLM_ALLOW_LONG_MAX_MODEL_LEN).
        capacity = capacity_at(pinned_len)
        doubt = _checked_in_band(request, capacity, pinned_len, favourable_at)
        return pinned_len, "pinned --max-model-len", capacity, doubt

    if pinned_len == -1:
        # --max-model-len auto: vLLM's own auto-fit sizes for ONE request (binary search on
        # the KV check); predict its answer, then hold it to the concurrency asked for.
        at_max = capacity_at(setup.model_max_len)
        length = setup.model_max_len if at_max.fits_one_request else at_max.estimated_max_model_len
        if length <= 0:
            raise WontFit("vLLM will fail with 'Cannot auto-fit max_model_len': no KV room for a single token")
        capacity = capacity_at(length)
        doubt = _checked_in_band(request, capacity, length, favourable_at)
        return length, "vLLM auto-fit (pinned --max-model-len auto), predicted", capacity, doubt

    def carries(at: Callable[[int], KvCapacity]) -> Callable[[int], bool]:
        def fits(length: int) -> bool:
            cap = at(length)
            return bool(cap.fits_one_request and (cap.num_blocks - 1) / cap.blocks_per_request >= request.concurrency)
        return fits

    length = largest_length(carries(capacity_at), setup.model_max_len, setup.block)
    doubt = None
    if length <= 0 and favourable_at is not None:
        length = largest_length(carries(favourable_at), setup.model_max_len, setup.block)
        if length > 0:
            doubt = (f"{request.concurrency} request(s) of {length} tokens fit only at the favourable end of the "
                     f"estimate's error band ({format_gib(capacity_at(length).kv_bytes)} KV at the central "
                     f"estimate, {format_gib(favourable_at(length).kv_bytes)} at best)")
    if length <= 0:
        capacity = (favourable_at or capacity_at)(setup.block)
        raise WontFit(
            f"no KV room for {request.concurrency} request(s) of even {setup.block} tokens: "
            + (f"{format_gib(capacity.kv_bytes)} left for the KV cache" if capacity.kv_bytes >= 0 else
               f"{format_gib(-capacity.kv_bytes)} short of any KV cache")
            + (" at the favourable end of the estimate" if favourable_at is not None else "") + cause,
            rule="kv-capacity", figures={"kv_cache_bytes": capacity.kv_bytes, "concurrency": request.concurrency})
    reason = (f"model maximum ({setup.model_max_len_reason})" if length == setup.model_max_len
              else f"longest that fits {request.concurrency} request(s) (model maximum {setup.model_max_len})")
    return length, reason, capacity_at(length), doubt


def _available_error(total_error: int, utilization: float, non_torch_error: int, peak_error: int,
                     cudagraph: int) -> int:
    """+/- on what vLLM leaves for the KV cache: the sum of the estimated terms' errors."""
    return int(math.ceil(total_error * utilization) + non_torch_error + peak_error
               + vb.cudagraph_error_bytes(cudagraph))


def _pinned_kv_fits(kv: int, available: int, error: int, doubt: str | None, flag: str) -> str | None:
    """A pinned KV size must fit what the weights, activations and graphs leave, or vLLM runs out
    of memory allocating it: refused beyond the band, doubted inside it."""
    if kv <= available:
        return doubt
    message = (f"{flag}: {format_gib(kv)} of KV cache, but only ~{format_gib(max(available, 0))} is left after "
               "the weights, activations and CUDA graphs: vLLM runs out of memory allocating it")
    if kv > available + error:
        raise WontFit(message, hint=f"lower {flag}", rule="pinned-kv")
    return "; ".join(d for d in (doubt, message + " (inside the estimate's error band)") if d)


def _checked_in_band(request: PlanRequest, capacity: KvCapacity, length: int,
                     favourable_at: Callable[[int], KvCapacity] | None) -> str | None:
    """None when `length` fits at the central estimate; the doubt when it fits only at the
    favourable end; `WontFit` when it fails there too."""
    try:
        _check_vllm_capacity(request, capacity, length)
        return None
    except WontFit as central:
        if favourable_at is None:
            raise
        try:
            _check_vllm_capacity(request, favourable_at(length), length)
        except WontFit as favourable:
            raise WontFit(f"{favourable.message} (at the favourable end of the estimate)", hint=favourable.hint,
                          rule=favourable.rule, figures=favourable.figures) from None
        return f"{central.message} at the central estimate; it fits at the favourable end of the error band"


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


def plan_gpu(request: PlanRequest) -> Plan:
    model, geometry = request.model, request.model.geometry
    # Parallelism picks the devices, whose compute capability then sets dtype and block size.
    pinned = vl.pinned_flags(request.engine_args)
    tp, pp = vl.ranks(pinned)
    devices = rank_devices(request, tp * pp, pinned.get("--nnodes", 1), tp_flag=vl.TP_FLAG)
    gpu = tightest(devices)
    setup = _vllm_setup(request, gpu.compute_capability, gpu.name)
    rules = setup.rules
    total = gpu.usable_total_bytes
    free = gpu.free_bytes or 0
    context = vb.context_bytes(tp, pp)
    free_at_init = free - context
    cal = request.calibration

    offloaded = int(pinned.get("--cpu-offload-gb", 0) * GiB)  # vLLM keeps this much of each rank's weights on the host
    weights = max(model.weight_bytes // (tp * pp) - offloaded, 0)
    repack, repack_rule = vb.mxfp4_repack_extra_bytes(geometry, version=rules.version, tp=tp, pp=pp,
                                                      compute_capability=gpu.compute_capability)
    weights += repack  # vLLM's "Model loading took": the weights as its kernels hold them
    non_torch, non_torch_error = vb.non_torch_bytes(tp, pp, since_019=version_key(rules.version) >= version_key("0.19"),
                                                    compute_capability=gpu.compute_capability)
    eager = pinned.get("--enforce-eager", False)
    cudagraph = 0 if eager or not rules.cudagraph_estimate_subtracted else vb.cudagraph_estimate_bytes(
        setup.layout.group_size * len(setup.layout.groups))
    # Where the estimate is not subtracted, the graphs are captured after the KV cache from what vLLM
    # did not request (gpu_worker.py compile_or_warm_up_model): keep their band's unfavourable end out.
    graphs_outside = 0 if eager or rules.cudagraph_estimate_subtracted else vb.cudagraph_outside_bytes(
        setup.layout.group_size * len(setup.layout.groups))
    defaults = vb.batch_defaults(nvml_total_bytes=gpu.total_bytes, gpu_name=gpu.name, device="cuda",
                                 world_size=tp * pp, b200_tier=rules.b200_tier)
    if pinned.get("--performance-mode") == "throughput":
        defaults = defaults.doubled()
    warnings = not_modelled_warnings(pinned, vl.NOT_MODELLED)
    running = int(pinned.get("--max-num-seqs", defaults.max_num_seqs))
    if request.concurrency > running:
        # vLLM never runs more than max_num_seqs requests at once: the rest queue. Sizing the
        # KV cache for more would only shorten every request for nothing.
        source = "pinned --max-num-seqs" if "--max-num-seqs" in pinned else f"vLLM's default here ({defaults.reason})"
        warnings.append(f"--concurrency {request.concurrency}: vLLM runs at most {running} requests at once "
                        f"(max_num_seqs {running}, {source}); planned for {running}, the rest wait in the queue "
                        "(raise --max-num-seqs to run more)")
        request = dataclasses.replace(request, concurrency=running)

    headroom = cal.extra_headroom_bytes if cal is not None else 0
    if headroom and "--gpu-memory-utilization" in pinned:
        warnings.append(f"a CUDA out-of-memory while serving was seen on this setup: the pinned "
                        f"--gpu-memory-utilization is kept; lower it by ~{format_gib(headroom)} to leave room")
    # Utilization: pinned, or the most we can request from *free* memory (other tenants
    # make vLLM refuse to start when free < total x utilization), capped by the engine default.
    if "--gpu-memory-utilization" in pinned:
        utilization = pinned["--gpu-memory-utilization"]
        util_source, util_detail = PINNED, "pinned --gpu-memory-utilization"
    else:
        room = free_at_init - request.margin_bytes
        if request.max_gpu_memory_bytes is not None:
            room = min(room, request.max_gpu_memory_bytes - context)
        room -= graphs_outside
        utilization = min(rules.default_utilization, vl.utilization_for(max(room, 0), total))
        util_source = ENGINE_DEFAULT if utilization == rules.default_utilization else FORMULA
        util_detail = (f"vLLM {rules.version} default" if util_source == ENGINE_DEFAULT
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
            utilization = vl.utilization_for(max(vb.requested_bytes(total, utilization) - headroom, 0), total)
            util_source = CALIBRATED
            util_detail += f"; - {format_gib(headroom)} headroom after a runtime CUDA OOM on this setup"
    if utilization <= 0:
        if request.max_gpu_memory_bytes is not None and request.max_gpu_memory_bytes - context < free_at_init - \
                request.margin_bytes:
            cause = (f"--max-gpu-memory {format_gib(request.max_gpu_memory_bytes)} leaves nothing after the CUDA "
                     f"context ({format_gib(context)})")
        else:
            cause = (f"{format_gib(free)} free - CUDA context {format_gib(context)} - margin "
                     f"{format_gib(request.margin_bytes)} (--margin) leaves nothing")
        raise WontFit(f"{gpu.label}: no room for vLLM at all: {cause}", rule="no-room",
                      figures={"free_bytes": free, "context_bytes": context, "margin_bytes": request.margin_bytes,
                               "max_gpu_memory_bytes": request.max_gpu_memory_bytes})
    requested = vb.requested_bytes(total, utilization)
    startup_doubt = None
    if requested > free_at_init + vb.CONTEXT_ERROR_BYTES:
        raise WontFit(
            f"vLLM will refuse to start: free memory on {gpu.label} at start ~{format_gib(free_at_init)} is less "
            f"than --gpu-memory-utilization {utilization} x {format_gib(total)} = {format_gib(requested)}",
            hint="lower --gpu-memory-utilization or stop the other processes on the GPU")
    if requested > free_at_init:
        startup_doubt = (f"--gpu-memory-utilization {utilization} x {format_gib(total)} = {format_gib(requested)} is "
                         f"above the ~{format_gib(free_at_init)} free at start by less than the CUDA context's "
                         "error: vLLM may refuse to start")
    elif graphs_outside > free_at_init - requested:
        startup_doubt = (f"vLLM {rules.version} captures CUDA graphs after sizing the KV cache, from the "
                         f"~{format_gib(free_at_init - requested)} it did not request; they may take up to "
                         f"{format_gib(graphs_outside)}: capture may run out of memory (--enforce-eager avoids it)")

    def peak_at(length: int) -> tuple[int, int, vb.ProfilePeak]:
        batched, seqs = vb.resolve_batch(defaults=defaults, max_model_len=length,
                                         pinned_batched_tokens=pinned.get("--max-num-batched-tokens"),
                                         pinned_num_seqs=pinned.get("--max-num-seqs"),
                                         chunked_prefill=not pinned.get("--no-enable-chunked-prefill", False))
        peak = vb.profile_peak(geometry, rules=rules, batched_tokens=batched, num_seqs=seqs, tp=tp,
                               gpu_name=gpu.name, language_only=not vb.encoder_profiled(geometry, pinned))
        return batched, seqs, peak

    def budget_at(length: int) -> tuple[int, int, int]:
        batched, seqs, peak = peak_at(length)
        return batched, seqs, peak.total_bytes + peak.persistent_bytes

    pinned_kv_bytes = pinned.get("--kv-cache-memory-bytes")
    blocks_override = pinned.get("--num-gpu-blocks-override")

    def available_at(length: int) -> int:
        """What vLLM's own accounting leaves for the KV cache at this length."""
        if pinned_kv_bytes is not None:
            # vLLM skips the profile's budget: the cache is the pinned bytes, on top of what
            # the weights, activations and graphs take from the free memory (gpu_worker.py:649).
            return free_at_init - weights - non_torch - budget_at(length)[2] - cudagraph
        if cal is not None and cal.non_kv_bytes is not None:
            return requested - cal.non_kv_bytes
        return requested - weights - non_torch - budget_at(length)[2] - cudagraph

    def kv_at(length: int) -> int:
        if pinned_kv_bytes is not None:
            return int(pinned_kv_bytes)
        if blocks_override is not None:  # vLLM allocates exactly that many blocks
            return int(blocks_override) * setup.layout.bytes_per_block
        return available_at(length)

    total_error = gpu.usable_total_error_bytes  # the spread of published totals, or of NVML's reserve

    verified, architecture_note = architecture_status(geometry)
    if not verified:
        warnings.append(architecture_note)

    def bytes_error_at(length: int) -> int:
        """+/- on the KV bytes vLLM reports: the sum of the estimated budget terms' errors (0 when
        none is estimated). The KV layout does not enter: vLLM's figure is requested - non-KV."""
        if pinned_kv_bytes is not None or blocks_override is not None or (
                cal is not None and cal.non_kv_bytes is not None):
            return 0
        return _available_error(total_error, utilization, non_torch_error, peak_at(length)[2].error_bytes,
                                cudagraph)

    def kv_error_at(length: int) -> int:
        """+/- on what the KV bytes hold, in bytes of a proven layout: the budget's error, and for an
        architecture whose layout is not proven a third of the bytes (its bytes per token may be off)."""
        unverified = 0 if verified else int(max(kv_at(length), 0) * UNVERIFIED_KV_ERROR_FRACTION)
        return bytes_error_at(length) + unverified

    def capacity_for(length: int, kv_bytes: int) -> KvCapacity:
        batched = budget_at(length)[0]
        return kv_capacity(setup.layout, kv_bytes, max_model_len=length,
                           in_flight_tokens=vl.in_flight_tokens(batched_tokens=batched, device="cuda", pp=pp))

    def capacity_at(length: int) -> KvCapacity:
        return capacity_for(length, kv_at(length))

    def favourable_at(length: int) -> KvCapacity:
        return capacity_for(length, kv_at(length) + kv_error_at(length))

    weights_cause = ""
    if weights >= requested:
        weights_cause = (f": the weights alone ({format_gib(weights)} per rank) exceed the {format_gib(requested)} "
                         f"vLLM requests at --gpu-memory-utilization {utilization:g}")
    length, length_reason, capacity, doubt = _vllm_length(request, setup, capacity_at, favourable_at, weights_cause)
    batched, seqs, activation = budget_at(length)
    peak = peak_at(length)[2]
    if pinned_kv_bytes is not None or blocks_override is not None:
        doubt = _pinned_kv_fits(kv_at(length), available_at(length), _available_error(
            total_error, utilization, non_torch_error, peak.error_bytes, cudagraph), doubt,
            "--kv-cache-memory-bytes" if pinned_kv_bytes is not None else "--num-gpu-blocks-override")
    kv = kv_at(length)
    kv_error = bytes_error_at(length)
    if not verified:
        warnings.append(f"KV tokens +/- {UNVERIFIED_KV_ERROR_FRACTION:.0%} (the layout is not proven); the KV bytes "
                        f"{format_gib(kv)} +/- {format_gib(kv_error)} do not depend on it")

    args: list[str] = []
    if "--gpu-memory-utilization" not in pinned and "--kv-cache-memory-bytes" not in pinned:
        args += ["--gpu-memory-utilization", f"{utilization:g}"]
    if "--max-model-len" not in pinned:
        args += ["--max-model-len", str(length)]

    measured_non_kv = cal.non_kv_bytes if cal is not None else None
    calibration_key = cal.key if cal is not None else ""
    others = gpu.usable_total_bytes - free  # CUDA's view: the driver reserve is not a tenant
    items = [
        BudgetItem("total", "GPU total (CUDA)", total, CATALOG if gpu.source == "catalog" else MEASURED,
                   "cudaMemGetInfo total" + (" (catalog: published totals for this card)" if gpu.cuda_total_bytes
                                             and gpu.source == "catalog" else "" if gpu.cuda_total_bytes else
                                             " = NVML total - driver reserve" if gpu.reserved_bytes else
                                             " ~ NVML total - the typical driver reserve (not measured for this GPU)"),
                   error_bytes=total_error),
        BudgetItem("other", "held by others", max(others, 0), MEASURED if gpu.source == "nvml" else CATALOG,
                   tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", context, FORMULA,
                   "before vLLM's init snapshot; only tightens the startup check", bar="other"),
        BudgetItem("requested", f"requested = ceil(total x {utilization:g})", requested, util_source, util_detail),
        BudgetItem("weights", "weights (per rank)", weights, COMPUTED if repack else weights_source(model),
                   model.weight_bytes_source + (f" / {tp * pp} ranks" if tp * pp > 1 else "")
                   + (f", less {format_gib(offloaded)} --cpu-offload-gb" if offloaded else "")
                   + (f", + {format_gib(repack)} as loaded ({repack_rule})" if repack else ""), bar="weights"),
        BudgetItem("non_torch", "non-torch after snapshot", non_torch, FORMULA,
                   "cuBLAS, allocator" + (", NCCL and all-reduce buffers" if tp * pp > 1 else "")
                   + ("; vLLM 0.19 H100 logs 2.07-2.10 GiB (symmetric-memory all-reduce)"
                      if non_torch == vb.NON_TORCH_BYTES_TP_V019 else
                      "; published logs 0.34-0.43 GiB per rank" if tp * pp > 1 else "; vLLM 0.19 logs 0.25-0.27 GiB"),
                   bar="other", error_bytes=non_torch_error),
        BudgetItem("activation", f"activation ({peak.runner} profile run)", activation, FORMULA,
                   f"{peak.describe()} at {batched} batched tokens, {min(seqs, batched)} sampler rows "
                   f"({defaults.reason})"
                   + (f"; + penalty state {format_gib(peak.persistent_bytes)}" if peak.persistent_bytes else ""),
                   bar="activations", error_bytes=peak.error_bytes),
        BudgetItem("cudagraph", "CUDA graph estimate", cudagraph, FORMULA if cudagraph else ENGINE_DEFAULT,
                   "--enforce-eager: no graphs" if eager else
                   (f"not subtracted by vLLM {rules.version} (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS off)"
                    if not cudagraph else
                    f"{vb.CUDAGRAPH_BASE_BYTES // MiB} MiB + {vb.CUDAGRAPH_PER_LAYER_BYTES / MiB:.1f} MiB x layers"),
                   bar="graphs", error_bytes=vb.cudagraph_error_bytes(cudagraph)),
        BudgetItem("kv", "KV cache", kv, PINNED if pinned_kv_bytes is not None or blocks_override is not None else
                   (CALIBRATED if measured_non_kv is not None else FORMULA),
                   f"{capacity.num_blocks} blocks x {setup.layout.bytes_per_block} B "
                   f"({setup.layout.group_size} layers x {setup.layout.page_bytes} B page, block {setup.block})",
                   bar="kv"),
        BudgetItem("free", "left free", max(free_at_init - requested, 0), FORMULA,
                   "not requested by vLLM: margin for other tenants", bar="free"),
    ]
    if measured_non_kv is not None:
        # The engine's own measurement replaces our three estimates; the rows still add up.
        estimates = ("non_torch", "activation", "cudagraph")
        items = [i for i in items if i.key not in estimates]
        items.insert(-2, BudgetItem("measured_non_kv", "non-KV besides weights", measured_non_kv - weights,
                                    CALIBRATED, f"measured by vLLM at an earlier start ({calibration_key})",
                                    bar="activations"))
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    notes += setup.state_notes
    if measured_non_kv is not None:
        notes.append(f"non-KV memory from an earlier start of the same configuration ({calibration_key})")
    if setup.layout.padding_layers:
        notes.append(f"vLLM pads {setup.layout.padding_layers} layer(s) to even KV groups")
    return Plan(
        engine="vllm", engine_version=request.engine_version or vl.NEWEST, rules_version=rules.version,
        device="cuda", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=tuple(items), engine_args=tuple(args), engine_env={}, pinned=dict(pinned), tp=tp, pp=pp,
        gpu_memory_utilization=None if pinned_kv_bytes is not None else utilization,
        memory_knob=(f"--kv-cache-memory-bytes {format_gib(int(pinned_kv_bytes))} (pinned; utilization ignored)"
                     if pinned_kv_bytes is not None else f"--gpu-memory-utilization {utilization:g}"),
        block_size=setup.block, num_blocks=capacity.num_blocks,
        gpu_name=gpu.name, gpu_count=len(devices), notes=tuple(notes),
        engine_version_assumed=request.engine_version_assumed,
        kv_cache_bytes_low=kv - kv_error, kv_cache_bytes_high=kv + kv_error,
        may_not_fit="; ".join(d for d in (startup_doubt, doubt) if d) or None, warnings=tuple(warnings),
        architecture_verified=verified,
        engine_defaults={"gpu_memory_utilization": rules.default_utilization,
                         "max_num_batched_tokens": defaults.max_num_batched_tokens,
                         "max_num_seqs": defaults.max_num_seqs},
    )


# --------------------------------------------------------------------------- vLLM on CPU


def plan_cpu(request: PlanRequest) -> Plan:
    """KV space is VLLM_CPU_KVCACHE_SPACE whole GiB; weights and activations share host RAM."""
    model, geometry = request.model, request.model.geometry
    setup = _vllm_setup(request, None)
    pinned = setup.pinned
    host = request.host
    if host is None:
        raise WontFit("host memory unknown: cannot plan the CPU backend")
    weights = model.weight_bytes
    defaults = vb.batch_defaults(nvml_total_bytes=None, gpu_name="cpu", device="cpu", world_size=setup.tp * setup.pp)
    env_space = request.engine_env.get("VLLM_CPU_KVCACHE_SPACE")

    def activation_at(length: int) -> tuple[int, int]:
        batched, seqs = vb.resolve_batch(defaults=defaults, max_model_len=length,
                                         pinned_batched_tokens=pinned.get("--max-num-batched-tokens"),
                                         pinned_num_seqs=pinned.get("--max-num-seqs"))
        return batched, vb.cpu_activation_peak_bytes(geometry, batched_tokens=batched,
                                                     num_seqs=min(seqs, batched), tp=setup.tp)

    room = host.available_bytes - weights - request.margin_bytes
    if request.max_gpu_memory_bytes is not None:
        room = min(room, request.max_gpu_memory_bytes - weights)

    def capacity_for(space_bytes: int, length: int) -> KvCapacity:
        batched = activation_at(length)[0]
        return kv_capacity(setup.layout, space_bytes, max_model_len=length,
                           in_flight_tokens=vl.in_flight_tokens(batched_tokens=batched, device="cpu", pp=setup.pp))

    if env_space not in (None, ""):
        try:
            space_gib = int(env_space)
        except ValueError:
            raise UsageError(f"VLLM_CPU_KVCACHE_SPACE={env_space!r}: vLLM needs whole GiB") from None
        space_source, space_detail = PINNED, "VLLM_CPU_KVCACHE_SPACE from the environment"
    elif "--kv-cache-memory-bytes" in pinned:
        space_gib = None
        space_source, space_detail = PINNED, "pinned --kv-cache-memory-bytes"
    else:
        # Take what the requests need (whole GiB, at least 1), not the whole host.
        pinned_len = pinned.get("--max-model-len")
        target_len = pinned_len if pinned_len and pinned_len > 0 else setup.model_max_len
        needed = setup.layout.bytes_per_block * (
            math.ceil(request.concurrency * setup.layout.blocks_per_request(
                target_len, vl.in_flight_tokens(batched_tokens=activation_at(target_len)[0], device="cpu",
                                                pp=setup.pp))) + 1)
        most = max((room - activation_at(target_len)[1]) // GiB, 0)
        space_gib = max(1, min(math.ceil(needed / GiB), most))
        space_source = FORMULA
        space_detail = (f"enough for {request.concurrency} x {target_len} tokens" if space_gib * GiB >= needed
                        else f"all the host can spare ({format_gib(room)} after weights and margin)")
    kv = pinned["--kv-cache-memory-bytes"] if space_gib is None else space_gib * GiB

    def capacity_at(length: int) -> KvCapacity:
        return capacity_for(kv, length)

    length, length_reason, capacity, _ = _vllm_length(request, setup, capacity_at)
    batched, activation = activation_at(length)
    if weights + activation + kv + request.margin_bytes > host.available_bytes:
        raise WontFit(
            f"host RAM: weights {format_gib(weights)} + activations {format_gib(activation)} + KV {format_gib(kv)} "
            f"exceed the {format_gib(host.available_bytes)} available",
            hint="lower VLLM_CPU_KVCACHE_SPACE or --max-model-len")
    env = {} if env_space not in (None, "") or space_gib is None else {"VLLM_CPU_KVCACHE_SPACE": str(space_gib)}
    args = [] if "--max-model-len" in pinned else ["--max-model-len", str(length)]
    items = (
        BudgetItem("total", "host RAM available", host.available_bytes, MEASURED,
                   "psutil available" + (", cgroup limit applied" if host.cgroup_limit_bytes else "")),
        BudgetItem("weights", "weights", weights, weights_source(model), model.weight_bytes_source, bar="weights"),
        BudgetItem("activation", "activation peak", activation, FORMULA,
                   f"{batched} batched tokens ({defaults.reason})", bar="activations"),
        BudgetItem("kv", "KV cache (VLLM_CPU_KVCACHE_SPACE)", kv, space_source,
                   f"{space_detail}; {capacity.num_blocks} blocks x {setup.layout.bytes_per_block} B, "
                   f"block {setup.block}",
                   bar="kv"),
        BudgetItem("free", "left free", max(host.available_bytes - weights - activation - kv, 0), FORMULA,
                   "host RAM not planned for", bar="free"),
    )
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    notes += setup.state_notes
    verified, architecture_note = architecture_status(geometry)
    return Plan(
        engine="vllm", engine_version=request.engine_version or vl.NEWEST, rules_version=setup.rules.version,
        device="cpu", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=items, engine_args=tuple(args), engine_env=env, pinned=dict(pinned), tp=setup.tp, pp=setup.pp,
        cpu_kvcache_space_gib=space_gib, block_size=setup.block, num_blocks=capacity.num_blocks,
        memory_knob=f"VLLM_CPU_KVCACHE_SPACE={space_gib}" if space_gib is not None else
        f"--kv-cache-memory-bytes {format_gib(kv)} (pinned)",
        gpu_name="cpu", gpu_count=0, notes=tuple(notes), architecture_verified=verified,
        warnings=() if verified else (architecture_note,),
        engine_version_assumed=request.engine_version_assumed,
    )


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; vLLM sizes itself."""
    pinned = vl.pinned_flags(request.engine_args)
    block, _ = vl.block_size(request.model.geometry, device=request.device, compute_capability=None,
                             pinned=pinned.get("--block-size"), cpu_amx=request.host.cpu_amx if request.host else None)
    rules, _ = vl.rules_for(request.engine_version)
    return unplanned(request, refusal, newest=vl.NEWEST, rules_version=rules.version, pinned=pinned,
                     length=pinned.get("--max-model-len") or 0, tp=vl.ranks(pinned)[0], block=block)
