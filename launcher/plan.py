"""The planner: pure functions from (GPU, model, engine, pinned flags) to a plan that fits.

No I/O and no environment reads: everything arrives in a `PlanRequest`, and every number
in the resulting `Plan` carries the item it came from (`BudgetItem.source` and `.detail`).
When nothing fits, `WontFit` carries alternatives that were each planned, not guessed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.engines import engine_module, ranks
from launcher.engines import sglang as sg
from launcher.engines.flags import drop_flag
from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm.kv import KvCapacity, KvLayout, kv_capacity
from launcher.errors import SafeServeError, UsageError, WontFit
from launcher.gpu import GpuDevice, HostMemory
from launcher.model import SLIDING, refuse_unsupported
from launcher.resolve import ResolvedModel
from launcher.units import GiB, MiB, floor_to, format_gib

DEFAULT_MARGIN_BYTES = 256 * MiB  # headroom for other tenants' drift between plan and start

# Sources a budget item can come from.
MEASURED = "measured"
FORMULA = "formula"
ENGINE_DEFAULT = "engine default"
PINNED = "pinned"
CATALOG = "catalog"
CALIBRATED = "calibrated"


@dataclass(frozen=True)
class Calibration:
    """What an earlier start of the same key measured (bytes), from `launcher.calibration`."""

    non_kv_bytes: int | None = None  # vLLM: requested - available KV (weights + act + graphs + other)
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    cudagraph_bytes: int | None = None
    load_overhead_bytes: int | None = None  # SGLang: P - A beyond the weights
    key: str = ""


@dataclass(frozen=True)
class PlanRequest:
    model: ResolvedModel
    engine: str  # "vllm" or "sglang"
    device: str = "cuda"  # "cuda" or "cpu"
    gpus: tuple[GpuDevice, ...] = ()  # the devices the ranks will use, CUDA order
    host: HostMemory | None = None
    engine_version: str | None = None
    engine_args: tuple[str, ...] = ()
    engine_env: Mapping[str, str] = field(default_factory=dict)  # VLLM_CPU_KVCACHE_SPACE, ...
    concurrency: int = 1
    max_gpu_memory_bytes: int | None = None
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    calibration: Calibration | None = None
    trust_engine: bool = False
    # Smaller checkpoints of the same model (resolved by the caller) to offer when nothing fits.
    variants: tuple[ResolvedModel, ...] = ()


@dataclass(frozen=True)
class BudgetItem:
    key: str  # total, other, context, weights, non_torch, activation, cudagraph, slack, kv, free
    label: str
    bytes: int
    source: str
    detail: str
    bar: str | None = None  # which budget-bar segment: weights/activations/graphs/other/kv/free


@dataclass(frozen=True)
class Plan:
    engine: str
    engine_version: str
    rules_version: str
    device: str
    model: str
    max_model_len: int
    max_model_len_source: str
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrency: float
    budget: tuple[BudgetItem, ...]
    engine_args: tuple[str, ...]  # flags the launch adds (never ones the operator pinned)
    engine_env: Mapping[str, str]
    pinned: Mapping[str, Any]
    tp: int = 1
    pp: int = 1
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    cpu_kvcache_space_gib: int | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    notes: tuple[str, ...] = ()
    alternatives: tuple[str, ...] = ()

    def item(self, key: str) -> BudgetItem | None:
        return next((i for i in self.budget if i.key == key), None)


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
    if request.engine == "vllm":
        return _plan_vllm_cpu(request) if request.device == "cpu" else _plan_vllm_gpu(request)
    if request.engine == "sglang":
        if request.device == "cpu":
            raise UsageError("SGLang on CPU is not planned yet: use --engine vllm --device cpu")
        return _plan_sglang(request)
    raise UsageError(f"unknown engine {request.engine!r}: use vllm or sglang")


# --------------------------------------------------------------------------- shared helpers


def _rank_devices(request: PlanRequest, ranks: int, nnodes: int = 1) -> tuple[GpuDevice, ...]:
    """The devices this node's ranks run on: all ranks, or a 1/nnodes share with `--nnodes`.

    Multi-node runs start safe-serve on every node; each node plans its own ranks, and
    every rank holds the same share of the model, so one node's plan is every node's.
    """
    if nnodes > 1 and ranks % nnodes:
        raise UsageError(f"{ranks} ranks do not split evenly over --nnodes {nnodes}")
    local = ranks // max(nnodes, 1)
    if len(request.gpus) < local:
        where = f" on this node (of {ranks} over {nnodes} nodes)" if nnodes > 1 else ""
        raise WontFit(
            f"{local} ranks (tensor x pipeline parallel){where} need {local} GPUs; {len(request.gpus)} visible",
            hint="lower --tensor-parallel-size, or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    devices = request.gpus[:local]
    for device in devices:
        if device.free_bytes is None:
            raise WontFit(f"{device.label} ({device.name}): free memory unknown ({'; '.join(device.notes) or 'NVML'})",
                          hint="plan with --gpu NAME for a hypothetical card")
    return devices


def _tightest(devices: tuple[GpuDevice, ...]) -> GpuDevice:
    """The rank with the least free memory sets the block count for all ranks."""
    return min(devices, key=lambda d: (d.free_bytes or 0, d.usable_total_bytes))


def _largest_length(fits: Any, upper: int, multiple: int) -> int:
    """The largest multiple of `multiple` (or `upper` itself) for which `fits(length)` holds; 0 if none."""
    if fits(upper):
        return upper
    low, high = 0, upper // multiple
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid * multiple):
            low = mid
        else:
            high = mid - 1
    return low * multiple


def _tenants_detail(device: GpuDevice) -> str:
    if device.source != "nvml":
        return "hypothetical GPU: assumed idle"
    held = [p for p in device.processes]
    if not held:
        return "NVML used memory (no other processes listed)"
    parts = [f"pid {p.pid} {p.name or '?'}" + (f" {format_gib(p.used_bytes)}" if p.used_bytes else "") for p in held[:3]]
    return "NVML: " + ", ".join(parts) + (f" and {len(held) - 3} more" if len(held) > 3 else "")


# --------------------------------------------------------------------------- vLLM on GPUs


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


def _vllm_setup(request: PlanRequest, compute_capability: tuple[int, int] | None) -> _VllmSetup:
    rules, note = vl.rules_for(request.engine_version)
    pinned = vl.pinned_flags(request.engine_args)
    tp, pp = ranks("vllm", pinned)
    geometry = request.model.geometry
    dtype, dtype_reason = vl.resolve_dtype(geometry, compute_capability=compute_capability,
                                           device=request.device, pinned=pinned.get("--dtype"))
    try:
        kv_bytes, kv_reason = vl.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    block, block_reason = vl.block_size(geometry, device=request.device, compute_capability=compute_capability,
                                        pinned=pinned.get("--block-size"),
                                        cpu_amx=request.host.cpu_amx if request.host else None)
    if request.device == "cpu":
        _refuse_cpu_combinations(request, geometry, block, kv_bytes)
    layout = vl.layout_for(geometry, block=block, kv_bytes=kv_bytes, tp=tp, pp=pp, pinned=pinned)
    max_len, max_len_reason = vl.derived_max_model_len(geometry, rules=rules)
    return _VllmSetup(rules, note, pinned, tp, pp, dtype, dtype_reason, kv_bytes, kv_reason, block, block_reason,
                      layout, max_len, max_len_reason)


def _refuse_cpu_combinations(request: PlanRequest, geometry: Any, block: int, kv_bytes: int) -> None:
    """Combinations the vLLM 0.32 CPU backend accepts at start but cannot run (seen on the real engine)."""
    amx = request.host.cpu_amx if request.host else None
    if geometry.mla is not None and kv_bytes == 1 and not amx:
        raise WontFit("vLLM's CPU MLA kernel (no AMX) starts with an fp8 KV cache but fails the first request "
                      "('expected scalar type BFloat16 but found Float8_e4m3fn')", hint="use --kv-cache-dtype auto")
    if block % 32 and geometry.mla is None and SLIDING not in geometry.layer_kinds:
        raise WontFit(f"--block-size {block}: vLLM's CPU attention needs a multiple of 32 and stops after "
                      f"sizing the cache ('No common block size for {block} (CPU_ATTN: [MultipleOf(32)])')",
                      hint="use --block-size 32 or leave it unset (128)")


def _vllm_length(request: PlanRequest, setup: _VllmSetup, capacity_at: Any) -> tuple[int, str, KvCapacity]:
    """Keep a pinned --max-model-len, or choose the longest that carries `concurrency` requests."""
    pinned_len = setup.pinned.get("--max-model-len")
    if pinned_len is not None and pinned_len > 0:
        if pinned_len > setup.model_max_len:
            raise WontFit(
                f"--max-model-len {pinned_len} is above the model's maximum {setup.model_max_len} "
                f"({setup.model_max_len_reason}); vLLM refuses it at start")
        capacity = capacity_at(pinned_len)
        _check_vllm_capacity(request, capacity, pinned_len)
        return pinned_len, "pinned --max-model-len", capacity

    if pinned_len == -1:
        # --max-model-len auto: vLLM's own auto-fit sizes for ONE request (binary search on
        # the KV check); predict its answer, then hold it to the concurrency asked for.
        at_max = capacity_at(setup.model_max_len)
        length = setup.model_max_len if at_max.fits_one_request else at_max.estimated_max_model_len
        if length <= 0:
            raise WontFit("vLLM will fail with 'Cannot auto-fit max_model_len': no KV room for a single token")
        capacity = capacity_at(length)
        _check_vllm_capacity(request, capacity, length)
        return length, "vLLM auto-fit (pinned --max-model-len auto), predicted", capacity

    def fits(length: int) -> bool:
        cap = capacity_at(length)
        return cap.fits_one_request and (cap.num_blocks - 1) / cap.blocks_per_request >= request.concurrency

    length = _largest_length(fits, setup.model_max_len, setup.block)
    if length <= 0:
        capacity = capacity_at(setup.block)
        raise WontFit(
            f"no KV room for {request.concurrency} request(s) of even {setup.block} tokens: "
            f"{format_gib(max(capacity.kv_bytes, 0))} left for the KV cache")
    reason = (f"model maximum ({setup.model_max_len_reason})" if length == setup.model_max_len
              else f"longest that fits {request.concurrency} request(s) (model maximum {setup.model_max_len})")
    return length, reason, capacity_at(length)


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


def _plan_vllm_gpu(request: PlanRequest) -> Plan:
    model, geometry = request.model, request.model.geometry
    # Parallelism picks the devices, whose compute capability then sets dtype and block size.
    pinned = vl.pinned_flags(request.engine_args)
    tp, pp = ranks("vllm", pinned)
    devices = _rank_devices(request, tp * pp, pinned.get("--nnodes", 1))
    gpu = _tightest(devices)
    setup = _vllm_setup(request, gpu.compute_capability)
    rules = setup.rules
    total = gpu.usable_total_bytes
    free = gpu.free_bytes or 0
    context = vb.context_bytes(tp, pp)
    free_at_init = free - context
    cal = request.calibration

    offloaded = int(pinned.get("--cpu-offload-gb", 0) * GiB)  # vLLM keeps this much of each rank's weights on the host
    weights = max(model.weight_bytes // (tp * pp) - offloaded, 0)
    non_torch = vb.non_torch_bytes(tp, pp)
    eager = pinned.get("--enforce-eager", False)
    cudagraph = 0 if eager or not rules.cudagraph_estimate_subtracted else vb.cudagraph_estimate_bytes(
        setup.layout.group_size * len(setup.layout.groups))
    defaults = vb.batch_defaults(nvml_total_bytes=gpu.total_bytes, gpu_name=gpu.name, device="cuda",
                                 world_size=tp * pp)

    # Utilization: pinned, or the most we can request from *free* memory (other tenants
    # make vLLM refuse to start when free < total x utilization), capped by the engine default.
    if "--gpu-memory-utilization" in pinned:
        utilization = pinned["--gpu-memory-utilization"]
        util_source, util_detail = PINNED, "pinned --gpu-memory-utilization"
    else:
        room = free_at_init - request.margin_bytes
        if request.max_gpu_memory_bytes is not None:
            room = min(room, request.max_gpu_memory_bytes - context)
        utilization = min(rules.default_utilization, vl.utilization_for(max(room, 0), total))
        util_source = ENGINE_DEFAULT if utilization == rules.default_utilization else FORMULA
        util_detail = (f"vLLM {rules.version} default" if util_source == ENGINE_DEFAULT
                       else f"free {format_gib(free)} - context {format_gib(context)} - margin "
                            f"{format_gib(request.margin_bytes)}" + (" (capped by --max-gpu-memory)"
                                                                     if request.max_gpu_memory_bytes else ""))
    if utilization <= 0:
        raise WontFit(f"{gpu.label} has {format_gib(free)} free: no room for vLLM at all")
    requested = vb.requested_bytes(total, utilization)
    if requested > free_at_init:
        raise WontFit(
            f"vLLM will refuse to start: free memory on {gpu.label} at start ~{format_gib(free_at_init)} is less "
            f"than --gpu-memory-utilization {utilization} x {format_gib(total)} = {format_gib(requested)}",
            hint="lower --gpu-memory-utilization or stop the other processes on the GPU")

    def budget_at(length: int) -> tuple[int, int, int]:
        batched, seqs = vb.resolve_batch(defaults=defaults, max_model_len=length,
                                         pinned_batched_tokens=pinned.get("--max-num-batched-tokens"),
                                         pinned_num_seqs=pinned.get("--max-num-seqs"),
                                         chunked_prefill=not pinned.get("--no-enable-chunked-prefill", False))
        activation = vb.activation_peak_bytes(geometry, batched_tokens=batched, num_seqs=min(seqs, batched), tp=tp)
        return batched, seqs, activation

    def kv_at(length: int) -> int:
        if "--kv-cache-memory-bytes" in pinned:
            return pinned["--kv-cache-memory-bytes"]
        if cal is not None and cal.non_kv_bytes is not None:
            return requested - cal.non_kv_bytes
        return requested - weights - non_torch - budget_at(length)[2] - cudagraph

    def capacity_at(length: int) -> KvCapacity:
        batched = budget_at(length)[0]
        return kv_capacity(setup.layout, kv_at(length), max_model_len=length,
                           in_flight_tokens=vl.in_flight_tokens(batched_tokens=batched, device="cuda", pp=pp))

    length, length_reason, capacity = _vllm_length(request, setup, capacity_at)
    batched, seqs, activation = budget_at(length)
    kv = kv_at(length)

    args: list[str] = []
    if "--gpu-memory-utilization" not in pinned and "--kv-cache-memory-bytes" not in pinned:
        args += ["--gpu-memory-utilization", f"{utilization:g}"]
    if "--max-model-len" not in pinned:
        args += ["--max-model-len", str(length)]

    calibrated = cal is not None and cal.non_kv_bytes is not None
    others = gpu.usable_total_bytes - free  # CUDA's view: the driver reserve is not a tenant
    items = [
        BudgetItem("total", "GPU total (CUDA)", total, CATALOG if gpu.source == "catalog" else MEASURED,
                   "cudaMemGetInfo total" + (" (catalog)" if gpu.cuda_total_bytes else
                                             " = NVML total - driver reserve" if gpu.reserved_bytes else
                                             " ~ NVML total - 2 % (not measured for this GPU)")),
        BudgetItem("other", "held by others", max(others, 0), MEASURED if gpu.source == "nvml" else CATALOG,
                   _tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", context, FORMULA,
                   "before vLLM's init snapshot; only tightens the startup check", bar="other"),
        BudgetItem("requested", f"requested = ceil(total x {utilization:g})", requested, util_source, util_detail),
        BudgetItem("weights", "weights (per rank)", weights, MEASURED,
                   model.weight_bytes_source + (f" / {tp * pp} ranks" if tp * pp > 1 else "")
                   + (f", less {format_gib(offloaded)} --cpu-offload-gb" if offloaded else ""), bar="weights"),
        BudgetItem("non_torch", "non-torch after snapshot", non_torch, FORMULA,
                   "cuBLAS/allocator growth; 0.03-0.43 GiB in published logs", bar="other"),
        BudgetItem("activation", "activation peak (profile run)", activation, FORMULA,
                   f"max of {batched} batched tokens x MLP/attention and the sampler's "
                   f"{min(seqs, batched)} x vocab fp32 rows ({defaults.reason})", bar="activations"),
        BudgetItem("cudagraph", "CUDA graph estimate", cudagraph, FORMULA if cudagraph else ENGINE_DEFAULT,
                   "--enforce-eager: no graphs" if eager else
                   ("not subtracted before vLLM 0.21" if not cudagraph else
                    f"{vb.CUDAGRAPH_BASE_BYTES // MiB} MiB + {vb.CUDAGRAPH_PER_LAYER_BYTES / MiB:.1f} MiB x layers"),
                   bar="graphs"),
        BudgetItem("kv", "KV cache", kv, PINNED if "--kv-cache-memory-bytes" in pinned else
                   (CALIBRATED if calibrated else FORMULA),
                   f"{capacity.num_blocks} blocks x {setup.layout.bytes_per_block} B "
                   f"({setup.layout.group_size} layers x {setup.layout.page_bytes} B page, block {setup.block})",
                   bar="kv"),
        BudgetItem("free", "left free", max(free_at_init - requested, 0), FORMULA,
                   "not requested by vLLM: margin for other tenants", bar="free"),
    ]
    if calibrated:
        # The engine's own measurement replaces our three estimates; the rows still add up.
        estimates = ("non_torch", "activation", "cudagraph")
        items = [i for i in items if i.key not in estimates]
        items.insert(-2, BudgetItem("measured_non_kv", "non-KV besides weights", cal.non_kv_bytes - weights,
                                    CALIBRATED, f"measured by vLLM at an earlier start ({cal.key})",
                                    bar="activations"))
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    if calibrated:
        notes.append(f"non-KV memory from an earlier start of the same configuration ({cal.key})")
    if setup.layout.padding_layers:
        notes.append(f"vLLM pads {setup.layout.padding_layers} layer(s) to even KV groups")
    return Plan(
        engine="vllm", engine_version=request.engine_version or vl.NEWEST, rules_version=rules.version,
        device="cuda", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=tuple(items), engine_args=tuple(args), engine_env={}, pinned=dict(pinned), tp=tp, pp=pp,
        gpu_memory_utilization=utilization, block_size=setup.block, num_blocks=capacity.num_blocks,
        gpu_name=gpu.name, gpu_count=len(devices), notes=tuple(notes),
    )


# --------------------------------------------------------------------------- vLLM on CPU


def _plan_vllm_cpu(request: PlanRequest) -> Plan:
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
        return batched, vb.activation_peak_bytes(geometry, batched_tokens=batched, num_seqs=min(seqs, batched),
                                                 tp=setup.tp, act_dtype_bytes=2)

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

    length, length_reason, capacity = _vllm_length(request, setup, capacity_at)
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
        BudgetItem("weights", "weights", weights, MEASURED, model.weight_bytes_source, bar="weights"),
        BudgetItem("activation", "activation peak", activation, FORMULA, f"{batched} batched tokens ({defaults.reason})",
                   bar="activations"),
        BudgetItem("kv", "KV cache (VLLM_CPU_KVCACHE_SPACE)", kv, space_source,
                   f"{space_detail}; {capacity.num_blocks} blocks x {setup.layout.bytes_per_block} B, block {setup.block}",
                   bar="kv"),
        BudgetItem("free", "left free", max(host.available_bytes - weights - activation - kv, 0), FORMULA,
                   "host RAM not planned for", bar="free"),
    )
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.block_reason) if n]
    return Plan(
        engine="vllm", engine_version=request.engine_version or vl.NEWEST, rules_version=setup.rules.version,
        device="cpu", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=capacity.tokens, max_concurrency=round(capacity.max_concurrency, 2),
        budget=items, engine_args=tuple(args), engine_env=env, pinned=dict(pinned), tp=setup.tp, pp=setup.pp,
        cpu_kvcache_space_gib=space_gib, block_size=setup.block, num_blocks=capacity.num_blocks,
        gpu_name="cpu", gpu_count=0, notes=tuple(notes),
    )


# --------------------------------------------------------------------------- SGLang


def _plan_sglang(request: PlanRequest) -> Plan:
    model, geometry = request.model, request.model.geometry
    rules, rules_note = sg.rules_for(request.engine_version)
    pinned = sg.pinned_flags(request.engine_args)
    tp, pp = ranks("sglang", pinned)
    devices = _rank_devices(request, tp * pp, pinned.get("--nnodes", 1))
    gpu = _tightest(devices)
    # SGLang's tier heuristic reads nvidia-smi's memory.total: the smallest card listed.
    gpu_mem_mib = min(d.total_bytes for d in (request.gpus or devices)) / MiB
    derivation = sg.default_fraction(geometry, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, pinned=pinned, rules=rules)
    context = sg.CUDA_CONTEXT_BYTES + (sg.NCCL_BYTES if tp * pp > 1 else 0)
    pre_load = min(d.free_bytes or 0 for d in devices) - context  # P: min over ranks
    cal = request.calibration
    load_overhead = cal.load_overhead_bytes if cal and cal.load_overhead_bytes is not None else sg.LOAD_OVERHEAD_BYTES
    weights = model.weight_bytes // (tp * pp)
    after_load = pre_load - weights - load_overhead  # A

    dtype, dtype_reason = vl.resolve_dtype(geometry, compute_capability=gpu.compute_capability, device="cuda",
                                           pinned=pinned.get("--dtype"))
    try:
        kv_elem, kv_reason = sg.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype, geometry)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cell = sg.cell_size_bytes(geometry, kv_bytes=kv_elem, tp=tp, pp=pp, pinned=pinned)
    page, page_reason = sg.default_page_size(geometry, gpu.compute_capability)
    if "--page-size" in pinned:
        page, page_reason = pinned["--page-size"], "pinned --page-size"
    if geometry.is_multimodal and not pinned.get("--language-only", False):
        after_load -= sg.MULTIMODAL_RESERVE_BYTES
    derived_len, derived_reason = sg.derived_context_length(geometry)
    context_len_pinned = pinned.get("--context-length")
    if context_len_pinned is not None and context_len_pinned > derived_len:
        raise WontFit(f"--context-length {context_len_pinned} is above the derived context length {derived_len} "
                      f"({derived_reason}); SGLang refuses it")

    def req_to_token_bytes(tokens: int, length: int) -> int:
        mrr = sg.max_running_requests(max(tokens, 2), length, pinned.get("--max-running-requests"))
        return (mrr + 1) * (length + 4) * 4

    # Fraction: pinned, or keep SGLang's absolute slack (its own reserve) against *free*
    # memory, so other tenants don't shrink the room for activations and graphs.
    if "--mem-fraction-static" in pinned:
        fraction_value = pinned["--mem-fraction-static"]
        f_source, f_detail = PINNED, "pinned --mem-fraction-static"
    else:
        # The slack SGLang's default leaves on this card when idle, kept in bytes.
        idle_pre_load = gpu.usable_total_bytes - context
        slack_needed = idle_pre_load * (1 - derivation.fraction) + request.margin_bytes
        room = pre_load
        if request.max_gpu_memory_bytes is not None:
            room = min(room, request.max_gpu_memory_bytes - context)
        from_free = floor_to(1 - (slack_needed + (pre_load - room)) / pre_load, 3) if pre_load > 0 else 0.0
        fraction_value = min(derivation.fraction, from_free)
        f_source = ENGINE_DEFAULT if fraction_value == derivation.fraction else FORMULA
        f_detail = (f"SGLang {rules.version} default: reserve {derivation.reserved_mib:.0f} MiB of {gpu_mem_mib:.0f} MiB"
                    if f_source == ENGINE_DEFAULT else
                    f"keeps the {format_gib(slack_needed - request.margin_bytes)} slack SGLang's default "
                    f"{derivation.fraction:g} leaves on an idle card, + margin, out of {format_gib(pre_load)} free")
    tokens, budget = sg.pool_tokens(pre_load_bytes=pre_load, after_load_bytes=after_load, fraction_value=fraction_value,
                                    cell_bytes=cell, page_size=page, max_total_tokens=pinned.get("--max-total-tokens"))
    if tokens <= 0:
        minimum = 1 - after_load / pre_load if pre_load > 0 else 1.0
        raise WontFit(f"SGLang will fail: the weights leave no KV pool under --mem-fraction-static "
                      f"{fraction_value:g} (minimum viable {minimum:.4f})",
                      hint="raise --mem-fraction-static, quantize, or use tensor parallel")
    if context_len_pinned is not None:
        length, length_reason = context_len_pinned, "pinned --context-length"
        if tokens < request.concurrency * length:
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
                   _tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", context, FORMULA, "before SGLang's pre-load baseline", bar="other"),
        BudgetItem("pre_load", "free at baseline (P)", pre_load, FORMULA, "min over ranks of free - context"),
        BudgetItem("weights", "weights (per rank)", weights, MEASURED, model.weight_bytes_source, bar="weights"),
        BudgetItem("load_overhead", "loader leftovers", load_overhead, CALIBRATED if cal else FORMULA,
                   "allocated between baseline and pool sizing besides weights", bar="other"),
        BudgetItem("slack", f"slack P x (1 - {fraction_value:g})", slack, f_source,
                   f"{f_detail}; activations, CUDA graphs and the {format_gib(req_table)} request table live here",
                   bar="activations"),
        BudgetItem("kv", "KV pool", kv, FORMULA,
                   f"{tokens} tokens x {cell:g} B/token (page {page}); budget {format_gib(budget)}", bar="kv"),
    )
    notes = [n for n in (rules_note, dtype_reason, kv_reason, page_reason) if n]
    notes.append(f"default fraction {derivation.fraction:g}: chunked prefill {derivation.chunked_prefill_size}, "
                 f"decode graph bs {derivation.decode_max_bs}, {derivation.prefill_buckets} prefill buckets"
                 + (", 10 GiB floor" if derivation.floor_applied else ""))
    return Plan(
        engine="sglang", engine_version=request.engine_version or sg.NEWEST, rules_version=rules.version,
        device="cuda", model=model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=kv, kv_cache_tokens=tokens, max_concurrency=round(tokens / length, 2) if length else 0.0,
        budget=items, engine_args=tuple(args), engine_env={}, pinned=dict(pinned), tp=tp, pp=pp,
        mem_fraction_static=fraction_value, block_size=page, gpu_name=gpu.name, gpu_count=len(devices),
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- alternatives


def alternatives_for(request: PlanRequest) -> tuple[str, ...]:
    """Each alternative is planned for real; only the ones that fit are offered."""
    found: list[str] = []
    args = list(request.engine_args)
    engine = engine_module(request.engine)
    length_flag, kv_flag_value, tp_flag = engine.LENGTH_FLAG, engine.FP8_KV, engine.TP_FLAG

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


def engine_decides(request: PlanRequest, refusal: SafeServeError) -> Plan:
    """`--trust-engine`: launch with the operator's flags only; the engine sizes itself.

    The plan carries no token prediction (nothing to diverge from); the watcher still
    retunes from the engine's own numbers when it refuses.
    """
    engine = engine_module(request.engine)
    pinned = engine.pinned_flags(request.engine_args)
    block = None
    if request.engine == "vllm":
        block, _ = vl.block_size(request.model.geometry, device=request.device, compute_capability=None,
                                 pinned=pinned.get("--block-size"),
                                 cpu_amx=request.host.cpu_amx if request.host else None)
    return Plan(
        engine=request.engine, engine_version=request.engine_version or engine.NEWEST,
        rules_version=engine.rules_for(request.engine_version)[0].version, device=request.device,
        model=request.model.name, max_model_len=pinned.get("--max-model-len") or pinned.get("--context-length") or 0,
        max_model_len_source="left to the engine (--trust-engine)", kv_cache_bytes=0, kv_cache_tokens=0,
        max_concurrency=0.0, budget=(), engine_args=(), engine_env={}, pinned=dict(pinned),
        tp=ranks(request.engine, pinned)[0], block_size=block,
        gpu_name=request.gpus[0].name if request.gpus else request.device, gpu_count=len(request.gpus),
        notes=(f"--trust-engine: safe-serve's plan refused ({refusal.message}); the engine decides",),
    )
