"""vLLM's context parallelism: decode context parallelism (DCP) sized, prefill context parallelism (PCP) not yet.

DCP (`--decode-context-parallel-size` / `-dcp d`, 0.11+) reuses the tensor-parallel ranks: no more GPUs, no
other weight split, the same KV page on every rank (0.34.0 config/parallel.py:427-430, :1057-1061). The d ranks
of a DCP group store different tokens of a request instead of copies (token i on rank i % d, config/parallel.py:
461-476), so a request of L tokens claims cdiv(cdiv(L, d), block) blocks a rank (v1/kv_cache_interface.py:
654-659); the printed KV tokens are int(concurrency x L), about num_blocks x block x d (v1/core/kv_cache_utils.py:
1141-1175), and the "To serve at least one request" check divides L by d too (v1/core/kv_cache_planning.py:
1297-1329). Before 0.20.1 the printed figure was num_blocks // groups x block x d (0.19.0 kv_cache_utils.py:
1297-1316). Sized here for models whose every KV layer is full attention or MLA; vLLM's DCP managers refuse
sliding windows ("DCP not support sliding window attn now.", v1/core/single_type_kv_cache_manager.py:989), and
state layers take other rules (replicated Mamba groups in 0.34, v1/core/kv_cache_coordinator.py:684-689): not
sized here.

What DCP adds besides: the MLA chunked-prefill workspace grows by 1/d (mla_attention.py:2671-2693), and from
0.28 the direct symmetric-memory gathers hold the DCP group's queries (dcp.py:1297-1304, at model build) and
a KV gather of 2 x workspace rows (dcp.py:1440); FlashAttention's GQA path a context output of max_num_batched
tokens x d local heads (flash_attn.py:1189-1194). They are not derived term by term here: their sum is bounded
(`workspace_bound`) and carried in the band, with the DCP group's NCCL communicator.

PCP (`-pcp`) multiplies the GPUs (world = P x T x PCP), replicates the dense weights and, without DCP, the KV
cache on every PCP rank, splits the experts over D x PCP x T and profiles MoE layers at PCP x the batch
(0.34.0 config/parallel.py:152-154, fused_moe/config.py:1143-1150, fused_moe/runner/moe_runner.py:862-876):
planned as the plain tensor-parallel split it would promise GPUs and KV that are not there, so it is "not
sized by safe-serve yet" (exit 78) where vLLM runs it (0.26+, MLA), and vLLM's refusal before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.common.errors import UnsupportedModel
from launcher.engines.checks_common import EngineRule
from launcher.engines.versions import version_key
from launcher.engines.vllm.architectures import uses_mla
from launcher.model.config import FULL, MLA, ModelGeometry

DCP_FLAG = "--decode-context-parallel-size"
PCP_FLAG = "--prefill-context-parallel-size"
TRUST_HINT = "--trust-engine (vLLM sizes itself; the watch still checks its KV line), or drop the flag"
MLA_WORKSPACE_ROWS = 65536  # the chunked-prefill workspace's cap (mla_attention.py:2534-2559)
DIRECT_GATHER_TOKENS = 1024  # the direct query gather's rows: max_num_seqs or the largest graph, bounded here


def dcp_size(pinned: Mapping[str, Any]) -> int:
    return int(pinned.get(DCP_FLAG, 1))


def pcp_size(pinned: Mapping[str, Any]) -> int:
    return int(pinned.get(PCP_FLAG, 1))


def refusals(pinned: Mapping[str, Any], geometry: ModelGeometry, *, tp: int, version: str,
             compute_capability: tuple[int, int] | None = None) -> list[EngineRule]:
    """What vLLM refuses about DCP and PCP at start, in the words of the release planned: a flag the release
    does not have is its argparse's usage error (DCP from 0.11, PCP from 0.12)."""
    dcp, pcp, at = dcp_size(pinned), pcp_size(pinned), version_key(version)
    out: list[EngineRule] = []
    for flag, size, first in ((DCP_FLAG, dcp, "0.11.0"), (PCP_FLAG, pcp, "0.12.0")):
        if size > 1 and at < version_key(first):
            return [EngineRule(f"{flag[2:]}-unknown", f"unrecognized arguments: {flag} {size}",
                               f"vllm/engine/arg_utils.py (vLLM {version}: {flag} arrives in {first})",
                               hint=f"drop {flag}, or a vLLM from {first}", bad_argument=True)]
    if dcp > 1 and at < version_key("0.26.0") and tp % dcp:
        # Checked before PCP's refusal until 0.26 (0.12.0 engine/arg_utils.py:1387; 0.19.0 config/parallel.py:391-395).
        return [_rule("dcp-divides-tp", f"tp_size={tp} must be divisible bydcp_size={dcp}.",
                      "config/parallel.py:386-395 (vLLM 0.19.0)", f"{DCP_FLAG} that divides {tp}")]
    if pcp > 1 and at < version_key("0.19.0"):
        out.append(_rule("pcp-refused", "Prefill context parallelism is not fully supported. Please set "
                         "prefill_context_parallel_size to 1.", "config/parallel.py:315-319 (vLLM 0.12.0)",
                         f"drop {PCP_FLAG}"))
    elif pcp > 1 and at < version_key("0.26.0"):
        # The config takes it; no attention implementation supports it until 0.26 (its startup assert).
        out.append(_rule("pcp-refused", "PCP requires attention impls' support, but the impl does not support PCP.",
                         "v1/worker/cp_utils.py:38-43 (vLLM 0.19.0)",
                         f"drop {PCP_FLAG} (vLLM runs it from 0.26, for MLA models)"))
    if dcp <= 1:
        return out
    if pcp == 1 and tp % dcp:
        out.append(_rule("dcp-divides-tp", f"tp_size={tp} must be divisible by dcp_size={dcp}.",
                         "config/parallel.py:641 (vLLM 0.34.0)", f"{DCP_FLAG} that divides {tp}"))
    if not uses_mla(geometry):  # vLLM's own use_mla, not the config's fields (MiniCPM3 runs as attention)
        out.extend(_gqa_refusals(geometry, tp=tp, dcp=dcp, version=version))
    elif "--attention-backend" not in pinned:
        out.extend(_lse_refusals(geometry, version=version, compute_capability=compute_capability))
    return out


def _lse_refusals(geometry: ModelGeometry, *, version: str,
                  compute_capability: tuple[int, int] | None) -> list[EngineRule]:
    """DCP needs every attention layer to return the softmax LSE in decode (0.19.0 v1/worker/cp_utils.py:30-36):
    the MLA backend vLLM picks by default lacks it on Blackwell before 0.25 (FlashInfer-MLA first,
    platforms/cuda.py:59-87 in 0.19.0; its LSE from 0.25.0), and the sparse MLA backends of DeepSeek-V3.2
    (an `index_topk` in the config) before 0.29."""
    at = version_key(version)
    blackwell = compute_capability is not None and compute_capability[0] == 10
    sparse = isinstance(geometry.text_config.get("index_topk"), int)
    if sparse and at < version_key("0.29.0"):
        impl = "FlashInferMLASparseImpl" if blackwell else "FlashMLASparseImpl"
    elif not sparse and blackwell and version_key("0.19.0") <= at < version_key("0.25.0"):
        impl = "FlashInferMLAImpl"
    else:
        return []
    message = (f"Decode Context Parallelism (DCP) requires attention implementations to return the softmax LSE "
               f"during decode, but {impl} does not. Try a different backend by setting --attention-backend or "
               "disable DCP." if at >= version_key("0.20.0") else
               f"DCP requires attention impls to return the softmax lse for decode, but the impl {impl} does not "
               "return the softmax lse for decode.")
    return [_rule("dcp-lse", message, "v1/worker/cp_utils.py:30-37 (vLLM 0.19.0-0.23.0)",
                  "an --attention-backend that returns the LSE (FLASHMLA, CUTLASS_MLA), or a newer vLLM")]


def _gqa_refusals(geometry: ModelGeometry, *, tp: int, dcp: int, version: str) -> list[EngineRule]:
    """GQA/MQA under DCP: the d ranks must be copies of one KV head (0.34.0 config/model.py:1598-1627)."""
    at = version_key(version)
    if at < version_key("0.12.0"):  # only the MLA backends return the softmax LSE in 0.11
        return [_rule("dcp-gqa-lse", "DCP requires attention impls to return the softmax lse for decode, but the "
                      "impl FlashAttentionImpl does not return the softmax lse for decode.",
                      "v1/worker/gpu_model_runner.py:4001-4011 (vLLM 0.11.0)", f"{DCP_FLAG} 1 (MLA models only here)")]
    kv, heads = geometry.num_kv_heads, geometry.num_attention_heads
    new = at >= version_key("0.27.0")  # ValueErrors; asserts before (0.19.0 config/model.py:1131-1152)

    def where(lines: str) -> str:
        return f"config/model.py:{lines} (vLLM 0.34.0)" if new else "config/model.py:1131-1152 (vLLM 0.19.0)"

    if tp <= kv:
        return [_rule("dcp-gqa-heads", (
            f"Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` ({tp}) to be greater than the "
            f"model's total number of KV heads ({kv}). Increase `--tensor-parallel-size` or set "
            "`--decode-context-parallel-size 1`." if new else
            f"tensor parallel size {tp} must be greater than total num kv heads {kv} when enable decode context "
            "parallel for GQA/MQA"), where("1598-1608"), f"--tensor-parallel-size above {kv}")]
    most = tp // kv
    if dcp > most:
        return [_rule("dcp-gqa-most", (
            f"`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported value ({most}) for "
            f"`--tensor-parallel-size` ({tp}) and {kv} model KV heads." if new else
            f"decode context parallel size must less than or equal to (tensor parallel size {tp} // total num kv "
            f"heads {kv}) = {most}, but got {dcp}"), where("1610-1617"), f"{DCP_FLAG} {most} or less")]
    per_kv = heads // kv
    if per_kv % dcp:
        return [_rule("dcp-gqa-groups", (
            f"The model's number of query heads per KV head ({per_kv}) must be divisible by "
            f"`--decode-context-parallel-size` ({dcp}) for GQA/MQA." if new else
            f"Total number of q per kv attn heads ({per_kv}) must be divisible by dcp world size when enable "
            f"decode context parallel for GQA ({dcp})."), where("1619-1627"),
            f"{DCP_FLAG} that divides {per_kv}")]
    return []


def refuse_unsized(pinned: Mapping[str, Any], geometry: ModelGeometry, *, device: str) -> None:
    """PCP where vLLM runs it, and DCP on layers or a device safe-serve does not size it for: exit 78."""
    dcp, pcp = dcp_size(pinned), pcp_size(pinned)
    why = ""
    if pcp > 1:
        why = (f"prefill context parallelism ({PCP_FLAG} {pcp}: {pcp} x the GPUs, the dense weights and the KV cache "
               f"copied on each, the experts split {pcp} ways more, MoE layers profiled at {pcp} x the batch)")
    elif dcp > 1 and device != "cuda":
        why = f"decode context parallelism ({DCP_FLAG} {dcp}) on the {device} backend"
    elif dcp > 1 and set(geometry.layer_kinds) - {FULL, MLA}:
        why = (f"decode context parallelism ({DCP_FLAG} {dcp}) for a model with sliding-window, chunked or state "
               "layers (vLLM's DCP managers take full attention and MLA)")
    if why:
        raise UnsupportedModel(f"not sized by safe-serve yet: vLLM's {why}: a plan from the plain tensor-parallel "
                               "split would promise GPUs or KV cache that are not there", hint=TRUST_HINT)


def workspace_bound(geometry: ModelGeometry, *, dcp: int, tp: int, batched_tokens: int, version: str,
                    dtype_bytes: int) -> tuple[int, str]:
    """(bytes, rule): an upper bound on what DCP's gathers and workspaces hold on one rank."""
    if dcp <= 1:
        return 0, ""
    group_heads = max(geometry.num_attention_heads * dcp // max(tp, 1), 1)
    if geometry.mla is None or not uses_mla(geometry):
        out = batched_tokens * group_heads * geometry.head_dim * dtype_bytes
        return out, (f"DCP {dcp}: FlashAttention's context output, {batched_tokens} tokens x {group_heads} heads "
                     f"x {geometry.head_dim} (flash_attn.py:1189-1194)")
    latent = geometry.mla.kv_lora_rank + geometry.mla.qk_rope_head_dim
    grown = MLA_WORKSPACE_ROWS // dcp * latent * dtype_bytes
    if version_key(version) < version_key("0.28.0"):
        return grown, f"DCP {dcp}: the MLA workspace grown by 1/{dcp} (mla_attention.py:2671-2693)"
    queries = min(batched_tokens, DIRECT_GATHER_TOKENS) * group_heads * latent * dtype_bytes
    gathered = 2 * MLA_WORKSPACE_ROWS * latent * dtype_bytes
    return grown + queries + gathered, (
        f"DCP {dcp}: at most the MLA workspace grown by 1/{dcp} (mla_attention.py:2671-2693), the group's query "
        f"gather ({group_heads} heads, dcp.py:1297-1304) and the KV gather (dcp.py:1440)")


def note(dcp: int, block: int) -> str:
    return (f"decode context parallelism {dcp}: each rank of a DCP group holds every {dcp}th token of a request, "
            f"so a request of L tokens takes ceil(ceil(L/{dcp})/{block}) blocks a rank and vLLM's KV line counts "
            f"{dcp} x the tokens one rank's blocks hold (v1/kv_cache_interface.py:654-659); the DCP group's NCCL "
            "communicator is not counted apart from the non-torch term")


def _rule(rule: str, message: str, where: str, hint: str) -> EngineRule:
    return EngineRule(rule, message, f"vllm/{where}", hint=hint)
