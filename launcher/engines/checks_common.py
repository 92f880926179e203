"""What both engines' start-time checks share: the input they read and the refusal they return.

An engine's start-time checks (`launcher.engines.<engine>.checks.start_checks`) are pure
functions of a `CheckInput`; each refusal is an `EngineRule` carrying the engine's own
message filled in with the values, and the engine source line it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from launcher.engines.versions import version_key
from launcher.model.config import ModelGeometry


@dataclass(frozen=True)
class EngineRule:
    """One refusal, as data."""

    rule: str  # short id, e.g. "tp-divides-heads", "quant-min-capability"
    message: str  # the engine's own message, filled in with the values
    source: str  # "vllm/config/model.py:1549 (vLLM 0.32.0)"
    hint: str | None = None  # what would work, e.g. "--tensor-parallel-size 2 or 4"
    # The engine's argparse refuses the command line itself (an invalid choice): a usage error
    # (exit 2), raised before any refusal of the setup, as the engine exits before reading a config.
    bad_argument: bool = False


def refuse_bad_argument(rules: Sequence[EngineRule], engine: str) -> None:
    """The first rule that is the engine's argparse refusing an argument, as exit 2 on one line."""
    bad = next((r for r in rules if r.bad_argument), None)
    if bad is not None:
        from launcher.common.errors import UsageError

        raise UsageError(f"{engine} refuses the command line: {' '.join(bad.message.split())} [{bad.source}]",
                         hint=bad.hint)


@dataclass(frozen=True)
class CheckInput:
    geometry: ModelGeometry
    device: str  # "cuda" | "cpu"
    compute_capability: tuple[int, int] | None
    gpu_count: int  # GPUs given
    tp: int
    pp: int
    dtype: str  # resolved model dtype ("bfloat16", "float16", "float32")
    kv_cache_dtype: str | None  # pinned value or None (= auto)
    block_size: int | None  # pinned value or None
    max_model_len: int | None  # pinned length or None
    model_max_len: int  # derived maximum
    engine_version: str | None
    # Optional facts some messages print or some checks honour; defaults are the engine's.
    gpu_name: str | None = None  # printed by vLLM's bf16 refusal
    max_len_key: str = "max_position_embeddings"  # the config key model_max_len came from
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 / SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
    allow_long_max_model_len: bool = False
    quantization: str | None = None  # pinned --quantization, if any
    pinned_dtype: str | None = None  # the --dtype as typed, if pinned (unknown names are refused)
    attention_backend: str | None = None  # pinned --attention-backend (SGLang), if any
    moe_backend: str | None = None  # pinned --moe-backend (vLLM), if any
    nnodes: int = 1  # --nnodes: the ranks spread over that many nodes, this node holds its share
    cpu_amx: bool | None = None  # the host's AMX tiles (CPU kernels that need them), None: unknown
    cpu_avx512: bool | None = None  # the host's AVX-512 (else vLLM's CPU build loads AVX2 kernels), None: unknown


L = TypeVar("L")


def lines_for(table: Sequence[tuple[str, L]], version: str | None) -> tuple[str, L]:
    """The newest (version, line table) not newer than `version`; the newest when unknown."""
    if version is None:
        return table[-1]
    wanted = version_key(version)
    eligible = [entry for entry in table if version_key(entry[0]) <= wanted]
    return eligible[-1] if eligible else table[0]


def quant_config(geometry: ModelGeometry) -> Mapping[str, Any]:
    """The checkpoint's `quantization_config` (text_config carries the top-level keys)."""
    qc = geometry.text_config.get("quantization_config")
    return qc if isinstance(qc, Mapping) else {}


def divisors_within(n: int, limit: int) -> list[int]:
    return [d for d in range(1, max(1, limit) + 1) if n % d == 0]


def tp_sizes_for_heads(geometry: ModelGeometry, gpu_count: int) -> list[int]:
    """TP sizes up to the GPUs present that split the attention heads, and that split the KV
    heads or are a multiple of them (KV heads are replicated then); MLA has no KV heads."""
    kv_heads = geometry.num_kv_heads
    return [d for d in divisors_within(geometry.num_attention_heads, max(gpu_count, 1))
            if geometry.mla is not None or (d % kv_heads == 0 if d >= kv_heads else kv_heads % d == 0)]


def or_list(values: Sequence[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " or " + text[-1]


@dataclass(frozen=True)
class CtSchemeMinimums:
    """get_min_capability() of the compressed-tensors schemes, per engine."""

    w4a4_fp4: int
    w8a8_fp8: int
    w8a16_fp8: int  # where both engines fall back for an FP8 W8A8 checkpoint below w8a8_fp8
    wna16: int
    w8a8_int8: int


def ct_scheme_min_capability(qc: Mapping[str, object], cc: int,
                             minimums: CtSchemeMinimums) -> tuple[str, int] | None:
    """compressed-tensors: the scheme the engine's `_get_scheme_from_parts` picks for the first
    config group, and its minimum capability; None where we do not model the scheme."""
    parts = _first_group_parts(qc)
    if parts is None:
        return None
    weights, acts = parts
    w_type, w_bits = str(weights.get("type", "int")), weights.get("num_bits")
    if w_type == "float":
        return _float_weight_scheme(weights, acts, cc, minimums)
    if w_type == "int" and acts is None and w_bits in (4, 8):
        return "CompressedTensorsWNA16", minimums.wna16
    if w_type == "int" and w_bits == 8 and acts is not None and acts.get("num_bits") == 8:
        return "CompressedTensorsW8A8Int8", minimums.w8a8_int8
    return None


def _first_group_parts(qc: Mapping[str, object]) -> tuple[Mapping[str, Any], Mapping[str, Any] | None] | None:
    """(weights, input activations or None) of the first config group; None without weights."""
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return None
    group = next(iter(groups.values()))
    if not isinstance(group, Mapping) or not isinstance(group.get("weights"), Mapping):
        return None
    acts = group.get("input_activations")
    return group["weights"], acts if isinstance(acts, Mapping) else None


def _float_weight_scheme(weights: Mapping[str, Any], acts: Mapping[str, Any] | None, cc: int,
                         minimums: CtSchemeMinimums) -> tuple[str, int] | None:
    w_bits = weights.get("num_bits")
    if w_bits == 4 and str(weights.get("strategy", "")) == "tensor_group":
        return "CompressedTensorsW4A4Fp4", minimums.w4a4_fp4  # NVFP4 (and NVFP4A16)
    if w_bits != 8:
        return None
    if acts is not None and acts.get("type") == "float" and acts.get("num_bits") == 8 and cc >= minimums.w8a8_fp8:
        return "CompressedTensorsW8A8Fp8", minimums.w8a8_fp8
    # FP8 weights without FP8 activations, or W8A8 FP8 below the GPU's minimum: both engines fall
    # back to W8A16 FP8 (Marlin).
    return "CompressedTensorsW8A16Fp8", minimums.w8a16_fp8


def kv_head_split(geometry: ModelGeometry, tp: int) -> tuple[str, str] | None:
    """Both engines' QKVParallelLinear `divide()`: KV heads split over the ranks, or each replicated
    on a whole number of ranks. (which line of the engine refuses, its message), or None."""
    kv_heads = geometry.num_kv_heads
    if geometry.mla is not None or kv_heads <= 0:
        return None
    if tp >= kv_heads and tp % kv_heads:
        return "kv_replicas", f"{tp} is not divisible by {kv_heads}"
    if tp < kv_heads and kv_heads % tp:
        return "kv_split", f"{kv_heads} is not divisible by {tp}"
    return None
