"""SGLang's planner: from a `PlanRequest` to `--mem-fraction-static`, `--context-length` and the pool.

SGLang sizes its pool from the free memory it saw before loading (P) and after (A):
`pool = A - P x (1 - fraction)`, in cells of `cell_size_bytes` per token, floored to the page
(`mem_cache/kv_cache_configurator.py`); the default fraction is SGLang's own reserve formula
(`default_fraction`, checked against SGLang's code in tests/data/sglang_oracle.json).

The plan runs in named steps: the setup (devices, start-time checks, cell and page), the
fraction, the length-independent `_Sizing` whose methods give each term, the length, then the
table: one row per figure of the frozen `SglangBudget`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import SafeServeError, UnsupportedModel, UsageError, WontFit
from launcher.common.units import MiB, floor_to, format_gib
from launcher.engines.checks_common import CheckInput, EngineRule, refuse_bad_argument
from launcher.engines.draft import request_without_draft
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.layers import request_with_cached_layers
from launcher.engines.online_quant import ELEMENT_BYTES
from launcher.engines.sglang import architectures as layouts
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import kv as sk
from launcher.engines.sglang import parameters
from launcher.engines.sglang import rules as sr
from launcher.engines.sglang.checks import start_checks
from launcher.engines.versions import version_key
from launcher.model.config import ModelGeometry
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
    COMPUTED,
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
    """The SGLang plan for `request` on its GPUs, or `WontFit`."""
    request = request_with_cached_layers(request, layouts.LAYER_PATTERNS)
    request = request_without_draft(request, engine="SGLang",
                                    speculating=request.pinned.get("--speculative-algorithm") not in (None, False),
                                    source="deepseek_common/deepseek_weight_loader.py:344 in 0.5.23")
    setup = _sglang_setup(request)
    deployment = request.concurrency
    # Under data-parallel attention each of the D groups has its own pool and SGLang hands requests round robin
    # (arg_groups/serving_hook.py:222-234 in 0.5.23): a pool carries its share of the concurrency.
    request = dataclasses.replace(request, concurrency=-(-deployment // setup.attn_dp))
    fraction = _fraction(request, setup)
    sizing = _pool_sizing(request, setup, fraction.value)
    central = sizing.central()
    request_cap = _state_request_cap(central, setup, concurrency=request.concurrency)
    pool, doubt = _planned_tokens(sizing, central.tokens)
    length, length_reason, doubt = _context_length(request, setup, pool, doubt)
    verified, architecture_note = layouts.architecture_status(setup.geometry, setup.rules)
    cap = (_pool_cap(sizing, central, pool, needed=request.concurrency * length)
           if verified and not doubt and request.cap_uncertain_pool else None)
    if cap is not None:
        pool = _PoolTokens(pool.low, cap.tokens, cap.tokens, capped=True)
        # The same length (the low end's, which the cap carries), its reason told of the capped pool.
        length, length_reason, doubt = _context_length(request, setup, pool, doubt)
    budget = sizing.budget(pool, length)
    tokens = pool.planned
    unverified_error = 0 if verified else int(budget.kv * layouts.UNVERIFIED_KV_ERROR_FRACTION)
    pinned, derivation = setup.pinned, setup.derivation
    return Plan(
        engine="sglang", engine_version=request.engine_version or sr.NEWEST, rules_version=setup.rules.version,
        device="cuda", model=request.model.name, max_model_len=length, max_model_len_source=length_reason,
        kv_cache_bytes=budget.kv, kv_cache_tokens=tokens,
        max_concurrency=setup.attn_dp * min(round(tokens / length, 2) if length else 0.0, request_cap or float("inf")),
        budget=_items(request, sizing, budget, central, fraction),
        engine_args=tuple(_args(pinned, fraction.value, length, cap)), engine_env={}, pinned=dict(pinned),
        tp=setup.tp, pp=setup.pp,
        knob=MemoryKnob("--mem-fraction-static", fraction.value, "fraction",
                        f"--mem-fraction-static {fraction.value:g}", fraction.detail),
        engine_figures={"mem_fraction_static": fraction.value, **({"max_total_tokens": cap.flag} if cap else {})},
        block_size=setup.page, gpu_name=setup.gpu.name, gpu_count=len(setup.devices),
        notes=(*_notes(setup), *_band_note(sizing, budget, verified), *((cap.note,) if cap else ())),
        engine_version_assumed=request.engine_version_assumed,
        architecture_verified=verified,
        warnings=(*not_modelled_warnings(pinned, sr.NOT_MODELLED), *(() if verified else (architecture_note,))),
        kv_cache_bytes_low=max(budget.kv_low - unverified_error, 0),
        kv_cache_bytes_high=budget.kv_high + unverified_error,
        may_not_fit=doubt, at_risk=_at_risk(pool, doubt),
        max_model_len_low_end=_longest(setup, pool.low, request.concurrency),
        max_model_len_central=_longest(setup, pool.planned, request.concurrency),
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


# --------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class _SglangSetup:
    """What the plan reads from the request and the engine's rules before any memory figure."""

    rules: sr.SglangRules
    rules_note: str | None
    pinned: Mapping[str, Any]
    geometry: ModelGeometry  # is_multimodal as SGLang runs the wrapper
    layout: layouts.SglangLayout
    tp: int
    pp: int
    devices: tuple[GpuDevice, ...]
    gpu: GpuDevice  # the tightest rank
    gpu_mem_mib: float  # what SGLang's tier heuristic reads
    derivation: sb.FractionDerivation  # SGLang's default fraction
    dtype: str
    dtype_reason: str
    derived_len: int
    derived_reason: str
    kv_reason: str
    cell: float  # bytes per token of the pool
    page: int
    page_reason: str
    measured_context: int | None = None  # measured at an earlier start of this setup (calibration)
    pool_rules: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the release's pool arithmetic
    attn_dp: int = 1  # data-parallel attention groups inside the TP group (attention over T / D ranks)
    attention_dp_weights: tuple[int, str] = (0, "")  # what a rank holds beyond its T share under attention DP

    @property
    def context(self) -> int:
        """CUDA context (+ NCCL with more than one rank), held before SGLang's pre-load baseline."""
        if self.measured_context is not None:
            return self.measured_context
        return sb.CUDA_CONTEXT_BYTES + self.parallel[0]

    @property
    def parallel(self) -> tuple[int, int]:
        """(bytes, +/- bytes) NCCL and the all-reduce buffers hold at the baseline, by board class."""
        return sb.parallel_bytes(self.gpu.name, self.gpu.compute_capability, self.tp * self.pp)

    @property
    def context_error(self) -> int:
        """+/- on `context`: the CUDA context's and the parallel term's, or the measurement's."""
        if self.measured_context is not None:
            return sb.MEASURED_CONTEXT_ERROR_BYTES
        return sb.CONTEXT_ERROR_BYTES + self.parallel[1]


def _data_parallel(pinned: Mapping[str, Any], geometry: ModelGeometry, rules: sr.SglangRules,
                   tp: int) -> tuple[int, int]:
    """(replicas, attention-DP groups): the data-parallel replicas (each planned alone, on the tightest of all
    their GPUs) and what SGLang refuses about them; data-parallel attention where it is sized
(`_attention_dp_unsized`);
    expert-parallel dispatch, which this planner does not size yet.

    An all-to-all MoE backend replicates the shared experts and allocates its buffers after the pool is sized;
    redundant experts add experts a rank (srt/layers/moe in 0.5.23). A plan from the plain T split would promise
    KV that is not there."""
    version = rules.version
    replicas, attention_dp = sr.data_parallel(pinned)
    if replicas > 1 and attention_dp > 1:
        _refuse_what_sglang_refuses((EngineRule(
            "dp-replicas-with-attn-dp", f"--dp-size {replicas} with --attn-dp-size {attention_dp}: data-parallel "
            "replicas combined with attention data parallelism are not supported.",
            "sglang/srt/arg_groups/parallel_hook.py:287-292 (SGLang 0.5.23)", hint="one of the two"),))
    if replicas > 1 and int(pinned.get("--nnodes", 1)) > 1:
        since_023 = version_key(version) >= version_key("0.5.23")
        _refuse_what_sglang_refuses((EngineRule(
            "dp-replicas-multi-node",
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
            if since_023 else "multi-node data parallel is not supported unless dp attention!",
            "sglang/srt/arg_groups/validation_hook.py:198-201 (SGLang 0.5.23)" if since_023
            else "sglang/srt/server_args.py:5143-5145 (SGLang 0.5.9)", hint="replicas on one node each"),))
    dense_tp = pinned.get("--moe-dense-tp-size")
    if dense_tp is not None and dense_tp not in (1, tp) and version_key(version) >= version_key("0.5.22"):
        _refuse_what_sglang_refuses((EngineRule(
            "moe-dense-tp-size", "moe_dense_tp_size only supports None, 1, or tp_size currently",
            "sglang/srt/arg_groups/validation_hook.py:207-211 (SGLang 0.5.23)",
            hint=f"--moe-dense-tp-size 1 or {tp}"),))
    mrr = pinned.get("--max-running-requests")
    if attention_dp > 1 and mrr is not None and mrr // attention_dp < 1 \
            and version_key(version) < version_key("0.5.23"):
        # 0.5.22 divides without a floor of 1 (mem_cache/kv_cache_configurator.py:2809); 0.5.23 keeps 1.
        _refuse_what_sglang_refuses((EngineRule(
            "requests-per-dp-rank", "max_running_request is zero",
            "sglang/srt/managers/tp_worker.py:413 (SGLang 0.5.22)",
            hint=f"--max-running-requests {attention_dp} or more (it is divided by --attn-dp-size {attention_dp})"),))
    if attention_dp > 1 and tp % attention_dp:
        _refuse_what_sglang_refuses((EngineRule(
            "attn-dp-divides-tp", f"assert tp_size % attn_dp_size == 0 ({tp} % {attention_dp}; an AssertionError "
            "without a message)", "sglang/srt/arg_groups/parallel_hook.py:326 (SGLang 0.5.23)",
            hint=f"--attn-dp-size that divides {tp}"),))
    backend = str(pinned.get("--moe-a2a-backend") or "none")
    redundant = int(pinned.get("--ep-num-redundant-experts") or 0)
    attention_cp = int(pinned.get("--attn-cp-size") or 1)
    unsized = [why for why in (
        f"attention context parallelism ({attention_cp}: attention over T / D / CP ranks)" if attention_cp > 1
        else "",
        _attention_dp_unsized(pinned, geometry, rules, attention_dp, tp),
        f"{backend} all-to-all MoE backend (shared experts whole on every rank, buffers allocated after the pool "
        "is sized)" if backend != "none" else "",
        f"{redundant} redundant experts (more experts a rank)" if redundant > 0 else "",
    ) if why]
    if unsized:
        raise UnsupportedModel(f"not sized by safe-serve yet: SGLang's {'; '.join(unsized)}: a plan from the plain "
                               "tensor-parallel split would promise KV cache that is not there",
                               hint="--trust-engine (SGLang sizes itself; the watch still checks its KV lines), or "
                                    "plain --tp-size / --dp-size replicas")
    return replicas, attention_dp


def _attention_dp_unsized(pinned: Mapping[str, Any], geometry: ModelGeometry, rules: sr.SglangRules,
                          attention_dp: int, tp: int) -> str:
    """Why data-parallel attention is not sized here, or "": sized from 0.5.22 (SglangRules.dp_attention_sized)
    for the models whose attention SGLang builds over T / D (parameters.DP_ATTENTION_ARCHITECTURES), with the
    lm_head and dense MLPs on their T split."""
    if attention_dp <= 1:
        return ""
    what = f"data-parallel attention ({attention_dp} groups: attention split by T/D, its own default fraction and " \
           "request limits)"
    if not rules.dp_attention_sized:
        return f"{what} in releases before 0.5.22"
    if geometry.architecture not in parameters.DP_ATTENTION_ARCHITECTURES:
        return f"{what} for {geometry.architecture}"
    pinned_off = ["--enable-dp-lm-head"] if pinned.get("--enable-dp-lm-head") else []
    if pinned.get("--quantization") and geometry.quantization is None:  # a 16-bit checkpoint quantized on load
        pinned_off.append("--quantization")
    if pinned.get("--moe-dense-tp-size") not in (None, tp):  # 1: the dense MLPs whole on every rank
        pinned_off.append("--moe-dense-tp-size")
    if pinned_off:
        return f"{what} with {', '.join(pinned_off)}"
    if parameters.attention_dp_extra(geometry, tp=tp, attn_tp=max(tp // attention_dp, 1), dtype_element=2) is None:
        method = geometry.quantization.method if geometry.quantization else "none"
        return f"{what} for a {method} checkpoint (its attention bytes not derived)"
    return ""


def _sglang_setup(request: PlanRequest) -> _SglangSetup:
    """Devices, SGLang's default fraction, its start-time refusals, then the cell and page sizes."""
    if request.device == "cpu":
        raise UsageError("SGLang on CPU is not planned yet: use --engine vllm --device cpu")
    geometry = request.model.geometry
    rules, rules_note = sr.rules_for(request.engine_version)
    pinned = request.pinned.values
    # SGLang's own config classes may refuse the config; state families it has no model class for are
    # refused there too (--trust-engine lets SGLang decide).
    layout = layouts.layout(geometry, rules)
    # SGLang runs some wrappers text-only unless --enable-multimodal (configs/model_config.py:690-717).
    geometry = dataclasses.replace(geometry, is_multimodal=layouts.multimodal(geometry, pinned))
    tp, pp = sr.ranks(pinned)
    replicas, attn_dp = _data_parallel(pinned, geometry, rules, tp)
    devices = rank_devices(request, tp * pp * replicas, pinned.get("--nnodes", 1), tp_flag=sr.TP_FLAG,
                           kind="tensor x pipeline parallel" + (f", {replicas} data-parallel replicas" if replicas > 1
                                                                 else ""))
    gpu = tightest(devices)
    # SGLang's tier heuristic reads nvidia-smi's memory.total: the smallest card listed.
    gpu_mem_mib = min(d.total_bytes for d in (request.gpus or devices)) / MiB
    derivation = sb.default_fraction(geometry, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, pinned=pinned, rules=rules,
                                     compute_capability=gpu.compute_capability, model_path=request.model.name,
                                     attn_dp=attn_dp)
    dtype, dtype_reason = resolve_dtype(geometry, compute_capability=gpu.compute_capability, device="cuda",
                                           pinned=pinned.get("--dtype"))
    derived_len, derived_reason = sr.derived_context_length(geometry)
    _refuse_what_sglang_refuses(start_checks(CheckInput(
        geometry=geometry, device="cuda", compute_capability=gpu.compute_capability, gpu_count=len(request.gpus),
        # the heads split over the attention-TP group (models/qwen3_moe.py:502-517 asserts on attn_tp_size)
        tp=tp // attn_dp, pp=pp, dtype=dtype, kv_cache_dtype=pinned.get("--kv-cache-dtype"),
        block_size=pinned.get("--page-size"),
        max_model_len=pinned.get("--context-length"), model_max_len=derived_len, engine_version=request.engine_version,
        gpu_name=gpu.name, allow_long_max_model_len=request.allow_long_max_model_len,
        quantization=pinned.get("--quantization"), pinned_dtype=pinned.get("--dtype"),
        attention_backend=pinned.get("--attention-backend"))))
    moe_refusal = sb.mxfp4_runner_refusal(geometry, version=rules.version,
                                          moe_runner_backend=pinned.get("--moe-runner-backend"),
                                          compute_capability=gpu.compute_capability)
    if moe_refusal is not None:
        _refuse_what_sglang_refuses((EngineRule("moe-runner-backend", moe_refusal[0], moe_refusal[1],
                                                hint="--moe-runner-backend auto (SGLang's own pick for gpt-oss)"),))
    try:  # after the engine's own checks: what it refuses is its refusal, not our sizing gap
        kv_elem, kv_reason = sk.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), dtype, geometry)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    attn_tp = tp // attn_dp  # the pool holds the KV heads of the attention-TP group (model_config.py:1700-1711)
    cell = layouts.cell_size_bytes(layout, kv_bytes=kv_elem, kv_fp8=kv_elem == 1, tp=attn_tp, pp=pp, pinned=pinned,
                                   rules=rules)
    page, page_reason = _page_size(geometry, gpu, pinned, rules)
    if attn_dp > 1 and derivation.chunked_prefill_size > 0 and page > 1 and derivation.chunked_prefill_size % page:
        _refuse_what_sglang_refuses((EngineRule(
            "chunk-divisible-by-page", "chunked_prefill_size must be divisible by page_size",
            "sglang/srt/arg_groups/validation_hook.py:242-246 (SGLang 0.5.23)",
            hint=f"--chunked-prefill-size a multiple of {page} x {attn_dp} (it is divided by the attention-DP "
                 "groups first)"),))
    measured = request.calibration.context_bytes if request.calibration else None
    extra = (0, "")
    if attn_dp > 1:
        extra = parameters.attention_dp_extra(geometry, tp=tp, attn_tp=attn_tp,
                                              dtype_element=ELEMENT_BYTES.get(dtype, 2)) or (0, "")
    return _SglangSetup(rules, rules_note, pinned, geometry, layout, tp, pp, devices, gpu, gpu_mem_mib, derivation,
                        dtype, dtype_reason, derived_len, derived_reason, kv_reason, cell, page, page_reason, measured,
                        pool_rules=layouts.pool_rules(layout, rules=rules, pinned=pinned, kv_bytes=kv_elem, tp=attn_tp,
                                                      pp=pp), attn_dp=attn_dp, attention_dp_weights=extra)


def _refuse_what_sglang_refuses(refusals: tuple[EngineRule, ...]) -> None:
    """The first start-time rule SGLang would stop on, as a refusal (exit 78) before any budget;
    an argument its argparse refuses first, as a usage error (exit 2)."""
    refuse_bad_argument(refusals, "SGLang")
    if refusals:
        first = refusals[0]
        raise WontFit(f"SGLang refuses this at start: {' '.join(first.message.split())} [{first.source}]",
                      hint=first.hint, rule=first.rule, source=first.source)


# DeepSeek V3/R1/V3.1 on Blackwell: trtllm_mla unless a backend is pinned (0.5.23
# arg_groups/model_overrides/deepseek_v2.py:178-188 for the family it registers, :37-50; 0.5.9 server_args.py:1276-1286
# for DeepseekV3ForCausalLM), whose pages are 32 or 64 tokens.
TRTLLM_MLA_ON_SM100 = frozenset({"DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration",
                                 "MistralLarge3ForCausalLM"})


def _page_size(geometry: ModelGeometry, gpu: GpuDevice, pinned: Mapping[str, Any],
               rules: sr.SglangRules) -> tuple[int, str]:
    """Pinned --page-size, DeepSeek DSA's pages, or SGLang's default for this card; then what the MLA backend
    forces: FlashMLA 64, TensorRT-LLM / CuteDSL MLA 32 or 64 (arg_groups/overrides.py:1145-1175 in 0.5.23)."""
    backend = pinned.get("--attention-backend")
    why_backend = f"pinned --attention-backend {backend}"
    if backend is None and geometry.mla is not None and gpu.compute_capability is not None \
            and gpu.compute_capability[0] == 10 and version_key(rules.version) >= version_key("0.5.9") \
            and geometry.architecture in TRTLLM_MLA_ON_SM100 and layouts.dsa_page_size(geometry) is None:
        backend, why_backend = "trtllm_mla", "trtllm_mla, SGLang's MLA backend for this model on Blackwell"
    if "--page-size" in pinned:
        page, why = pinned["--page-size"], "pinned --page-size"
    elif (dsa := layouts.dsa_page_size(geometry)) is not None:
        page, why = dsa, f"DeepSeek DSA pages of {dsa} tokens (arg_groups/model_overrides/deepseek_v2.py:161-173)"
    else:
        page, why = sk.default_page_size(geometry, gpu.compute_capability)
    if backend == "flashmla" and page != 64:
        return 64, f"{why_backend}: FlashMLA pages of 64 (arg_groups/overrides.py:1147-1154)"
    if backend in ("trtllm_mla", "cutedsl_mla") and page not in (32, 64):
        return 64, f"{why_backend}: pages of 64 (arg_groups/overrides.py:1155-1173)"
    return page, why


# --------------------------------------------------------------------------- fraction


@dataclass(frozen=True)
class _Fraction:
    value: float
    source: str
    detail: str


def _fraction(request: PlanRequest, setup: _SglangSetup) -> _Fraction:
    """Pinned, or keep SGLang's absolute slack (its own reserve) against *free* memory, so other
    tenants don't shrink the room for activations and graphs."""
    if "--mem-fraction-static" in setup.pinned:
        return _Fraction(setup.pinned["--mem-fraction-static"], PINNED, "pinned --mem-fraction-static")
    gpu, derivation, context, cal = setup.gpu, setup.derivation, setup.context, request.calibration
    pre_load = _pre_load(setup)
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


def _pre_load(setup: _SglangSetup) -> int:
    """P: SGLang's pre-load baseline, the least free memory over the ranks less the CUDA context."""
    return min(d.free_bytes or 0 for d in setup.devices) - setup.context


# --------------------------------------------------------------------------- the budget


@dataclass(frozen=True)
class SglangBudget:
    """SGLang's budget on the tightest rank (bytes): each figure is a row of the plan's table."""

    total: int  # NVML total of the tightest rank
    others: int  # held by other processes
    context: int  # CUDA context (+ NCCL)
    pre_load: int  # P: free at SGLang's baseline
    weights: int  # per rank
    load_overhead: int  # loader leftovers between P and A besides the weights
    slack: int  # P x (1 - fraction): activations, CUDA graphs and the request table
    request_table: int  # req_to_token at the planned length, inside the slack
    tokens: int  # the pool's tokens the length is planned on
    kv: int  # the KV pool at those tokens
    kv_low: int  # the band's ends on the KV bytes (unverified layouts widen them further)
    kv_high: int


@dataclass(frozen=True)
class _Sizing:
    """Everything the pool depends on; its methods give each term of `SglangBudget`."""

    setup: _SglangSetup
    fraction: float
    pre_load: int  # P
    weights: int
    load: sb.LoadOverhead  # derived, estimated or measured at an earlier start
    after_load: int  # A (less SGLang's multimodal reserve)
    state_slot: int | None
    state_ratio: float
    # The favourable end of the error band: our CUDA-context and loader estimates too high, and on a
    # catalog card (free = its CUDA total) the spread of the totals published for it.
    context_error: int
    online: sb.OnlineQuantized | None = None  # weights quantized while loading (--quantization fp8)
    as_loaded: sb.Mxfp4AsLoaded | None = None  # gpt-oss's MXFP4 experts re-laid out after loading

    def pool_at(self, pre_load: int, after_load: int, *, max_total_tokens: int | None = None) -> layouts.PoolSizing:
        """The pool SGLang sizes from P and A; `max_total_tokens` stands for the flag the plan adds."""
        pinned = self.setup.pinned
        return layouts.pool(pre_load_bytes=pre_load, after_load_bytes=after_load, fraction_value=self.fraction,
                            cell_bytes=self.setup.cell, page_size=self.setup.page,
                            max_total_tokens=max_total_tokens or pinned.get("--max-total-tokens"),
                            state_slot=self.state_slot,
                            state_ratio=self.state_ratio,
                            context_len=pinned.get("--context-length") or self.setup.derived_len,
                            **self.setup.pool_rules)

    def central(self) -> layouts.PoolSizing:
        return self.pool_at(self.pre_load, self.after_load)

    @property
    def after_load_error(self) -> int:
        """+/- on A beyond P's: the loader's leftovers and the weights quantized or re-laid out while loading."""
        return self.load.error_bytes + self.weights_error

    @property
    def weights_error(self) -> int:
        """+/- on the weights as loaded: quantized while loading, or the MXFP4 experts' layout."""
        return ((self.online.error_bytes if self.online is not None else 0)
                + (self.as_loaded.error_bytes if self.as_loaded is not None else 0))

    def favourable(self) -> layouts.PoolSizing:
        return self.pool_at(self.pre_load + self.context_error, self.after_load + self.context_error
                            + self.after_load_error)

    def unfavourable(self) -> layouts.PoolSizing:
        """Our CUDA-context, loader and weights estimates too low (and a catalog card's total at its lowest)."""
        return self.pool_at(self.pre_load - self.context_error, self.after_load - self.context_error
                            - self.after_load_error)

    def minimum_fraction(self) -> float:
        """The least fraction that leaves any pool at the central estimate."""
        return 1 - self.after_load / self.pre_load if self.pre_load > 0 else 1.0

    def request_table(self, tokens: int, length: int) -> int:
        """req_to_token: (max running requests + 1) x (length + 4) int32 (`resolve_max_num_reqs`). Before 0.5.11
        the request limit comes from the tokens profiled, before a --max-total-tokens cap (0.5.9
        model_runner_kv_cache_mixin.py:364-385)."""
        if self.setup.rules.requests_before_pp_min:
            tokens = self.central().profiled_tokens or tokens
        mrr = layouts.running_requests(max(tokens, 2), length, _rank_requests(self.setup),
                                       self.setup.rules)
        return (mrr + 1) * (length + 4) * 4

    def budget(self, pool: _PoolTokens, length: int) -> SglangBudget:
        """The rows at the planned tokens and `length`; the band from the pool at either end."""
        gpu, cell, tokens = self.setup.gpu, self.setup.cell, pool.planned
        return SglangBudget(
            total=gpu.total_bytes, others=max(gpu.usable_total_bytes - (gpu.free_bytes or 0), 0),
            context=self.setup.context, pre_load=self.pre_load, weights=self.weights,
            load_overhead=self.load.bytes, slack=int(self.pre_load * (1 - self.fraction)),
            request_table=self.request_table(tokens, length), tokens=tokens, kv=int(tokens * cell),
            kv_low=int(max(pool.low, 0) * cell), kv_high=int(max(pool.high, tokens) * cell))


def _rank_requests(setup: _SglangSetup) -> int | None:
    """A pinned --max-running-requests as one rank takes it: divided by the attention-DP groups
    (0.5.23 mem_cache/kv_cache_configurator.py:3119-3131)."""
    pinned = setup.pinned.get("--max-running-requests")
    return None if pinned is None else max(1, int(pinned) // setup.attn_dp)


def _pool_sizing(request: PlanRequest, setup: _SglangSetup, fraction: float) -> _Sizing:
    """P, the weights, the loader's leftovers and A, with the errors of the estimated terms."""
    cal, gpu = request.calibration, setup.gpu
    online = sb.online_quantized(setup.geometry, quantization=setup.pinned.get("--quantization"),
                                 checkpoint_bytes=request.model.weight_bytes, model_dtype=setup.dtype,
                                 tp=setup.tp, pp=setup.pp)
    # gpt-oss's MXFP4 experts as the card's MoE kernels hold them after loading (sglang/budget.py): counted
    # with the weights; the loader's leftovers stay the bounded estimate of the allocator's rounding.
    as_loaded = sb.mxfp4_as_loaded(setup.geometry, version=setup.rules.version, tp=setup.tp, pp=setup.pp,
                                   compute_capability=gpu.compute_capability,
                                   moe_runner_backend=setup.pinned.get("--moe-runner-backend"),
                                   quantization=setup.pinned.get("--quantization"))
    load = sb.load_overhead(setup.geometry, dtype=setup.dtype, tp=setup.tp, pp=setup.pp,
                            quantized_online=online is not None, compute_capability=gpu.compute_capability,
                            attn_tp=setup.tp // setup.attn_dp)
    if cal is not None and cal.load_overhead_bytes is not None:
        load = sb.LoadOverhead(cal.load_overhead_bytes, 0, f"measured at an earlier start ({cal.key})")
    pre_load = _pre_load(setup)
    weights = request.model.weight_bytes // (setup.tp * setup.pp) + setup.attention_dp_weights[0]
    if online is not None:
        _refuse_the_16_bit_load_peak(online, pre_load)
        weights = online.bytes
    if as_loaded is not None:
        weights += as_loaded.extra_bytes
    after_load = pre_load - weights - load.bytes
    if setup.geometry.is_multimodal and not setup.pinned.get("--language-only", False) and setup.rules.mm_kv_reserve:
        after_load -= sb.MULTIMODAL_RESERVE_BYTES
    return _Sizing(
        setup=setup, fraction=fraction, pre_load=pre_load, weights=weights, load=load,
        after_load=after_load, state_slot=_state_slot(setup),
        state_ratio=float(setup.pinned.get("--mamba-full-memory-ratio", layouts.DEFAULT_MAMBA_FULL_MEMORY_RATIO)),
        context_error=setup.context_error + (gpu.usable_total_error_bytes if gpu.source == "catalog" else 0),
        online=online, as_loaded=as_loaded)


def _refuse_the_16_bit_load_peak(online: sb.OnlineQuantized, pre_load: int) -> None:
    """Under online fp8 SGLang allocates every 16-bit weight before quantizing any (sglang/budget.py)."""
    if online.peak_bytes > pre_load:
        raise WontFit(f"SGLang runs out of memory while loading: --quantization fp8 allocates the 16-bit weights "
                      f"({format_gib(online.peak_bytes)} per rank) before quantizing them, with "
                      f"{format_gib(pre_load)} free at its baseline",
                      hint="a checkpoint quantized ahead (an fp8, AWQ or GPTQ repository), or tensor parallel")


# --------------------------------------------------------------------------- tokens and length


@dataclass(frozen=True)
class _PoolTokens:
    """The pool's tokens at the band's unfavourable end, as planned (the central estimate, or the
    favourable end where only it has a pool), and at the favourable end."""

    low: int
    planned: int
    high: int
    capped: bool = False  # planned and high are the --max-total-tokens cap the plan adds


def _planned_tokens(sizing: _Sizing, tokens: int) -> tuple[_PoolTokens, str | None]:
    """The pool the length is planned on, and the doubt when only the favourable end has one."""
    tokens_high = sizing.favourable().tokens
    if tokens > 0:
        return _PoolTokens(sizing.unfavourable().tokens, tokens, tokens_high), None
    fraction, minimum = sizing.fraction, sizing.minimum_fraction()
    if tokens_high <= 0:
        hint = ("raise --mem-fraction-static, quantize, or use tensor parallel" if minimum < 0.99 else
                "no --mem-fraction-static can fit: the weights alone need more than the free memory; "
                "quantize or use tensor parallel")
        raise WontFit(f"SGLang will fail: the weights leave no KV pool under --mem-fraction-static "
                      f"{fraction:g} (minimum viable {minimum:.4f})", hint=hint)
    # Plan the length on what may be there; the band keeps the central 0.
    return _PoolTokens(0, tokens_high, tokens_high), (
        f"the weights leave a KV pool under --mem-fraction-static {fraction:g} only at the favourable end of "
        f"the estimate (minimum viable {minimum:.4f} at the central estimate)")


@dataclass(frozen=True)
class _PoolCap:
    """`--max-total-tokens` where the estimate's band is wider than BAND_TARGET, and why."""

    flag: int  # the value passed
    tokens: int  # the pool SGLang makes of it at the central estimate
    note: str


def _pool_cap(sizing: _Sizing, central: layouts.PoolSizing, pool: _PoolTokens, *, needed: int) -> _PoolCap | None:
    """Cap the pool where its estimate is too uncertain to promise (issue 20: a band over +/- 5 %).

    SGLang takes the smaller of `--max-total-tokens` and the pool it profiled (0.5.23
    mem_cache/kv_cache_configurator.py:3096-3107; 0.5.9 model_runner_kv_cache_mixin.py:378-385;
    0.5.2 model_runner.py:1288-1295). A cap at the band's low end / (1 - BAND_TARGET) makes the pool
    that cap, or no less than the low end: within +/- 5 % of the figure planned wherever the band
    holds. What lies above the cap stays free. The length is planned on the low end either way.
    A hybrid sliding-window pool: from 0.5.11 the cap bounds the full pool and the sliding pool follows
    at the ratio (0.5.11 pool_configurator.py:238-284, 0.5.23 :859-921); 0.5.9-0.5.10 cap the tokens
    profiled over both and split them afterwards (0.5.9 model_runner_kv_cache_mixin.py:255-412), so the
    flag there is the full pool wanted scaled back by that split. The pool planned is what the release's
    own arithmetic makes of the flag (`layouts.pool`). Left as they are: a state pool, data-parallel
    attention, an operator's own cap and a pinned length the capped pool would not carry."""
    setup = sizing.setup
    # A flag whose memory the plan does not count (a speculative draft's pool, LoRA buffers) leaves the low end
    # no floor: no cap to promise one.
    if ("--max-total-tokens" in setup.pinned or setup.attn_dp > 1 or sizing.state_slot is not None
            or pool.low <= 0 or any(flag in setup.pinned for flag in sr.NOT_MODELLED)):
        return None
    planned = pool.planned
    if max(planned - pool.low, pool.high - planned) <= BAND_TARGET * planned:
        return None
    wanted = int(pool.low / (1 - BAND_TARGET)) // setup.page * setup.page
    flag = wanted
    split, ratio = setup.pool_rules.get("swa_split"), setup.pool_rules.get("swa_ratio")
    if central.swa_tokens is not None and split is not None and ratio is not None and split.full_part > 0:
        flag = split.split_total(wanted, ratio) // setup.page * setup.page
    tokens = sizing.pool_at(sizing.pre_load, sizing.after_load, max_total_tokens=flag).tokens
    if tokens >= planned or tokens < max(needed, pool.low):
        return None
    cell = setup.cell
    return _PoolCap(flag, tokens, (
        f"KV pool capped at {tokens} tokens (--max-total-tokens {flag}): the estimate spans {pool.low}-"
        f"{pool.high} tokens ({format_gib(pool.low * cell)}-{format_gib(pool.high * cell)}; {planned} central) "
        f"through {_terms_at_risk(sizing)}; SGLang keeps the smaller of the cap and what it profiles, so the pool "
        f"is {tokens} tokens, or no less than {pool.low}, and what lies above the cap stays free. Pin "
        "--max-total-tokens to choose another cap; a start on this GPU measures the CUDA context and narrows "
        "the next plan's band"))


def _context_length(request: PlanRequest, setup: _SglangSetup, pool: _PoolTokens,
                    doubt: str | None) -> tuple[int, str, str | None]:
    """(length, why, doubt): a pinned --context-length checked against the pool, or the longest that
    carries `concurrency` requests at the band's unfavourable end, up to the derived length (issue
    20: a length that holds only at the central estimate says so)."""
    length = setup.pinned.get("--context-length")
    concurrency, tokens = request.concurrency, pool.planned
    if length is not None:
        return length, "pinned --context-length", _pinned_length_doubt(pool, length, concurrency, doubt)
    safe = min(setup.derived_len, pool.low // concurrency // setup.page * setup.page)
    if safe > 0:
        return safe, (f"model maximum ({setup.derived_reason})" if safe == setup.derived_len else
                      f"longest that fits {concurrency} request(s) at the band's low end ({pool.low} tokens; "
                      f"{tokens} {'under the --max-total-tokens cap' if pool.capped else 'at the central estimate'}; "
                      "SGLang caps requests at the pool silently)"), doubt
    length = min(setup.derived_len, tokens // concurrency // setup.page * setup.page)
    if length <= 0:
        raise WontFit(f"the pool holds only {tokens} tokens: not one per request for {concurrency}")
    doubt = doubt or (f"{concurrency} request(s) of {length} tokens fit the pool only at the central estimate "
                      f"({pool.low} tokens at the band's low end): the context length is at risk")
    return length, (f"model maximum ({setup.derived_reason})" if length == setup.derived_len
                    else f"longest that fits {concurrency} request(s) in the pool (SGLang would cap "
                         f"silently at {tokens} tokens)"), doubt


def _longest(setup: _SglangSetup, pool_tokens: int, concurrency: int) -> int:
    """The longest context carrying `concurrency` requests in a pool of `pool_tokens` (0: none)."""
    return max(min(setup.derived_len, pool_tokens // concurrency // setup.page * setup.page), 0)


def _at_risk(pool: _PoolTokens, doubt: str | None) -> tuple[str, ...]:
    """The figures a doubt is about, by their JSON names: the length (and with it the concurrency)
    where only the central pool carries it; the fraction too where only the favourable end has a pool."""
    if doubt is None:
        return ()
    return ("mem_fraction_static", "max_model_len") if pool.low <= 0 else ("max_model_len",)


def _pinned_length_doubt(pool: _PoolTokens, length: int, concurrency: int, doubt: str | None) -> str | None:
    """A pinned --context-length against the pool: refused beyond the favourable end, doubted where it
    holds only at the central estimate or above the low end. Above the derived length is start_checks'
    to decide (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)."""
    needed, tokens = concurrency * length, pool.planned
    if tokens < needed <= pool.high:
        return (f"the pool holds ~{tokens} tokens at the central estimate ({pool.high} at best): "
                f"{concurrency} request(s) of {length} may not fit")
    if tokens < needed:
        raise WontFit(f"the pool holds {tokens} tokens: {concurrency} request(s) of {length} do not fit; "
                      "SGLang would cap requests at the pool size silently")
    if pool.low < needed and doubt is None:
        return (f"the pool holds {tokens} tokens at the central estimate but {pool.low} at the band's low "
                f"end: {concurrency} request(s) of {length} may not fit (the context length is at risk)")
    return doubt


# --------------------------------------------------------------------------- state pool


def _state_slot(setup: _SglangSetup) -> int | None:
    """Bytes of one request's linear/Mamba state on the fullest stage, or None without state layers."""
    layout = setup.layout
    if layout.state is None or not layout.state.layers:
        return None
    return layouts.state_slot_bytes(layout.state, tp=setup.tp, ssm_dtype=setup.pinned.get("--mamba-ssm-dtype"),
                                    pp=setup.pp, num_layers=layout.num_layers, rules=setup.rules)


def _state_request_cap(sizing: layouts.PoolSizing, setup: _SglangSetup, *, concurrency: int) -> int | None:
    """Requests the state pool lets SGLang run at once (`resolve_max_num_reqs`, kv_cache_configurator.py:3119-3170)."""
    if sizing.state_slots is None:
        return None
    per_request = layouts.state_slots_per_request(setup.geometry.architecture, setup.pinned, pp=setup.pp,
                                                  rules=setup.rules)
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


# --------------------------------------------------------------------------- the table


def _items(request: PlanRequest, sizing: _Sizing, budget: SglangBudget, central: layouts.PoolSizing,
           fraction: _Fraction) -> tuple[BudgetItem, ...]:
    """The table: one row per figure of `SglangBudget`, with where each figure comes from."""
    setup, model, gpu = sizing.setup, request.model, sizing.setup.gpu
    gpu_source = MEASURED if gpu.source == "nvml" else CATALOG
    as_loaded = sizing.as_loaded
    return (
        BudgetItem("total", "GPU total (NVML)", budget.total, PINNED if gpu.size_given else gpu_source,
                   ("the --gpu size given, taken as the NVML and CUDA total; " if gpu.size_given else "")
                   + f"tier heuristic uses {setup.gpu_mem_mib:.0f} MiB"),
        BudgetItem("other", "held by others", budget.others, gpu_source, tenants_detail(gpu), bar="other"),
        BudgetItem("context", "CUDA context (+NCCL)", budget.context,
                   FORMULA if setup.measured_context is None else CALIBRATED,
                   "before SGLang's pre-load baseline: " + (
                       "the driver's and PyTorch's (+ NCCL by board class), from the first free-memory readings "
                       "of published logs (sglang/budget.py)" if setup.measured_context is None else
                       f"measured at an earlier start ({request.calibration.key if request.calibration else ''})"),
                   bar="other", error_bytes=setup.context_error),
        BudgetItem("pre_load", "free at baseline (P)", budget.pre_load, FORMULA, "min over ranks of free - context",
                   error_bytes=sizing.context_error),
        BudgetItem("weights", "weights (per rank)", budget.weights,
                   COMPUTED if sizing.online or as_loaded or setup.attention_dp_weights[0] else weights_source(model),
                   model.weight_bytes_source
                   + (f" / {setup.tp} ranks, + {setup.attention_dp_weights[1]}" if setup.attention_dp_weights[0]
                      else "")
                   + (f", as loaded {format_gib(budget.weights)} ({sizing.online.rule}; 16-bit load peak "
                      f"{format_gib(sizing.online.peak_bytes)})" if sizing.online else "")
                   + (f", as loaded {format_gib(budget.weights)}: {as_loaded.extra_bytes / MiB:+.0f} MiB beyond the "
                      f"checkpoint's share ({as_loaded.rule}; SGLang re-lays the experts out after loading, before "
                      "it reads the memory left for the pool)" if as_loaded else ""),
                   bar="weights", error_bytes=sizing.weights_error),
        BudgetItem("load_overhead", "loader leftovers", budget.load_overhead,
                   FORMULA if sizing.load.error_bytes else CALIBRATED,
                   f"allocated between baseline and pool sizing besides weights; {sizing.load.detail}", bar="other",
                   error_bytes=sizing.load.error_bytes),
        BudgetItem("slack", f"slack P x (1 - {fraction.value:g})", budget.slack, fraction.source,
                   f"{fraction.detail}; activations, CUDA graphs and the {format_gib(budget.request_table)} "
                   "request table live here", bar="activations"),
        BudgetItem("kv", "KV pool", budget.kv, FORMULA,
                   f"{budget.tokens} tokens x {setup.cell:g} B/token "
                   f"(page {setup.page}); budget {format_gib(central.budget_bytes)}"
                   + (f", which holds {central.tokens} at the central estimate: capped by --max-total-tokens"
                      if budget.tokens < central.tokens else ""), bar="kv"),
        *_state_items(central, sizing.state_slot, setup),
    )


def _state_items(sizing: layouts.PoolSizing, slot: int | None, setup: _SglangSetup) -> tuple[BudgetItem, ...]:
    state = setup.layout.state
    if sizing.state_slots is None or slot is None or state is None:
        return ()
    per_request = layouts.state_slots_per_request(setup.geometry.architecture, setup.pinned, pp=setup.pp,
                                                  rules=setup.rules)
    return (BudgetItem("state", "state pool (mamba / linear attention)", sizing.state_bytes, FORMULA,
                       f"{sizing.state_slots} + 1 slots x {slot} B ({len(state.layers)} state layers, "
                       f"{per_request} slots per request; {state.config_class}.mamba2_cache_params)",
                       bar="kv"),)


def _args(pinned: Mapping[str, Any], fraction: float, length: int, cap: _PoolCap | None) -> list[str]:
    """The flags the launch adds: only those the operator left unset."""
    args: list[str] = []
    if "--mem-fraction-static" not in pinned:
        args += ["--mem-fraction-static", f"{fraction:g}"]
    if pinned.get("--context-length") is None:
        args += ["--context-length", str(length)]
    if cap is not None:
        args += ["--max-total-tokens", str(cap.flag)]
    return args


# The band a verified architecture's plan should carry (issue 20); beyond it the note names the terms.
BAND_TARGET = 0.05


def _total_why(gpu: GpuDevice) -> str:
    """Why a catalog card's CUDA total carries a band."""
    if gpu.cuda_total_why:
        return gpu.cuda_total_why
    return "spread of published totals" if gpu.cuda_total_bytes else "NVML total less the typical reserve"


def _band_note(sizing: _Sizing, budget: SglangBudget, verified: bool) -> tuple[str, ...]:
    """Which estimated terms make a verified architecture's KV band wider than +/- 5 %: the pool's
    arithmetic is SGLang's own; what is not known exactly is measured before it starts."""
    band = max(budget.kv - budget.kv_low, budget.kv_high - budget.kv)
    # One token's bytes of slack: the pool's bytes are int(tokens x cell) at either end.
    if not verified or budget.kv <= 0 or band <= BAND_TARGET * budget.kv + sizing.setup.cell:
        return ()
    return (f"KV band +/- {band / budget.kv:.1%} of a {format_gib(budget.kv)} pool (over +/- {BAND_TARGET:.0%}): "
            f"the terms at risk are {_terms_at_risk(sizing)}; the pool arithmetic is SGLang's own",)


def _terms_at_risk(sizing: _Sizing) -> str:
    """The estimated terms behind the pool's band, widest first, each with its +/- on the pool."""
    gpu, fraction = sizing.setup.gpu, sizing.fraction
    spread = gpu.usable_total_error_bytes if gpu.source == "catalog" else 0
    terms = sorted(((sizing.setup.context_error * fraction, "the CUDA context (+ NCCL) before SGLang's baseline"),
                    (spread * fraction, f"the card's CUDA total ({_total_why(gpu)})"),
                    (sizing.load.error_bytes, "the loader's leftovers"),
                    (sizing.weights_error, "the weights quantized while loading" if sizing.online else
                     "the MXFP4 experts' layout as loaded")),
                   reverse=True)
    return ", ".join(f"{what} +/- {size / MiB:.0f} MiB" for size, what in terms if size)


def _notes(setup: _SglangSetup) -> list[str]:
    derivation = setup.derivation
    notes = [n for n in (setup.rules_note, setup.dtype_reason, setup.kv_reason, setup.page_reason) if n]
    notes.append(f"default fraction {derivation.fraction:g}: chunked prefill {derivation.chunked_prefill_size}, "
                 f"decode graph bs {derivation.decode_max_bs}, {derivation.prefill_buckets} prefill buckets"
                 + (", 10 GiB floor" if derivation.floor_applied else ""))
    if setup.attn_dp > 1:
        notes.append(f"data-parallel attention: {setup.attn_dp} groups of {setup.tp // setup.attn_dp} attention ranks "
                     f"in the {setup.tp} GPUs, each with its own pool of the planned tokens and its own scheduler "
                     f"(chunk {derivation.chunked_prefill_size} and --max-running-requests divided by "
                     f"{setup.attn_dp}); the reserve adds max_bs x {setup.attn_dp} x 3 MiB "
                     "(arg_groups/memory_hook.py:371-378)")
    return notes
