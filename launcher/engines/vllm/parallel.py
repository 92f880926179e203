"""vLLM's data and expert parallelism: the GPUs the ranks take and what one rank holds of a MoE model.

Read in vLLM 0.34.0 (the same rules in 0.12.0, 0.19.0, 0.28.0 and 0.33.0 unless a line says otherwise):
- `--data-parallel-size D` (`-dp`) runs D engines, each with its own scheduler and its own KV cache sized
  from its own GPUs (v1/engine/core.py:194, :338); a node holds `--data-parallel-size-local` (`-dpl`, D
  when unset, engine/arg_utils.py:2561-2569) of them, each on the next P x T GPUs (config/parallel.py:934-947).
  Each rank is planned alone; the tightest of the node's GPUs sets the plan.
- A dense model's DP ranks are independent replicas (v1/engine/core.py:1719-1728).
- A MoE model's routed experts are split over all D x T ranks of a stage (`FusedMoEParallelConfig.make`,
  model_executor/layers/fused_moe/config.py:1149, :1235-1271): with `--enable-expert-parallel` (`-ep`) whole
  experts, (E + R) // (D x T) a rank and one more on the first (E + R) % (D x T) ranks
  (fused_moe/expert_map_manager.py:64-69); without it each expert's intermediate size / (D x T)
  (config.py:1397-1398). Attention, embeddings, dense MLPs and shared experts are split by T alone
  (distributed/parallel_state.py:2155-2176); under sequence-parallel MoE (EP, T > 1 and D > 1 with the
  default all2all backend or most others, config/parallel.py:859-877) DeepSeek's, Llama 4's and Qwen3-Next's
  shared experts are whole on every rank (models/deepseek_v2.py:256-275, llama4.py:107-115, qwen3_next.py:112-121).
- Under DP the profile run pads every rank to the same batch and the default all2all
  (allgather_reducescatter) gathers every rank's tokens into each MoE layer (v1/worker/gpu/dp_utils.py:49-140,
  distributed/device_communicators/all2all.py:57-200): the MoE workspace and the gathered rows scale with D.
- EPLB (`--enable-eplb`, `--eplb-config`) adds R redundant experts (0 by default; from 0.34 the least R that
  splits E + R evenly, config/parallel.py:652-684) and keeps one MoE layer of a rank's experts as a
  rearrangement buffer plus its load statistics (distributed/eplb/eplb_state.py:379-513).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import UsageError
from launcher.engines.checks_common import EngineRule
from launcher.engines.dtypes import canonical
from launcher.engines.online_quant import ELEMENT_BYTES
from launcher.engines.versions import version_key
from launcher.engines.vllm.compilation import dotted_value, pydantic_int
from launcher.engines.vllm.kv import pp_partitions
from launcher.model.config import ModelGeometry

DP_FLAG, DP_LOCAL_FLAG = "--data-parallel-size", "--data-parallel-size-local"
EP_FLAG, EPLB_FLAG, EPLB_CONFIG_FLAG = "--enable-expert-parallel", "--enable-eplb", "--eplb-config"
ALL2ALL_FLAG = "--all2all-backend"
DEFAULT_ALL2ALL = "allgather_reducescatter"  # every release (config/parallel.py:45-61 in 0.34.0)
# Removed backends vLLM rewrites to the default from 0.19 ("The '%s' all2all backend has been removed. Falling back to
# 'allgather_reducescatter'.", config/parallel.py:575-581); 0.12 still runs `naive` (in its sequence-parallel set).
REMOVED_BACKENDS = frozenset({"naive", "pplx"})
REMOVED_BACKENDS_SINCE = "0.19"
# The all2all backends under which EP with T > 1 and D > 1 runs the MoE sequence-parallel
# (`use_sequence_parallel_moe`, config/parallel.py:859-877).
SEQUENCE_PARALLEL_BACKENDS = frozenset({
    "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
    "flashinfer_nvlink_one_sided", "passthrough", "mori_high_throughput", "mori_low_latency", "mori", "nixl_ep"})
EPLB_AUTO_REDUNDANCY_SINCE = "0.34"  # the least R splitting E + R evenly (config/parallel.py:652-684)
EPLB_FULL_MAP_BEFORE = "0.34"  # logical_to_physical_map has 1024 slots per expert (eplb_state.py:403-404, 0.33)
EPLB_WINDOW = 1000  # EPLBConfig.window_size's default (config/parallel.py:66)
# External load balancing: one DP rank a process (engine/arg_utils.py:2481-2518).
DP_EXTERNAL_FLAGS = ("--data-parallel-rank", "--data-parallel-external-lb")
DP_BACKEND_FLAG = "--data-parallel-backend"  # "ray": Ray places the DP ranks, not this node's GPU index
MAX_EXPERT_REDUNDANCY = 1023  # distributed/eplb/eplb_state.py:405-409

# Architectures whose MoE layers are counted here, and the rule that picks them.
# GLM-5's GlmMoeDsaForCausalLM is left out: its first dense MLPs are whole under sequence-parallel MoE too
# (models/deepseek_v32/nvidia/model.py:80-116), not derived here; the plain share by T stays (the safe side).
_DEEPSEEK = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
_FIRST_K_DENSE = _DEEPSEEK | {"Glm4MoeForCausalLM"}  # deepseek_v2.py:1293-1297, glm4_moe.py:353-356
_SPARSE_STEP = frozenset({"Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM"})  # qwen3_moe.py:390
_INTERLEAVED = frozenset({"Llama4ForCausalLM", "Llama4ForConditionalGeneration"})  # llama4.py:340-343
_EVERY_LAYER = frozenset({"MixtralForCausalLM", "GptOssForCausalLM", "PhiMoEForCausalLM", "MiniMaxM2ForCausalLM"})

# Bits a routed-expert weight takes in the checkpoint, by quantization method (scales aside: they only add,
# so leaving them out keeps the experts' share low and the rank's weights high, the safe side).
_EXPERT_BITS = {"fp8": 8, "fbgemm_fp8": 8, "mxfp4": 4, "awq": 4, "gptq": 4, "modelopt_fp4": 4, "nvfp4": 4}


@dataclass(frozen=True)
class Parallelism:
    """How one engine's ranks split the model, as vLLM resolves the flags."""

    tp: int
    pp: int
    dp: int = 1
    dp_local: int = 1  # DP ranks on this node
    expert_parallel: bool = False  # EP on: the flag, D x T > 1 and a MoE model
    eplb: bool = False
    redundant_experts: int = 0  # R
    all2all: str = DEFAULT_ALL2ALL
    eplb_window: int = EPLB_WINDOW

    @property
    def moe_ranks(self) -> int:
        """The ranks a stage's routed experts are split over (D x T)."""
        return self.dp * self.tp

    @property
    def moe_tp(self) -> int:
        """The MoE layers' own tensor-parallel size: 1 under EP (whole experts), else D x T."""
        return 1 if self.expert_parallel else self.moe_ranks

    def communicating_ranks(self, moe: bool) -> int:
        """The ranks a rank talks to over NCCL: its T x P group, and a MoE model's DP and EP groups under DP
        (device_communicators/cuda_communicator.py:106-112: a communicator for every group wider than one;
        a dense model's DP ranks run alone, v1/engine/core.py:1719-1728)."""
        return self.tp * self.pp * (self.dp if moe and self.dp > 1 else 1)

    def reducing_ranks(self, moe: bool) -> int:
        """The ranks a rank all-reduces with, whose buffers (custom and symmetric-memory all-reduce) land in the
        profile's non-torch memory: its tensor-parallel group, and a MoE model's DP group. Pipeline stages only
        send and receive activations: the 0.19 H100 starts at --pipeline-parallel-size 2 and 4 (Llama-3.1-8B)
        measured 0.07 GiB of non-torch memory on every stage, against 2.07-2.10 GiB a rank at TP 2."""
        return self.tp * (self.dp if moe and self.dp > 1 else 1)

    @property
    def sequence_parallel_moe(self) -> bool:
        """`use_sequence_parallel_moe` (config/parallel.py:859-877): the shared experts whole on every rank."""
        return self.expert_parallel and self.tp > 1 and self.dp > 1 and self.all2all in SEQUENCE_PARALLEL_BACKENDS


@dataclass(frozen=True)
class RoutedExperts:
    """A MoE checkpoint's routed experts: how many, in how many layers, and their bytes."""

    experts: int
    layers: int
    checkpoint_bytes: int  # scales aside
    shared_bytes: int  # the shared experts kept whole under sequence-parallel MoE (0 where they are split)
    rule: str
    bits: int = 16  # a weight's bits in the checkpoint


def parallelism(pinned: Mapping[str, Any], geometry: ModelGeometry, *, tp: int, pp: int,
                version: str) -> Parallelism:
    """The parallel layout of `pinned`; what vLLM refuses about it raises through `refusals` first."""
    dp = int(pinned.get(DP_FLAG, 1))
    ranks, nodes = node_ranks(pinned, tp=tp, pp=pp)
    ep = bool(pinned.get(EP_FLAG)) and dp * tp > 1 and bool(geometry.num_experts)
    eplb = bool(pinned.get(EPLB_FLAG)) and ep
    config = eplb_config(pinned)
    all2all = str(pinned.get(ALL2ALL_FLAG) or DEFAULT_ALL2ALL)
    if all2all in REMOVED_BACKENDS and version_key(version) >= version_key(REMOVED_BACKENDS_SINCE):
        all2all = DEFAULT_ALL2ALL
    return Parallelism(tp=tp, pp=pp, dp=dp, dp_local=max(ranks // max(nodes, 1) // (tp * pp), 1),
                       expert_parallel=ep, eplb=eplb,
                       redundant_experts=eplb_redundant(config.get("num_redundant_experts"),
                                                        experts=geometry.num_experts or 0, ep_size=dp * tp,
                                                        version=version) if eplb else 0,
                       all2all=all2all, eplb_window=config.get("window_size") or EPLB_WINDOW)


def node_ranks(pinned: Mapping[str, Any], *, tp: int, pp: int) -> tuple[int, int]:
    """(ranks, nodes they span) as `rank_devices` takes them: D x P x T over --nnodes, or the pinned
    `--data-parallel-size-local` DP ranks' on this node alone."""
    if _external(pinned) or pinned.get(DP_BACKEND_FLAG) == "ray":
        return tp * pp, 1  # one DP rank here, or Ray's placement: this node's first P x T GPUs
    local = pinned.get(DP_LOCAL_FLAG)
    if local is not None:
        return int(local) * tp * pp, 1
    return int(pinned.get(DP_FLAG, 1)) * tp * pp, int(pinned.get("--nnodes", 1))


def _external(pinned: Mapping[str, Any]) -> bool:
    """External load balancing: vLLM runs one DP rank per process (`data_parallel_size_local` 1)."""
    return pinned.get(DP_EXTERNAL_FLAGS[0]) is not None or bool(pinned.get(DP_EXTERNAL_FLAGS[1]))


def eplb_redundant(written: int | None, *, experts: int, ep_size: int, version: str) -> int:
    """`num_redundant_experts` as written in `--eplb-config`, else vLLM's default: 0, and from 0.34 the least
    count that splits the experts evenly over the EP ranks."""
    if written is not None:
        return int(written)
    if version_key(version) >= version_key(EPLB_AUTO_REDUNDANCY_SINCE) and ep_size > 0 and experts:
        return (ep_size - experts % ep_size) % ep_size
    return 0


def pinned_eplb_flags(argv: Sequence[str]) -> dict[str, object]:
    """`--eplb-config JSON` and its dotted keys (`--eplb-config.num_redundant_experts 32`), as
    FlexibleArgumentParser leaves them: the dotted keys merged into one JSON appended last, which replaces an
    explicit one (utils/argparse_utils.py:405-455)."""
    explicit: str | None = None
    dotted: dict[str, object] = {}
    i = 0
    while i < len(argv):
        name, eq, inline = argv[i].partition("=")
        flag, dot, key = name.partition(".")
        if flag.replace("_", "-") != EPLB_CONFIG_FLAG:
            i += 1
            continue
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        if value is None:
            raise UsageError(f"engine flag {name} needs a value")
        i += 1 if eq else 2
        if dot:
            dotted[key] = dotted_value(value)
        else:
            explicit = value
    text = json.dumps(dotted, separators=(",", ":")) if dotted else explicit
    return {EPLB_CONFIG_FLAG: text} if text is not None else {}


def eplb_config(pinned: Mapping[str, Any]) -> dict[str, Any]:
    """`--eplb-config` as vLLM reads it (a JSON object); a count that is not one is a usage error (exit 2)."""
    text = pinned.get(EPLB_CONFIG_FLAG)
    if text is None:
        return {}
    try:
        parsed = json.loads(str(text))
    except (json.JSONDecodeError, RecursionError):
        raise UsageError(f"engine flag {EPLB_CONFIG_FLAG}: cannot read {str(text)[:80]!r} as JSON") from None
    if not isinstance(parsed, dict):
        raise UsageError(f"engine flag {EPLB_CONFIG_FLAG}: the EPLB config must be a JSON object")
    for key, least in (("num_redundant_experts", 0), ("window_size", 1)):
        value = parsed.get(key)
        if value is None:
            continue
        count = pydantic_int(value)
        if count is None or count < least:
            raise UsageError(f"engine flag {EPLB_CONFIG_FLAG}: {key} {value!r} is not a count of at least {least} "
                             "(vLLM's parser refuses it)")
        parsed[key] = count
    return parsed


def refusals(pinned: Mapping[str, Any], geometry: ModelGeometry, *, tp: int, pp: int, version: str,
             gpu_count: int | None) -> list[EngineRule]:
    """What vLLM refuses at start about DP, EP and EPLB, with its own messages (cited in 0.34.0; the same
    checks from 0.12, worded a little differently before 0.26). `gpu_count`: the GPUs this node shows (None:
    not on CUDA)."""
    dp = int(pinned.get(DP_FLAG, 1))
    local = pinned.get(DP_LOCAL_FLAG)
    experts = geometry.num_experts or 0
    ep, eplb = bool(pinned.get(EP_FLAG)), bool(pinned.get(EPLB_FLAG))
    out: list[EngineRule] = []
    if local is not None and int(local) > dp:
        out.append(_rule("dp-local", f"data_parallel_size_local ({local}) must be <= data_parallel_size ({dp})",
                         "config/parallel.py:583-587", hint=f"{DP_LOCAL_FLAG} {dp} or less"))
    ranks, nodes = node_ranks(pinned, tp=tp, pp=pp)
    if gpu_count is not None and tp * pp <= gpu_count < ranks // max(nodes, 1):
        # Each DP rank's workers take the next P x T GPUs (config/parallel.py:934-947); the first past the end fails.
        out.append(_rule("dp-devices", f"DP adjusted local rank {gpu_count} is out of bounds for {gpu_count} devices.",
                         "v1/worker/gpu_worker.py:488-492", hint=f"{DP_FLAG} {max(gpu_count // (tp * pp), 1)} "
                         "or fewer, or make more GPUs visible"))
    if ep and not experts:
        out.append(_rule("ep-needs-moe", "Number of experts in the model must be greater than 0 when expert "
                         "parallelism is enabled.", "config/model.py:1518-1523", hint=f"drop {EP_FLAG}"))
    moe_inter = geometry.expert_intermediate_size
    if experts and not ep and dp > 1 and isinstance(moe_inter, int) and moe_inter % (dp * tp):
        out.append(_rule("moe-intermediate-split", f"assert intermediate_size % tp_size == 0: the experts' "
                         f"intermediate size {moe_inter} split over {dp} x {tp} ranks without expert parallelism",
                         "model_executor/layers/fused_moe/config.py:1397", hint=f"add {EP_FLAG}"))
    if geometry.architecture == "GptOssForCausalLM" and dp > 1 and isinstance(moe_inter, int) \
            and moe_inter % (dp * pp * tp):
        # The torch world spans every DP rank (distributed/parallel_state.py:1876-1878), with or without EP.
        out.append(_rule("gpt-oss-world-split", f"assert config.intermediate_size % self.world_size == 0: gpt-oss's "
                         f"intermediate size {moe_inter} over a world of {dp} x {pp} x {tp} ranks",
                         "model_executor/models/gpt_oss.py:389",
                         hint=f"a data-parallel size whose world divides {moe_inter}"))
    written = eplb_config(pinned).get("num_redundant_experts")
    if eplb and not ep:
        out.append(_rule("eplb-needs-ep", "enable_expert_parallel must be True to use EPLB.", "config/parallel.py:608",
                         hint=f"add {EP_FLAG}, or drop {EPLB_FLAG}"))
    elif eplb and dp * tp <= 1:
        out.append(_rule("eplb-needs-ranks", f"EPLB requires tensor, prefill-context, or data parallelism, but got "
                         f"TP={tp}, PCP=1, DP={dp}.", "config/parallel.py:613-622",
                         hint=f"{DP_FLAG} or --tensor-parallel-size above 1, or drop {EPLB_FLAG}"))
    if written and not eplb:
        out.append(_rule("redundant-needs-eplb", f"num_redundant_experts is set to {written} but EPLB is not enabled. "
                         "Either enable EPLB or unset num_redundant_experts.", "config/parallel.py:624-632",
                         hint=f"add {EPLB_FLAG}"))
    if eplb and ep and experts and dp * tp > 1:
        redundant = eplb_redundant(written, experts=experts, ep_size=dp * tp, version=version)
        if redundant > MAX_EXPERT_REDUNDANCY:
            out.append(_rule("eplb-redundancy", f"assert num_redundant_experts <= {MAX_EXPERT_REDUNDANCY} "
                             f"(got {redundant})", "distributed/eplb/eplb_state.py:405-409"))
        elif (experts + redundant) % (dp * tp):
            out.append(_rule("eplb-even-experts", "EPLB currently only supports even distribution of experts across "
                             f"ranks. Got {experts + redundant} experts and {dp * tp} EP ranks.",
                             "model_executor/layers/fused_moe/layer.py:276-283",
                             hint=f"num_redundant_experts in {EPLB_CONFIG_FLAG} making {experts} + it a multiple "
                                  f"of {dp * tp}"))
    return out


def _rule(rule: str, message: str, where: str, hint: str | None = None) -> EngineRule:
    return EngineRule(rule, message, f"vllm/{where} (vLLM 0.34.0)", hint=hint)


def routed_experts(geometry: ModelGeometry) -> RoutedExperts | None:
    """The routed experts' checkpoint bytes from config.json, where the architecture's MoE layers are known
    (None elsewhere: the rank is then planned holding the whole model's share by T, the safe side)."""
    experts = geometry.num_experts
    hidden = geometry.hidden_size
    inter = geometry.expert_intermediate_size
    if not experts or not isinstance(inter, int) or inter <= 0:
        return None
    layers = moe_layer_count(geometry)
    bits = _expert_bits(geometry)
    if layers is None or bits is None:
        return None
    per_expert = 3 * hidden * inter  # gate and up [2 I, H], down [H, I]
    shared_bytes = layers * 3 * hidden * _shared_intermediate(geometry, inter) * bits // 8
    return RoutedExperts(experts=experts, layers=layers, checkpoint_bytes=layers * experts * per_expert * bits // 8,
                         shared_bytes=shared_bytes,
                         rule=f"{layers} MoE layers x {experts} experts x 3 x {hidden} x {inter} at {bits} bits",
                         bits=bits)


def _shared_intermediate(geometry: ModelGeometry, inter: int) -> int:
    """The intermediate size of a MoE layer's shared experts in the models that keep them whole under
    sequence-parallel MoE (`disable_tp=is_sequence_parallel`: models/deepseek_v2.py:256-275, llama4.py:107-115,
    qwen3_next.py:112-121); 0 elsewhere (split by T like any dense MLP; Qwen3-MoE's Qwen3MoeMLP has no
    disable_tp, qwen3_moe.py:88-113)."""
    text, architecture = geometry.text_config, geometry.architecture
    if architecture in _DEEPSEEK:
        shared = text.get("n_shared_experts")
        return inter * shared if isinstance(shared, int) and shared > 0 else 0
    if architecture in _INTERLEAVED:
        return inter
    if architecture == "Qwen3NextForCausalLM":  # Qwen2MoeMLP with disable_tp (qwen3_next.py:112-121)
        shared = text.get("shared_expert_intermediate_size")
        return shared if isinstance(shared, int) and shared > 0 else 0
    return 0


def moe_layer_count(geometry: ModelGeometry) -> int | None:
    """The decoder layers vLLM builds with routed experts, by the architecture's own rule."""
    text, n, architecture = geometry.text_config, geometry.num_layers, geometry.architecture
    if architecture in _FIRST_K_DENSE:
        first, freq = text.get("first_k_dense_replace", 0), text.get("moe_layer_freq", 1)
        if not isinstance(first, int) or not isinstance(freq, int) or freq <= 0:
            return None
        return sum(1 for i in range(n) if i >= first and i % freq == 0)
    if architecture in _SPARSE_STEP:
        step, dense = text.get("decoder_sparse_step", 1), text.get("mlp_only_layers") or []
        if not isinstance(step, int) or step <= 0 or not isinstance(dense, list):
            return None
        return sum(1 for i in range(n) if i not in dense and (i + 1) % step == 0)
    if architecture in _INTERLEAVED:
        step = text.get("interleave_moe_layer_step", 1)
        return sum(1 for i in range(n) if (i + 1) % step == 0) if isinstance(step, int) and step > 0 else None
    return n if architecture in _EVERY_LAYER else None


def _expert_bits(geometry: ModelGeometry) -> int | None:
    quantization = geometry.quantization
    if quantization is None:
        return {"bfloat16": 16, "float16": 16, "float32": 32}.get(geometry.config_dtype or "bfloat16")
    if quantization.method in ("compressed-tensors", "awq", "gptq"):  # their bits as written (GPTQ 8-bit too)
        return quantization.bits or _EXPERT_BITS.get(quantization.method)
    return _EXPERT_BITS.get(quantization.method)


def experts_on_rank(layout: Parallelism, experts: int) -> tuple[int, int]:
    """(numerator, denominator): the share of the routed experts' bytes the busiest rank holds."""
    if layout.expert_parallel:
        physical = experts + layout.redundant_experts
        return -(-physical // layout.moe_ranks), experts  # the first ranks take the remainder
    return 1, layout.moe_ranks


def rank_share(whole: int, experts_part: int, layout: Parallelism, routed: RoutedExperts | None) -> int:
    """One rank's share of `whole` bytes (the checkpoint, or a change to it) of which `experts_part` are the
    routed experts: those by the rank's expert share over D x T, the rest by T (the shared experts whole
    under sequence-parallel MoE), all over the P stages."""
    if routed is None:
        return whole // (layout.tp * layout.pp)
    share, of = experts_on_rank(layout, routed.experts)
    # The shared experts' part of `whole` scales like the routed experts' (both are expert weights: a change
    # from quantizing touches them alike); they sit in the rest, whole on every rank under sequence-parallel MoE.
    shared_whole = routed.shared_bytes * experts_part // routed.checkpoint_bytes if layout.sequence_parallel_moe \
        else 0
    rest = whole - experts_part
    return ((rest - shared_whole) // layout.tp + shared_whole + experts_part * share // of) // layout.pp


def quantized_experts_delta(routed: RoutedExperts | None, whole_delta: int, bytes_per_element: float | None) -> int:
    """The routed experts' part of the whole model's change when vLLM quantizes the checkpoint while loading
    (`bytes_per_element` a weight after it), never beyond the whole change."""
    if routed is None or not whole_delta or bytes_per_element is None:
        return 0
    elements = routed.checkpoint_bytes * 8 // routed.bits
    delta = int(elements * bytes_per_element) - routed.checkpoint_bytes
    return max(delta, whole_delta) if whole_delta < 0 else min(delta, whole_delta)


def splits_experts(layout: Parallelism, routed: RoutedExperts | None, checkpoint_bytes: int) -> bool:
    """Whether the experts split other than the whole model by T x P: DP, EP (whole experts, the remainder on
    the first ranks) or redundant experts, with a known expert share of the checkpoint."""
    return routed is not None and routed.checkpoint_bytes < checkpoint_bytes and (
        layout.dp > 1 or layout.expert_parallel or layout.redundant_experts > 0)


def rank_weights(checkpoint_bytes: int, layout: Parallelism, routed: RoutedExperts | None,
                 geometry: ModelGeometry | None = None) -> tuple[int, str]:
    """(bytes, how) of the checkpoint one rank loads: the routed experts' share over D x T ranks, the rest
    by T, each over the P stages; without data or expert parallelism the share by T of the heaviest
    pipeline stage (`pipeline_stage_weights`), or the plain share by T x P."""
    if routed is None or not splits_experts(layout, routed, checkpoint_bytes):
        staged = pipeline_stage_weights(checkpoint_bytes, geometry, tp=layout.tp, pp=layout.pp) \
            if geometry is not None else None
        return staged if staged is not None else (checkpoint_bytes // (layout.tp * layout.pp), "")
    share, of = experts_on_rank(layout, routed.experts)
    per_rank = rank_share(checkpoint_bytes, routed.checkpoint_bytes, layout, routed)
    how = (f"routed experts ({routed.rule}) {share}/{of} a rank"
           + (f" ({layout.redundant_experts} redundant)" if layout.redundant_experts else "")
           + f", the rest by tensor parallel {layout.tp}"
           + (f" over {layout.pp} stages" if layout.pp > 1 else "")
           + (", the shared experts whole on every rank (sequence-parallel MoE)"
              if layout.sequence_parallel_moe and routed.shared_bytes else ""))
    return max(per_rank, 0), how


def pipeline_stage_weights(checkpoint_bytes: int, geometry: ModelGeometry, *, tp: int,
                           pp: int) -> tuple[int, str] | None:
    """(bytes, how) one rank of the heaviest pipeline stage loads, or None where the split is not derived.

    vLLM gives each stage its layers by `get_pp_indices` (the remainder to the stages before the last) and
    builds the vocabulary table only where it runs: the embedding on the first stage, the lm_head on the
    last (PPMissingLayer elsewhere; a tied lm_head is loaded from the embedding there), so both ends hold
    one table beside their layers. The first stage, with the most layers, is the heaviest: the 0.19 H100
    starts of Llama-3.1-8B loaded 7.51 GiB on both stages at --pipeline-parallel-size 2 and 4.26 / 3.28 /
    3.28 / 4.26 GiB at 4, where an even split gives 7.50 and 3.75. The layers are taken as alike (a dense
    first layer of a MoE model is counted as heavy as the rest: more than vLLM holds there); multimodal
    wrappers keep the even split (their towers are not on one stage)."""
    if pp <= 1 or geometry.is_multimodal or geometry.num_layers < pp:
        return None
    # The table in the checkpoint's dtype ("float" and "fp32" spell float32 too); quantized ones keep it in 16 bits.
    element = ELEMENT_BYTES.get(canonical(geometry.config_dtype) or "", 2)
    table = geometry.vocab_size * geometry.hidden_size * element
    body = checkpoint_bytes - table * (1 if geometry.tie_word_embeddings else 2)
    if table <= 0 or body <= 0:
        return None
    most = max(len(stage) for stage in pp_partitions(geometry.num_layers, pp))
    stage = (body * most // geometry.num_layers + table) // tp
    return stage, (f"the heaviest of {pp} pipeline stages: {most} of {geometry.num_layers} layers and one "
                   f"{geometry.vocab_size}-row vocabulary table (the embedding first, the lm_head last; "
                   "model_executor/models/utils.py get_pp_indices)")


def eplb_bytes(layout: Parallelism, routed: RoutedExperts | None, *, version: str, checkpoint_bytes: int,
               geometry: ModelGeometry) -> tuple[int, str]:
    """What EPLB keeps on a rank beyond its experts (eplb_state.py:379-513): one MoE layer of the rank's
    experts (the rearrangement buffer), the expert maps (1024 slots per expert before 0.34) and the load
    window (`window_size` steps, int32). Where the MoE layers are not known: one whole layer's share by T
    and every layer counted as MoE (more than vLLM holds)."""
    if not layout.eplb:
        return 0, ""
    experts = routed.experts if routed else geometry.num_experts or 0
    physical = experts + layout.redundant_experts
    moe_layers = routed.layers if routed else geometry.num_layers
    layers = -(-moe_layers // layout.pp)
    if routed is not None:
        share, of = experts_on_rank(layout, routed.experts)
        buffer = routed.checkpoint_bytes // routed.layers * share // of
    else:
        buffer = checkpoint_bytes // max(geometry.num_layers, 1) // layout.tp
    slots = 1024 if version_key(version) < version_key(EPLB_FULL_MAP_BEFORE) else layout.redundant_experts + 1
    maps = layers * (physical * 8 + experts * slots * 8 + experts * 8 * 2 + physical * 4)
    window = layout.eplb_window * layers * physical * 4
    return buffer + maps + window, (
        f"EPLB: one layer of the rank's experts {buffer / 2**30:.2f} GiB, expert maps and a {layout.eplb_window}-step "
        f"load window {(maps + window) / 2**30:.2f} GiB (distributed/eplb/eplb_state.py:379-513)")


def warnings(layout: Parallelism) -> list[str]:
    """What the plan does not count about this layout: an all2all backend other than the default allocates its
    communication buffers while the model loads (DeepEP: 1 GiB of NVLink buffer, 1 GiB more for RDMA across
    nodes, and NVSHMEM buffers for the low-latency kernels; FlashInfer, NIXL and MoRI size theirs in their own
    libraries: distributed/device_communicators/all2all.py:263-370 in 0.34.0), and the batched ones lower
    max_num_batched_tokens' default to 256 (engine/arg_utils.py:3204-3207)."""
    if not layout.expert_parallel or layout.dp <= 1 or layout.all2all == DEFAULT_ALL2ALL:
        return []
    return [f"{ALL2ALL_FLAG} {layout.all2all}: its communication buffers (DeepEP: 1 GiB of NVLink buffer, "
            "+ 1 GiB across nodes, + NVSHMEM for the low-latency kernels) are allocated while the model loads; "
            "the plan does not count them"]
