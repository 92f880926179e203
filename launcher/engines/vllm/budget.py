"""vLLM 0.32's memory budget: what it requests, what it subtracts, what is left for KV.

Per worker (`v1/worker/gpu_worker.py`, `v1/worker/utils.py:request_memory`):

    requested = ceil(cuda_total x gpu_memory_utilization)     must be <= free at init
    kv        = requested - consumed - activation_peak - cudagraph_estimate

`consumed` is the drop in free memory from the init snapshot to the end of profiling:
the weights on this rank plus non-torch allocations made after the snapshot. The CUDA
context (and NCCL buffers with TP) is taken before the snapshot: it only tightens the
startup check. The constants below are estimates; each names where it comes from, and
`launcher.plan.calibration` replaces them with what the engine measured on the same key.
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.units import GiB, MiB, cdiv, format_gib
from launcher.engines.checks_common import lines_for
from launcher.engines.dtypes import canonical
from launcher.engines.online_quant import ELEMENT_BYTES, kept_layers, quantized_weights
from launcher.engines.versions import version_key
from launcher.engines.vllm.compilation import SPLIT_SIZES_SINCE, GraphMode, GraphPins, SplitPins, graph_mode
from launcher.engines.vllm.kv import pp_partitions
from launcher.engines.vllm.rules import VllmRules, uses_v2_runner
from launcher.model.config import MLA, ModelGeometry, partial_rotary_factor

# CUDA context + torch before the init snapshot. vLLM 0.10.2 on an idle 80 GB card printed
# "Free memory on device (78.66/79.19 GiB) on startup": 0.53 GiB gone before weights.
CUDA_CONTEXT_BYTES = 544 * MiB
# NCCL and custom all-reduce buffers per rank with tensor/pipeline parallelism.
NCCL_BYTES = 320 * MiB
# Non-torch memory that appears after the snapshot (cuBLAS workspaces, allocator slack).
# Logs: 0.03-0.13 GiB on one GPU (T4, 4060, A100, 3090), 0.13-0.14 GiB on H100 0.11-0.17 (4 logs, two
# sources; the bench's median 0.13), 0.34-0.43 GiB per rank at TP 4. Kept at 160 MiB, the safe side of them.
NON_TORCH_BYTES_TP1 = 160 * MiB
NON_TORCH_BYTES_TP = 400 * MiB
# vLLM 0.18-0.19 on H100 ("non-torch forward increase memory"), where the CUDA-graph memory profile runs inside
# the measurement (`VllmRules.graphs_profiled_in_budget`): 0.25-0.27 GiB at TP 1 (7 logs), 2.07-2.10
# GiB per rank at TP 2 (3 logs): NCCL and custom all-reduce buffers now land after the snapshot.
NON_TORCH_BYTES_TP1_V019 = 266 * MiB
NON_TORCH_BYTES_TP_V019 = int(2.08 * GiB)
# TP > 1 on sm90/sm100 from 0.19: five H100 logs (TP 2 and 4; gpt-oss-20b, Llama 4 Scout, Llama-3.3-70B-FP8,
# Mixtral, Mistral-Small-3.1 W8A8) are within 0.10 GiB of the shipped figure held out (bench/startup_logs.py);
# the band keeps five times that for TP 8 and other NVSwitch systems, whose NVLS buffers SGLang's logs show
# varying by 0.25 GiB (launcher/engines/sglang/budget.py NVLS_NCCL_BYTES).
NON_TORCH_TP_ERROR_BYTES = GiB // 2


# Expected errors of the estimates above (+/-), from the published logs behind each. The CUDA
# total's own error is the GPU's (`GpuDevice.usable_total_error_bytes`, launcher/model/gpu.py).
NON_TORCH_ERROR_BYTES = 256 * MiB  # logs: 0.03-0.43 GiB against 0.16/0.39 GiB estimates
CONTEXT_ERROR_BYTES = 128 * MiB  # CUDA context + torch before the snapshot: 0.45-0.62 GiB seen


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    reason: str

    def doubled(self) -> BatchDefaults:
        """`--performance-mode throughput` doubles both defaults that were not given
        (vllm/engine/arg_utils.py:3130 in 0.32, in every release from 0.19)."""
        return BatchDefaults(2 * self.max_num_batched_tokens, 2 * self.max_num_seqs,
                             self.reason + ", doubled by --performance-mode throughput")


def batch_defaults(*, nvml_total_bytes: int | None, gpu_name: str, device: str, world_size: int,
                   b200_tier: bool = True) -> BatchDefaults:
    """`EngineArgs.get_batch_defaults` for `vllm serve` (vllm/engine/arg_utils.py; the tier reads the
    NVML total). The >= 160 GiB tier exists from 0.28; before it such cards are in the H100 tier."""
    if device == "cpu":
        return BatchDefaults(2048 * world_size, 128 * world_size, "CPU default for vllm serve (2048 x ws / 128 x ws)")
    total = nvml_total_bytes or 0
    if total >= 160 * GiB and b200_tier:
        return BatchDefaults(16384, 1024, "GPU with >= 160 GiB (B200 tier)")
    if total >= 70 * GiB and "a100" not in gpu_name.lower():
        return BatchDefaults(8192, 1024, "GPU with >= 70 GiB, not an A100 (H100/H200 tier)")
    return BatchDefaults(2048, 256, "GPU under 70 GiB or an A100")


def resolve_batch(*, defaults: BatchDefaults, max_model_len: int, pinned_batched_tokens: int | None,
                  pinned_num_seqs: int | None, chunked_prefill: bool = True) -> tuple[int, int]:
    """`_set_default_max_num_seqs_and_batched_tokens_args` (arg_utils.py:3097)."""
    seqs = pinned_num_seqs if pinned_num_seqs is not None else defaults.max_num_seqs
    if pinned_batched_tokens is not None:
        batched = pinned_batched_tokens
    else:
        batched = defaults.max_num_batched_tokens
        if not chunked_prefill:
            batched = max(max_model_len, batched)
        batched = min(seqs * max_model_len, batched)
    if pinned_num_seqs is None:
        seqs = min(seqs, batched)
    return batched, seqs


def requested_bytes(cuda_total_bytes: int, utilization: float) -> int:
    return math.ceil(cuda_total_bytes * utilization)


# --------------------------------------------------------------------------- 0.34's extensible KV cache
#
# From 0.34 vLLM on CUDA reserves the KV cache's address range and commits its pages after warmup and
# CUDA-graph capture, sized from the memory then free (vllm/v1/worker/extensible_kv_cache.py in
# 0.34.0; on unless --kv-cache-memory-bytes, --num-gpu-blocks-override, elastic EP or a legacy-IPC
# connector, config/vllm.py:3180-3262, or where the driver has no virtual memory management, as
# under WSL2, utils/vmm_driver.py:513-547). `measure_kv_cache_bytes` (:592-617):
#   available = min(requested - used, free + committed - margin) - max(T, G)
# with used = init free - free - committed (weights, non-torch, persistent buffers, captured graphs),
# T the transient peak kept free (at least the profile run's peak plus the graphs' estimate,
# gpu_worker.py:771-773, :944-948, raised by the sizing warmup's own peak, warmup.py:452-534), G torch's
# reservation growth over a sizing step, margin = max(1 GiB, 0.75 x T) (:64-65). The utilization is
# only a cap, 1.0 when unset (config/cache.py:494-501), and free memory below it refuses nothing.
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 * GiB  # KV_CACHE_MARGIN_FLOOR_BYTES on CUDA (3 GiB on ROCm)
EXTENSIBLE_MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION
EXTENSIBLE_UTILIZATION = 1.0  # resolved_gpu_memory_utilization with the extensible KV cache
# Pages are committed per layer segment (the default LBNHC layout is layer-outermost) in granules:
# the driver's granularity floored at 2 MiB (utils/extensible_tensor.py:28-31), 2 MiB on NVIDIA GPUs.
EXTENSIBLE_GRANULE_BYTES = 2 * MiB
# Before sizing, vLLM runs full-batch steps (v1/worker/gpu/warmup.py:478-545, gpu_worker.py:1080-1092):
# max_num_batched_tokens of prefill with attention, which the profile run skips, and prompt logprobs
# (max_logprobs, 20 by default: config/model.py:300), taken in chunks of 1,024 rows
# (v1/worker/gpu/sample/prompt_logprob.py:19, :290-340) as head-dtype logits (model_executor/layers/
# logits_processor.py:98-120; the top-k and per-token logprobs are a few columns, sample/logprob.py:
# 87-140). Their allocated peak (`sizing_step`) raises T where it is above the profile's; G is the
# same step's growth of torch's reservation from an emptied cache (warmup.py:452-477): the step's
# allocated peak plus what fragmentation adds, which vLLM's own note on the margin (:50-63) measured
# at over 25 % for the first prefill of an 8B model and up to 45 % under adversarial loads. The
# band takes G up to 45 % above the step's peak (G leaves the margin as it is: only T sets it).
# MLA models then run a step over one workspace of cached context (warmup.py:531-545, `run_context_prefill_
# warmup` :378-420), which up-projects it chunk by chunk (`mla_context_step`). A pinned --max-logprobs -1
# ranks the whole vocabulary, and decode context parallelism gathers MLA's context across ranks: those
# steps are not derived, and there the band takes T itself up to 45 % above the profiled peak plus the
# graphs, as such a step may reach it.
EXTENSIBLE_RESERVE_GROWTH = 0.45
EXTENSIBLE_TRANSIENT_GROWTH = 0.45
PROMPT_LOGPROB_CHUNK_ROWS = 1024  # v1/worker/gpu/sample/prompt_logprob.py:19 CHUNK_SIZE
DEFAULT_MAX_LOGPROBS = 20  # config/model.py:300
# MLA's chunked-context workspace rows: min(max(8 x max_model_len, 4 x max_num_seqs x block), 64k), rounded up
# to the block (model_executor/layers/attention/mla_attention.py:2534-2559, :2218-2230).
MLA_CONTEXT_WORKSPACE_CAP = 64 * 1024


@dataclass(frozen=True)
class SizingStep:
    """The allocated transient peak of the sizing warmup's full-batch step, phase by phase (bytes)."""

    forward: int  # the layers' peak, as the profile's V2 forward (v2_forward_bytes)
    logprobs: int  # the model's output hidden states beside one chunk of prompt-logprob logits (0 if none)
    context: int = 0  # MLA: the context step's up-projected chunks (mla_context_step)
    padded_v: bool = False  # MLA: FlashAttention 2 pads v in that step (mla_prefill_pads_v)

    @property
    def bytes(self) -> int:
        return max(self.forward, self.logprobs, self.context)

    @property
    def phase(self) -> str:
        padded = ", v padded for FlashAttention 2" if self.padded_v else ""
        return (f"MLA's context up-projection{padded}" if self.context >= max(self.forward, self.logprobs) else
                "its prompt-logprob chunk" if self.logprobs > self.forward else "its forward")


@dataclass(frozen=True)
class ExtensibleKv:
    """What 0.34's extensible KV cache leaves for the KV pages, and what it keeps free (bytes)."""

    kv_bytes: int  # before the granule rounding of the pages (`extensible_pages`)
    transient: int  # T: the profile run's transient peak plus the graphs' estimate, or the sizing step's if higher
    margin: int  # max(1 GiB, 0.75 x T)
    capped: bool  # the utilization's cap binds, not the free memory less the margin
    error_bytes: int  # +/- from G above the sizing step's peak (or T's growth where the step is not derived)
    step: SizingStep | None = None  # the sizing warmup's full-batch step, where derived


# Terms of the profile peak that stay allocated after it (the fused-MoE workspace, vllm/model_executor/layers/
# fused_moe; what the fitted constant stands for): under the extensible KV cache they are held, not transient.
PERSISTENT_PEAK_TERMS = frozenset({"MoE workspace", "constant"})
# The attention backend's workspaces, allocated lazily after the profile run (before 0.34 from the memory vLLM
# did not request; from 0.34 before the measurement, so out of the KV cache). FlashInfer, the attention backend
# on compute capability 10.x (platforms/cuda.py:143-151 in 0.34.0): max(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
# 394 MiB, max_num_batched_tokens x query heads x head_dim x 16 B) (v1/attention/backends/flashinfer.py:
# 1282-1304), and the TRT-LLM kernels' own 394 MiB buffer (:151-157), counted as allocated.
FLASHINFER_WORKSPACE_BYTES = 394 * MiB
FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM = 16


def post_profile_workspaces(geometry: ModelGeometry, *, compute_capability: tuple[int, int] | None, tp: int,
                            batched_tokens: int) -> tuple[int, str]:
    """(bytes, rule) of the attention workspaces allocated after the profile run on one rank."""
    if compute_capability is None or compute_capability[0] != 10 or geometry.mla is not None:
        return 0, ""
    heads = max(geometry.num_attention_heads // max(tp, 1), 1)
    prefill = max(FLASHINFER_WORKSPACE_BYTES,
                  batched_tokens * heads * geometry.head_dim * FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM)
    return prefill + FLASHINFER_WORKSPACE_BYTES, "FlashInfer's and TRT-LLM's workspaces (compute capability 10.x)"


def extensible_margin(transient: int) -> int:
    return max(EXTENSIBLE_MARGIN_FLOOR_BYTES, int(transient * EXTENSIBLE_MARGIN_FRACTION))


def sizing_step(geometry: ModelGeometry, *, batched_tokens: int, tp: int, act_dtype_bytes: int = 2,
                max_logprobs: int = DEFAULT_MAX_LOGPROBS, max_model_len: int | None = None,
                max_num_seqs: int = 1024, block: int = 16, dcp: int = 1,
                compute_capability: tuple[int, int] | None = None, fp8: str | None = None) -> SizingStep | None:
    """The sizing steps' allocated peak (warmup.py:478-545), or None where it is not derived (--max-logprobs
    -1; MLA under decode context parallelism). Attention runs this time: at its call the split graph holds the
    residual, q, k, the qkv buffer (v is its view) and the output, less than the piece's end before it
    (`v2_forward_bytes`), and FlashAttention adds only its fp32 log-sum-exp. Prompt logprobs: the hidden states of every
    token stay alive while each 1,024-row chunk's logits are made (on the rank's vocabulary shard,
    gathered whole at TP > 1; Gemma 2's soft cap holds two whole copies at a time). Where max_model_len is
    below the batch, the logprobs are asked on one prompt of that length (warmup.py:497-515). MLA's context
    step pads v on the card's FlashAttention version (`mla_prefill_pads_v`; unknown card: padded)."""
    if max_logprobs < 0 or (geometry.mla is not None and dcp > 1):
        return None
    t, h, tp = batched_tokens, geometry.hidden_size, max(tp, 1)
    pads_v = geometry.mla is not None and mla_prefill_pads_v(compute_capability)
    context = mla_context_step(geometry, tp=tp, max_model_len=max_model_len or t, max_num_seqs=max_num_seqs,
                               batched_tokens=t, block=block, act_dtype_bytes=act_dtype_bytes, pads_v=pads_v)
    forward = v2_forward_bytes(geometry, batched_tokens=t, tp=tp, act_dtype_bytes=act_dtype_bytes, fp8=fp8)
    if max_logprobs == 0:
        return SizingStep(forward, 0, context, pads_v)
    prompt = min(t, max_model_len) if max_model_len else t
    rows, vocab = min(prompt, PROMPT_LOGPROB_CHUNK_ROWS), geometry.vocab_size
    # At most two copies alive at once: the shard beside the gathered whole (TP > 1), then each step of the
    # soft cap (divide, tanh, multiply, each a new tensor that frees the one before it).
    gather = 1 + 1 / tp if tp > 1 else 1.0
    copies = max(gather, 2.0 if geometry.text_config.get("final_logit_softcapping") else 1.0)
    logprobs = act_dtype_bytes * prompt * h + int(act_dtype_bytes * rows * vocab * copies)
    return SizingStep(forward, logprobs, context, pads_v)


def mla_prefill_pads_v(compute_capability: tuple[int, int] | None) -> bool:
    """Whether 0.34's FlashAttention MLA prefill pads v to the q/k head dim before each call: FA2 needs equal head
    dims, FA3 on SM90 and FA4 on SM100/110 do not (v1/attention/backends/mla/prefill/flash_attn.py:381-393,
    :420-423; the version per card: fa_utils.py:98-107, vllm_flash_attn/flash_attn_interface.py:72-86, FA4 shipped
    in the wheel's vllm_flash_attn/cute). Hopper and older pick FlashAttention alone (platforms/interface.py:
    471-491); an unknown card is taken as padding (the larger step)."""
    return compute_capability is None or compute_capability[0] not in (9, 10, 11)


def mla_context_step(geometry: ModelGeometry, *, tp: int, max_model_len: int, max_num_seqs: int,
                     batched_tokens: int, block: int, act_dtype_bytes: int = 2, pads_v: bool) -> int:
    """The allocated peak of MLA's context step (0.34.0 v1/worker/gpu/warmup.py:378-420): requests of
    min(max_model_len - 3, W) cached tokens, as many as fill the workspace of W rows (at most max_num_seqs and
    max_num_batched_tokens / 2 of them), packed greedily into chunks of at most W rows split on the block
    (mla_attention.py:2147-2210). Each chunk up-projects its rows through kv_b_proj, [rows, heads, nope + v],
    and builds k, [rows, heads, nope + rope] (:3254-3270); the next chunk's are made while the previous
    chunk's are still bound (:3198), so two chunks' tensors overlap at the boundary. Where FlashAttention pads v
    (`pads_v`), the call holds a third copy, [rows, heads, nope + rope], beside the chunk's own two; it is freed on
    return, before the next chunk (prefill/flash_attn.py:420-423)."""
    mla = geometry.mla
    if mla is None:
        return 0
    heads = max(geometry.num_attention_heads // max(tp, 1), 1)
    chunks = mla_context_chunks(max_model_len=max_model_len, max_num_seqs=max_num_seqs, block=block,
                                batched_tokens=batched_tokens)
    kv_row = heads * (mla.qk_nope_head_dim + mla.v_head_dim) * act_dtype_bytes
    k_row = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * act_dtype_bytes if mla.qk_rope_head_dim else 0
    padded_v = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * act_dtype_bytes if pads_v else 0
    peak = max(chunks) * (kv_row + k_row + padded_v)
    for before, rows in itertools.pairwise(chunks):
        peak = max(peak, before * (kv_row + k_row) + rows * kv_row, rows * (kv_row + k_row) + before * k_row)
    return peak


def mla_context_chunks(*, max_model_len: int, max_num_seqs: int, block: int, batched_tokens: int) -> list[int]:
    """Rows of each chunk of MLA's context step: the workspace W (mla_attention.py:2534-2559, :2218-2230), the
    requests `run_context_prefill_warmup` builds (warmup.py:390-407; query 2 tokens without speculative decoding,
    the KV blocks taken as there), packed by `_context_chunks`. tests/data/vllm_extensible_oracle.json
    ("mla_context") holds 0.34.0's own functions over a grid."""
    workspace = min(max(8 * max_model_len, 4 * max_num_seqs * block), MLA_CONTEXT_WORKSPACE_CAP)
    workspace = cdiv(max(workspace, block), block) * block
    query = 2  # decode_query_len + 1 without speculative decoding
    context = min(max_model_len - query - 1, workspace)
    if context <= 0:
        return [0]
    requests = min(cdiv(workspace, context), max_num_seqs, batched_tokens // query)
    return _context_chunks([context] * requests, workspace, block)


def _context_chunks(context_lens: list[int], budget: int, alignment: int) -> list[int]:
    """Rows per chunk of `plan_mla_context_chunks` without decode context parallelism (mla_attention.py:2147-2210):
    requests packed in order; one that does not fit the rows left is split at the largest block-aligned length
    that fits (and below its own length), the rest carried to the next chunk."""
    chunks: list[int] = []
    request, start = 0, 0
    while request < len(context_lens):
        rows = 0
        while request < len(context_lens):
            remaining = context_lens[request] - start
            if rows + remaining > budget:
                split = min(budget - rows, (remaining - 1) // alignment * alignment) // alignment * alignment
                if split > 0:
                    rows += split
                    start += split
                break
            rows += remaining
            request, start = request + 1, 0
        if rows == 0:  # nothing fit (cannot happen with a budget of whole blocks); stop rather than loop
            break
        chunks.append(rows)
    return chunks or [0]


def extensible_kv(*, requested: int, free_at_init: int, resident: int, transient: int,
                  growth: int = 0, step: SizingStep | None = None) -> ExtensibleKv:
    """`measure_kv_cache_bytes` with T = `transient` raised to the sizing `step`'s peak, and G = `growth`
    (the plan takes G <= T at the centre): `resident` is everything vLLM holds after capture but the KV
    pages (weights, non-torch, persistent buffers, captured graphs), i.e. init free - free - committed;
    the headroom free + committed is then init free - resident. tests/data/vllm_extensible_oracle.json
    holds 0.34.0's own function on a grid."""
    if step is not None:
        transient = max(transient, step.bytes)
    margin = extensible_margin(transient)
    capped = requested < free_at_init - margin
    # Negative where the rest does not fit (vLLM clips at 0): the planner refuses it, as a negative budget before.
    kv = min(requested, free_at_init - margin) - resident - max(transient, growth)
    if step is not None:
        reserve = max(transient, growth, int(step.bytes * (1 + EXTENSIBLE_RESERVE_GROWTH)))
        worse = min(requested, free_at_init - margin) - resident - reserve
    else:
        grown = int(transient * (1 + EXTENSIBLE_TRANSIENT_GROWTH))
        worse = min(requested, free_at_init - extensible_margin(grown)) - resident - grown
    return ExtensibleKv(kv, transient, margin, capped, kv - worse, step)


def extensible_pages(kv_bytes: int, *, segments: int) -> int:
    """`ExtensibleKVCache.blocks_within` in bytes: each of `segments` layer segments commits whole granules,
    so what the pages can use is a multiple of segments x granule (equal strides). A negative budget
    stays as it is (nothing fits)."""
    if kv_bytes <= 0:
        return kv_bytes
    unit = max(segments, 1) * EXTENSIBLE_GRANULE_BYTES
    return kv_bytes // unit * unit


# --------------------------------------------------------------------------- the profile run's peak
#
# vLLM measures the torch peak of one dummy forward at max_num_batched_tokens (T) followed by
# one dummy sampler run over R = min(T, max_num_seqs) rows (vllm/v1/worker/gpu_model_runner.py:5721
# `profile_run` and :5556 `_dummy_sampler_run` in 0.19.1; gpu_worker.py:332 reads the peak after
# both). The terms below are the tensors alive at that peak, from their shapes; one constant is
# fitted. Data and residuals: docs/engine-versions.md ("The activation peak").

# cuBLAS/compile workspaces and small buffers: the median residual of the shape sum over the nine
# vLLM 0.19.0 H100 logs (tests/data/startup-logs/startup-logs-2.yaml, llm-d-planner sweep).
PROFILE_CONSTANT_BYTES = int(0.052 * GiB)
# Eight of those nine land within the print resolution (0.01 GiB) after the constant, Gemma 3 and
# Mistral 3 with their dummy images (`encoder_profile`: Gemma 3 was 0.14 GiB above without them);
# Kimi-VL sits 0.02 GiB above (its MoonViT dummy batch is not derived). The band stays wider than
# those residuals: all nine are one source's H100 runs. The V2 runner's terms are from shapes
# only (no 0.22+ log prints a peak): a wider band until one does.
V1_PEAK_ERROR_BYTES = int(0.15 * GiB)
V2_PEAK_ERROR_BYTES = int(0.5 * GiB)
# The V2 runner's language-model forward, where vLLM's own compiled pieces were run (tests/oracles/
# vllm_lm_forward_oracle.py: 0.34.0's and 0.32.0's VLLM_COMPILE pipeline and Inductor, on the CPU):
# `v2_forward_bytes` equals every record of these to 8 B a token (Gemma's sandwich norms keep two fp32 variances).
# Their peak takes V1's band (the constant and what the runner holds beside the forward, as there) plus
# LM_FORWARD_ERROR_FRACTION of the forward, for what Inductor's CUDA scheduler may plan apart from its CPU one (the
# same lowering and buffer reuse; mm padding on misaligned GEMMs is CUDA's own); so do the MoE architectures of
# MOE_FORWARD_HELD. Others keep V2_PEAK_ERROR_BYTES: MLA, hybrids, and layouts whose pieces Inductor plans otherwise:
# GLM-4's post-norms were run too and hold buffers these do not at some TP sizes (within that band).
# Granite scales the residual branch (`residual_multiplier`) instead of the fused add-norm: the oracle's pieces keep
# the summed residual through the MLP's gate_up GEMM (3 H + q + 2 I) and one hidden-wide buffer fewer at the next
# norm (4 H + q); every Granite record equals that.
# Gemma 1's own class (models/gemma.py, gone in 0.34, which serves it through the Transformers backend) equals the
# formula at TP 1/2/4/8 on 0.32.0 (tests/data/vllm_lm_forward_oracle-transformers-0.32.0.json); a release that
# serves an architecture through the Transformers backend takes that backend's band instead (profile_peak).
RESIDUAL_MULTIPLIER_ARCHITECTURES = frozenset({"GraniteForCausalLM"})
LM_FORWARD_TRACED = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM", "Mistral3ForConditionalGeneration",
    "GraniteForCausalLM", "GemmaForCausalLM"})
LM_FORWARD_ERROR_FRACTION = 0.03
# FP8 checkpoints (compressed-tensors W8A8: fp8 weights, activations quantized at each linear layer's input, per
# tensor with a static scale or per token on the fly) where CUTLASS's scaled mm runs them: SM 8.9 and 9.0
# (FlashInfer's from SM 10.0, kernels/linear/scaled_mm/flashinfer.py:41-51; W8A8 needs 8.9, below it the weights run
# Marlin). The GEMM is an op whose output ops.cutlass_scaled_mm allocates (_custom_ops.py:748-795); the input's
# quantization is QuantFP8's native code, compiled into the pieces (layers/quantization/input_quant_fp8.py), and
# Llama's MLP hands a static scale to one fused silu-and-quantize op instead (models/llama.py:120,
# layers/fusion/fused_act_quant.py; from 0.30.0, absent from 0.29.0's llama.py). The oracle ran these with vLLM's
# own W8A8 modules: 0.32.0 and 0.34.0 agree at every TP size run; 0.29.0 agrees at TP 1 and holds more at TP 4 with
# per-token scales (Qwen3 8B +2,048 B a token, Llama 3.1 8B +4), so releases before 0.32 keep the wider band.
FP8_FORWARD_TRACED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
FP8_FUSED_ACT_QUANT = frozenset({"LlamaForCausalLM"})
FP8_FUSED_ACT_QUANT_SINCE = "0.30"
FP8_FORWARD_SINCE = "0.32"
# MoE layers as a default CUDA start runs an unquantized checkpoint: the opaque `moe_forward` op (fused_moe/runner/
# moe_runner.py:205-219, :313-335) around the Triton experts (SM 8.x-9.x, oracle/unquantized.py:50-95), whose GEMM
# caches sit in the persistent workspace ("MoE workspace"). What the compiled piece holds beside the op, in
# hidden-wide buffers and fp32 norm variances a token, is each architecture's own (the oracle's records: Qwen3-MoE
# keeps the post-attention norm's input and variance alive, GLM-4.5 the input, Mixtral and Qwen2-MoE neither);
# shared experts run first inside the op (Qwen2-MoE's gated by a sigmoid, GLM-4.5's not).
MOE_FORWARD_HELD: Mapping[str, tuple[int, int]] = {
    "Qwen3MoeForCausalLM": (4, 4), "MixtralForCausalLM": (3, 0), "Qwen2MoeForCausalLM": (3, 0),
    "Glm4MoeForCausalLM": (4, 0)}
# GLM-4.5's router computes its logits in float32 (GateLinear out_dtype, models/glm4_moe.py:141-145); others in the
# activations' dtype.
MOE_ROUTER_LOGIT_BYTES: Mapping[str, int] = {"Glm4MoeForCausalLM": 4}
# The Triton experts' alignment block (BLOCK_SIZE_M at a prefill's token count): moe_align_block_size pads each
# expert's rows to it (moe_align_block_size.py:83-97), a few KB a layer.
MOE_ALIGN_BLOCK = 64
# Per-head q/k norms (models/qwen3.py, qwen3_moe.py): their fp32 variances stay alive to the piece's end.
QK_NORM_ARCHITECTURES = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})

# Streaming multiprocessors: the Triton top-k/top-p kernel keeps a [min(SMs, R), V] fp32 buffer
# (vllm/v1/sample/ops/topk_topp_triton.py:965). By GPU name; 132 (H100) when unknown.
SM_COUNTS = {"h100": 132, "h200": 132, "h20": 78, "gh200": 132, "b200": 148, "b300": 148, "a100": 108,
             "a800": 108, "l40s": 142, "l40": 142, "l4": 58, "a10": 72, "a6000": 84, "a5000": 64,
             "4090": 128, "4080": 76, "4070": 46, "4060": 24, "3090": 82, "3080": 68, "5090": 170, "5080": 84,
             "t4": 40, "v100": 80, "rtxpro6000": 188, "6000ada": 142}
DEFAULT_SM_COUNT = 132


def sm_count(gpu_name: str) -> int:
    name = gpu_name.lower().replace(" ", "").replace("-", "")
    for key in sorted(SM_COUNTS, key=len, reverse=True):
        if key in name:
            return SM_COUNTS[key]
    return DEFAULT_SM_COUNT


@dataclass(frozen=True)
class ProfilePeak:
    """The torch peak of vLLM's profile run, term by term (bytes)."""

    terms: tuple[tuple[str, int], ...]
    total_bytes: int
    error_bytes: int
    runner: str  # "V1" or "V2" (the model runner that profiles)
    persistent_bytes: int = 0  # V2 penalty state: allocated at init and counted with the weights from 0.27
    # Before 0.19, where it is not known whether FlashInfer is installed beside vLLM: how much less the peak
    # holds with its sampler than with the sort planned.
    flashinfer_saves_bytes: int = 0
    encoder_rule: str = ""  # how the multimodal dummy batch was counted (`encoder_profile`), where it runs
    encoder_item: str = ""  # the dummy item's kind (`EncoderProfile.item`)
    forward_rule: str = ""  # where the compiled forward comes from, where it is the peak's phase (`v2_forward_rule`)

    def describe(self) -> str:
        return " + ".join(f"{name} {format_gib(bytes_, unit=False)}" for name, bytes_ in self.terms if bytes_) + " GiB"


def moe_workspace_bytes(geometry: ModelGeometry, *, batched_tokens: int, tp: int) -> int:
    """The fused-MoE workspace (vllm/model_executor/layers/fused_moe/fused_moe.py:1976), which persists:
    workspace1 (T, topk, max(N/2, H)) + workspace2 (T, topk, max(N, H)), N = 2 x moe_intermediate / TP,
    bf16. gpt-oss's MXFP4 experts run the Triton MoE path without it."""
    moe = geometry.expert_intermediate_size
    topk = geometry.experts_per_token
    if not geometry.num_experts or not topk or not isinstance(moe, int) or moe <= 0:
        return 0
    method = (geometry.quantization.method if geometry.quantization else "") or ""
    if "mxfp4" in method.lower():
        return 0
    n, h = 2 * moe // max(tp, 1), geometry.hidden_size
    return 2 * batched_tokens * topk * (max(n // 2, h) + max(n, h))


def mxfp4_dp_workspace_bytes(geometry: ModelGeometry, *, tokens: int, one_rank_tokens: int, tp: int) -> int:
    """gpt-oss's MXFP4 experts under data parallelism: OAITritonExperts' workspace (M x topk, N/2) and output
    (M, K), plus the kernel's own (M x topk, K) (experts/gpt_oss_triton_kernels_moe.py:1108-1124, :729-760 in
    0.34.0), bf16, for the DP-gathered M = `tokens`, beyond what one rank's batch takes (the one-rank starts
    this was fitted on hold that part already)."""
    moe = geometry.expert_intermediate_size
    topk = geometry.experts_per_token
    if not isinstance(moe, int) or moe <= 0 or not topk or tokens <= one_rank_tokens:
        return 0
    per_token = 2 * (topk * (moe // max(tp, 1) + geometry.hidden_size) + geometry.hidden_size)
    return (tokens - one_rank_tokens) * per_token


# The modalities each wrapper's processor supports (`supported_mm_limits` of its processing info);
# a modality left out of --limit-mm-per-prompt keeps vLLM's default of 999 items.
MM_MODALITIES: Mapping[str, frozenset[str]] = {
    **dict.fromkeys(("Gemma3ForConditionalGeneration", "Mistral3ForConditionalGeneration",
                     "Llama4ForConditionalGeneration", "KimiVLForConditionalGeneration",
                     "LlavaForConditionalGeneration", "PixtralForConditionalGeneration"), frozenset({"image"})),
    **dict.fromkeys(("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                     "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                     "Glm4vForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                     "Qwen3_5MoeForConditionalGeneration"), frozenset({"image", "video"})),
    "Gemma3nForConditionalGeneration": frozenset({"image", "audio"}),
}
ALL_MODALITIES = frozenset({"image", "video", "audio"})


def encoder_profiled(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> bool:
    """Whether vLLM's profile run runs the vision/audio encoder and holds its outputs
    (gpu_model_runner.py `profile_run`: skipped with --skip-mm-profiling, with
    --language-model-only, or when --limit-mm-per-prompt sets every supported modality to 0:
    multimodal/encoder_budget.py:72-90 keeps only modalities with a limit > 0)."""
    if not geometry.is_multimodal or pinned.get("--language-model-only") or pinned.get("--skip-mm-profiling"):
        return False
    limits = mm_limits(pinned)  # unreadable: the engine's own parser decides; the term is kept
    return any(limits[modality] > 0 for modality in MM_MODALITIES.get(geometry.architecture, ALL_MODALITIES))


def _pinned_json(pinned: Mapping[str, Any], flag: str) -> Mapping[str, Any]:
    """A pinned JSON-object flag as a mapping; empty where unset or not a readable object."""
    raw = pinned.get(flag)
    try:
        value = json.loads(raw) if isinstance(raw, str) else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, Mapping) else {}


def mm_limits(pinned: Mapping[str, Any]) -> dict[str, int]:
    """--limit-mm-per-prompt as vLLM reads it per modality (999 where unset or unreadable)."""
    limits = _pinned_json(pinned, "--limit-mm-per-prompt")
    return {modality: _mm_count(limits.get(modality, MM_DEFAULT_LIMIT)) for modality in sorted(ALL_MODALITIES)}


def mm_max_pixels(pinned: Mapping[str, Any]) -> int | None:
    """--mm-processor-kwargs' max_pixels (or size.longest_edge), which sizes a Qwen-VL dummy image
    (qwen2_vl.py `_get_vision_size`, 0.34.0 :952-977); None where unset or not a positive int."""
    kwargs = _pinned_json(pinned, "--mm-processor-kwargs")
    size = kwargs.get("size")
    value = kwargs.get("max_pixels")
    if value is None and isinstance(size, Mapping):  # `_get_vision_size`: max_pixels over size.longest_edge
        value = size.get("longest_edge")
    if isinstance(value, int) and not isinstance(value, bool) and value > MM_MAX_PIXELS:
        return MM_MAX_PIXELS  # beyond any real image: bounded, the larger item (the safe side)
    return _count(value, MM_MAX_PIXELS)


def _mm_count(value: Any) -> int:
    """A limit is a count or {"count": n, ...} (config/multimodal.py `limit_per_prompt`)."""
    if isinstance(value, Mapping):
        value = value.get("count", MM_DEFAULT_LIMIT)
    return value if isinstance(value, int) and not isinstance(value, bool) else MM_DEFAULT_LIMIT


# MoonViT (Kimi-VL): Rope2DPosEmb(head_dim, 512, 512) computes its complex64 table [512, 512, head_dim / 2] on the
# first encoder forward and keeps it (a cached_property: 0.19.0 model_executor/models/moonvit.py:217-244, :467;
# 0.32.0 :252-280, :528-530): the profile run's encoder pass creates it inside the torch peak. Kimi-K2.5's
# MoonViT3d registers the same table as a buffer on its first get_freqs_cis, its head dim from
# qkv_hidden_size where given (0.32.0 kimi_k25_vit.py:249-300, :549-551).
MOONVIT_GRID = 512
COMPLEX64_BYTES = 8
MOONVIT_ARCHITECTURES = frozenset({"KimiK25ForConditionalGeneration"})


def vision_rope_table_bytes(geometry: ModelGeometry) -> int:
    """The vision tower's rotary table the encoder's first forward caches (MoonViT's), 0 for other towers."""
    vision = geometry.vision_config
    width = vision.get("qkv_hidden_size") or vision.get("hidden_size")
    heads = vision.get("num_attention_heads")
    moonvit = vision.get("model_type") == "moonvit" or geometry.architecture in MOONVIT_ARCHITECTURES
    if not moonvit or not isinstance(width, int) or not isinstance(heads, int) or width <= 0 or heads <= 0:
        return 0
    return MOONVIT_GRID * MOONVIT_GRID * (width // heads // 2) * COMPLEX64_BYTES


# The profile run's multimodal dummy batch (gpu_model_runner.py `profile_run`, 0.19.0 :5722-5794): N items of the
# modality with the most tokens per item, N = max(1, min(budget // tokens, max_num_seqs x max(1, min(limit,
# max_model_len // tokens)))) with budget = max(max_num_batched_tokens, tokens) (multimodal/encoder_budget.py
# `_get_max_items`, v1/core/encoder_cache_manager.py:296-314; 0.11.0 v1/worker/utils.py:84-127 alike). Their
# encoder outputs stay in encoder_cache through the dummy forward and sampler run; on the V1 runner (and before
# 0.19) the device copy of the dummy pixels does too: `batched_dummy_mm_inputs` is a local of profile_run, freed
# on return (0.19.0 :5764, :5793 deletes only the hidden states and output; 0.11.0 :3354, 0.14.1 :4725). The V2
# runner moves them to the device inside `execute_mm_encoder` and drops them there (0.34.0
# v1/worker/gpu/mm/encoder_runner.py:111-147). Floating inputs are cast to the model dtype as the processor
# returns them (multimodal/processing/context.py:232-233 in 0.19.0; processing.py:1024 in 0.11.0).
# Towers whose dummy image config.json fixes, with the processor's defaults (pan-and-scan off):
#   Gemma 3: SigLIP at vision_config.image_size, mm_tokens_per_image embeds per image (gemma3_mm.py:194-210)
#   Mistral 3: Pixtral-HF at image_size, ceil(image_size / (patch x spatial_merge))^2 embeds (pixtral.py:946-994)
MM_DERIVED_ARCHITECTURES = frozenset({"Gemma3ForConditionalGeneration", "Mistral3ForConditionalGeneration"})
# Other towers: the dummy pixels are not derived here; the band takes them at the largest input bytes per
# embedded token of the derived towers (Gemma 3: 3 x 896^2 x 2 B over 256 tokens = 18,816 B) over the budget.
MM_UNDERIVED_INPUT_BYTES_PER_TOKEN = 18_816
MM_DEFAULT_LIMIT = 999  # config/multimodal.py: a modality's default count per prompt


@dataclass(frozen=True)
class EncoderProfile:
    """What the profile run's multimodal dummy batch holds at the peak (bytes), and how it was counted."""

    outputs_bytes: int  # the encoder outputs in encoder_cache
    inputs_bytes: int  # the dummy pixels on the device (the V1 runner, 0.8.5-0.28)
    error_bytes: int  # the dummy pixels of a tower not derived here, at the bound
    rule: str
    forward_bytes: int = 0  # the vision tower's own forward peak (pixels included), where derived
    forward_error_bytes: int = 0
    # What the dummy item is, so what shrinks it: "video" (frames within max_model_len), "image" (sized by
    # max_pixels), "fixed image" (config.json's size: only fewer of them, the encoder budget); "" not derived.
    item: str = ""


# Beyond these a config.json is not a real tower's (config.json is text a stranger writes): not derived.
MM_MAX_IMAGE_SIDE = 65_536
MM_MAX_TOKENS_PER_IMAGE = 1 << 20


def _count(value: Any, limit: int) -> int | None:
    """A positive int up to `limit` (not a bool, a float or a string), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit else None


def _mm_items(tokens: int, batched_tokens: int, num_seqs: int, max_model_len: int | None, limit: int) -> int:
    """Items of `tokens` each in the profile's dummy batch (encoder_budget.py `_get_max_items`)."""
    per_prompt = max(1, min(limit, (max_model_len or MM_DEFAULT_LIMIT * tokens) // tokens))
    return max(1, min(max(batched_tokens, tokens) // tokens, num_seqs * per_prompt))


def _dummy_image(geometry: ModelGeometry) -> tuple[int, int] | None:
    """(embeds per image, side in pixels) of the profile's square dummy image, where config.json fixes it."""
    vision, wrapper = geometry.vision_config, geometry.wrapper_config
    size = _count(vision.get("image_size"), MM_MAX_IMAGE_SIDE)
    patch = _count(vision.get("patch_size"), MM_MAX_IMAGE_SIDE)
    if size is None:
        return None
    if geometry.architecture == "Gemma3ForConditionalGeneration":
        tokens = _count(wrapper.get("mm_tokens_per_image", 256), MM_MAX_TOKENS_PER_IMAGE)
        return (tokens, size) if tokens is not None else None
    if geometry.architecture == "Mistral3ForConditionalGeneration" and patch is not None:
        merge = _count(wrapper.get("spatial_merge_size", 1), MM_MAX_IMAGE_SIDE)
        if merge is None:
            return None
        # (size - 1) // (patch x merge) + 1 rows and columns (transformers pixtral `_num_image_tokens`), and the
        # processor pads the image to whole merged patches (`get_resize_output_image_size`)
        grid = (size - 1) // (patch * merge) + 1
        return grid * grid, grid * patch * merge
    return None


# Qwen2-VL and Qwen2.5-VL (qwen2_vl.py, the same in 0.11.0, 0.19.0 :820-1030, 0.34.0 :980-1200): the dummy image is
# the largest whose merged-patch grid factorizes max_pixels // (patch x merge)^2 at an aspect ratio <= 200
# (`get_image_size_with_most_features`), one frame of two temporal patches; the dummy video has that frame size
# and as many frames as fit max_model_len tokens, at most _MAX_FRAMES_PER_VIDEO = 14 (`_get_max_video_frames`,
# `get_num_frames_with_most_features`); the modality with more tokens is profiled (ties: video, encoder_budget.py
# `get_modality_with_max_tokens`). max_pixels is the repos' preprocessor_config.json value, 12,845,056 (3584^2:
# 16,384 tokens an image), unless --mm-processor-kwargs sets it. Each patch carries 3 x temporal x patch^2 pixels.
QWEN_VL_ARCHITECTURES = frozenset({"Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"})
QWEN_VL_MAX_PIXELS = 12_845_056
QWEN_VL_MAX_FRAMES = 14
MM_MAX_PIXELS = 1 << 34
# The vision tower's own forward runs before the language model's, so the profile's peak is the larger of the
# two. Per patch, what vLLM's own tower allocates on one rank (tests/data/vllm_vision_forward_oracle.json: the
# forward of 0.34.0's modules on the meta device, tensor by tensor, dispatched as a default CUDA start: the tower
# eager with the native ops the Inductor start selects, custom ops off and IR ops native, ViT FlashAttention;
# tensor parallelism as rank 0 of 2, 4 and 8 with CUDA's collectives' allocations;
# tests/oracles/vllm_vision_forward_oracle.py). In widths W (the tower's), I (its MLP), hd (a head) of the model
# dtype, the larger of a block's peaks:
# - attention (the native rotary): the block's input and its norm, whole; qkv (3 W), q and k made contiguous
#   (2 W) and the rotary's four temporaries (4 W), split by TP: 2 W + 9 W / TP; Qwen3-VL holds one more W (its
#   patch embeddings, alive through the loop). Under TP the FlashAttention call beside the previous layer's
#   all-reduced output: 4 W + 8 W / TP (Qwen3-VL 5 W); Qwen2-VL all-gathers qkv (`split_qkv`: 7 W + 8 W / TP, and
#   8 W + 3 W / TP while the gathered copy is made);
# - MLP: Qwen2-VL's fc1 and QuickGELU's sigmoid and product, 3 I / TP, beside the input, residual and norm (3 W);
#   Qwen2.5-VL's gate_up (2 I), SiluAndMul's silu and product (2 I) beside 4 W; Qwen3-VL's fc1 and GELU (2 I)
#   beside 4 W. Under TP the down projection's shard and its all-reduced output beside what stays: 6 W + 3 I / TP
#   (Qwen2.5-VL), 6 W + I / TP (Qwen3-VL), 5 W + I / TP (Qwen2-VL);
# - beside both: the rotary cos/sin per patch (hd; Qwen2.5-VL keeps them twice, window-ordered: 2 hd), Qwen3-VL's
#   deepstack outputs (levels x out / 4), and int64 indices (Qwen2.5-VL's window order 6 B a patch, Qwen3-VL's
#   positions up to 16 B); and before the blocks Qwen3-VL's position-embedding interpolation (7 W a frame's patch).
# Within 0.1 % of all 114 records (0.32.0's Qwen and Gemma 3 towers give the same bytes); +/- 3 % for what the
# trace cannot see (allocator rounding, kernels' own scratch). --enforce-eager runs vLLM's kernels instead (one
# output each): fewer temporaries, so this is an overestimate there. --mm-encoder-tp-mode data runs the tower whole
# on each rank (TP 1 here).
VISION_FORWARD_ERROR_FRACTION = 0.03


def _qwen_vl_frame(max_pixels: int, unit: int) -> int:
    """Merged tokens of `get_image_size_with_most_features`' image (height x width factors of the unit)."""
    tokens = max(max_pixels // (unit * unit), 1)
    for total in range(tokens, max(tokens - 10_000, 0), -1):  # a factor pair at aspect <= 200 is found at once
        low = next(d for d in range(math.isqrt(total), 0, -1) if total % d == 0)
        if total // low / low <= 200:
            return total
    return 1


def _qwen_grid(geometry: ModelGeometry) -> tuple[int, int, int] | None:
    """(patch, spatial merge, temporal patch) of a Qwen-VL tower's config, None where one is not a plausible int."""
    vision = geometry.vision_config
    patch = _count(vision.get("patch_size") or vision.get("spatial_patch_size"), MM_MAX_IMAGE_SIDE)
    merge = _count(vision.get("spatial_merge_size"), MM_MAX_IMAGE_SIDE)
    temporal = _count(vision.get("temporal_patch_size", 2), 64)
    return None if patch is None or merge is None or temporal is None else (patch, merge, temporal)


def _largest_item(sizes: Mapping[str, int], grid: tuple[int, int, int]) -> tuple[int, int, int, str] | None:
    """The modality with the most tokens an item (ties: video, encoder_budget.py `get_modality_with_max_tokens`)
    as (tokens an item, patches an item, pixels a patch, modality); None where no modality is active."""
    if not sizes:
        return None
    patch, merge, temporal = grid
    modality, tokens = max(sizes.items(), key=lambda item: (item[1], item[0]))
    return tokens, tokens * merge * merge, 3 * temporal * patch * patch, modality


def _qwen_vl_dummy(geometry: ModelGeometry, *, max_model_len: int | None, limits: Mapping[str, int],
                   max_pixels: int | None) -> tuple[int, int, int, str] | None:
    """(tokens an item, patches an item, pixels a patch, modality) of the profile's Qwen-VL dummy item."""
    grid = _qwen_grid(geometry)
    if grid is None:
        return None
    patch, merge, temporal = grid
    frame = _qwen_vl_frame(max_pixels or QWEN_VL_MAX_PIXELS, patch * merge)
    sizes: dict[str, int] = {}
    if limits.get("image", MM_DEFAULT_LIMIT) > 0:
        sizes["image"] = frame
    if limits.get("video", MM_DEFAULT_LIMIT) > 0:
        # The most frames whose grid_t x frame tokens fit max_model_len (1 when none does): grid_t = ceil(n / temporal).
        fitting = (max_model_len or 0) // frame * temporal
        frames = max(min(max(fitting, 1), QWEN_VL_MAX_FRAMES), 1)
        sizes["video"] = max(-(-frames // temporal), 1) * frame
    return _largest_item(sizes, grid)


# Qwen3-VL (qwen3_vl.py in 0.32.0 :938-1084): the image factorizes the image processor's longest_edge at patch 16 x
# merge 2 (the repos' 16,777,216: 16,384 tokens); the video is always two frames at the video processor's
# longest_edge / temporal patch (25,165,824: 12,288 tokens), whatever max_model_len; so the image is profiled.
# Its tower keeps per patch the position embeddings (W) and the deepstack features ([N / 4, out] at each of
# deepstack_visual_indexes) beside the block's own (qwen3_vl.py :862-900): attention as Qwen2.5-VL's, the
# ungated MLP `x + mlp(norm2(x))` 3 W + 2 I / TP (:487-506, :439-441); its encoder outputs are
# out x (1 + deepstack) wide (the features concatenated).
# Qwen3.5 / 3.6 take the same processing info and tower, without deepstack (qwen3_5.py :111-120, :500-520 in 0.32.0),
# planned with the Qwen3-VL repos' processor sizes.
QWEN3_VL_ARCHITECTURES = frozenset({"Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                                    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
QWEN3_VL_IMAGE_MAX_PIXELS = 16_777_216
QWEN3_VL_VIDEO_MAX_PIXELS = 25_165_824


def _qwen3_vl_dummy(geometry: ModelGeometry, *, limits: Mapping[str, int], image_pixels: int | None = None,
                    video_pixels: int | None = None) -> tuple[int, int, int, str] | None:
    """(tokens an item, patches an item, pixels a patch, modality) of the profile's Qwen3-VL dummy item."""
    grid = _qwen_grid(geometry)
    if grid is None:
        return None
    patch, merge, temporal = grid
    sizes: dict[str, int] = {}
    if limits.get("image", MM_DEFAULT_LIMIT) > 0:
        sizes["image"] = _qwen_vl_frame(image_pixels or QWEN3_VL_IMAGE_MAX_PIXELS, patch * merge)
    if limits.get("video", MM_DEFAULT_LIMIT) > 0:
        frame = _qwen_vl_frame(max(1, (video_pixels or QWEN3_VL_VIDEO_MAX_PIXELS) // temporal), patch * merge)
        sizes["video"] = max(-(-2 // temporal), 1) * frame  # two frames, round_up(2, temporal) // temporal
    return _largest_item(sizes, grid)


def _deepstack_levels(geometry: ModelGeometry) -> int:
    levels = geometry.vision_config.get("deepstack_visual_indexes")
    return len(levels) if isinstance(levels, list) and len(levels) <= 1024 else 0


def vision_forward_derived(geometry: ModelGeometry) -> bool:
    """Whether the profile's vision forward is derived for this tower (Qwen-VL, Gemma 3's SigLIP, Mistral 3's
    Pixtral-HF)."""
    return geometry.architecture in QWEN_VL_ARCHITECTURES | QWEN3_VL_ARCHITECTURES or bool(_image_tower(geometry))


def _forward_rule(patches: int, forward: int, tp: int) -> str:
    rank = f"a rank of TP {tp}" if tp > 1 else "one rank"
    return (f"; the vision forward over {patches:,} patches {format_gib(forward)} "
            f"+/- {VISION_FORWARD_ERROR_FRACTION:.0%} (vLLM's own tower on {rank}, traced)")


# The image towers encode every dummy image at once (one batch, v1/worker/gpu/mm/encoder_runner.py:111-175), per
# patch of the padded image, as traced (tests/data/vllm_vision_forward_oracle.json):
# - Gemma 3's SigLIP (siglip.py, gemma3_mm.py `_image_pixels_to_features`), (image_size / patch)^2 patches an image:
#   the attention's qkv (3 W) and FlashAttention's output (W) beside the layer's input, residual, norm and out_proj
#   output (4 W), or the MLP's fc1 and its GELU (2 I) beside 4 W: 26,432 B a patch for Gemma 3 4B, 12B and 27B
#   (the projector's pooled outputs are smaller);
# - Mistral 3's Pixtral-HF (pixtral.py), the image padded to whole merged patches: the attention's qkv (3 W) and the
#   native rotary's four temporaries (4 W) beside three of the stream (3 W), or the MLP's gate_up, silu and product
#   (4 I) beside five (5 W); beside both the patches unfolded (3 x patch^2), the rotary cos/sin (2 x a head) and
#   int64 positions (16 B): 44,456 B a patch for Mistral Small 3.1.
# Under TP (traced as rank 0 of 2, 4, 8): qkv, the attention's output or temporaries and the MLP split, beside the
# all-reduced outputs: SigLIP's attention 5 W + 4 W / TP and down projection 6 W + I / TP; Pixtral's 5 W + 6 W / TP
# and 7 W + I / TP.
def _image_tower(geometry: ModelGeometry) -> int:
    """Patches an image of the profile's dummy (`_dummy_image`) through its tower, 0 where none is derived: every
    tower whose dummy image is derived here (Gemma 3's SigLIP, Mistral 3's Pixtral-HF) is."""
    dummy = _dummy_image(geometry)
    patch = _count(geometry.vision_config.get("patch_size"), MM_MAX_IMAGE_SIDE)
    return (dummy[1] // patch) ** 2 if dummy is not None and patch else 0


def _image_tower_per_patch(geometry: ModelGeometry, *, tp: int, act_dtype_bytes: int) -> int:
    """Bytes a patch at the tower's forward peak on one rank (`_image_tower`'s towers)."""
    vision, tp = geometry.vision_config, max(tp, 1)
    width = _count(vision.get("hidden_size"), 1 << 20) or 0
    inner = _count(vision.get("intermediate_size"), 1 << 22) or 4 * width
    split = tp > 1
    if geometry.architecture == "Mistral3ForConditionalGeneration":
        patch = _count(vision.get("patch_size"), MM_MAX_IMAGE_SIDE) or 0
        head = width // (_count(vision.get("num_attention_heads"), 1 << 12) or 16)
        phases = [3 * width + 7 * width // tp, 5 * width + 4 * inner // tp]
        phases += [5 * width + 6 * width // tp, 7 * width + inner // tp] if split else []
        return (max(phases) + 3 * patch * patch + 2 * head) * act_dtype_bytes + 16
    phases = [4 * width + 4 * width // tp, 4 * width + 2 * inner // tp]
    phases += [5 * width + 4 * width // tp, 6 * width + inner // tp] if split else []
    return max(phases) * act_dtype_bytes


def _vision_forward_bytes(geometry: ModelGeometry, *, patches: int, tp: int, act_dtype_bytes: int,
                          frames: int = 1) -> int:
    """The Qwen-VL vision tower's forward peak over `patches` on one rank (see VISION_FORWARD_ERROR_FRACTION);
    `frames`: temporal patches per item (Qwen3-VL's position-embedding interpolation is per frame)."""
    vision, tp = geometry.vision_config, max(tp, 1)
    qwen3 = geometry.architecture in QWEN3_VL_ARCHITECTURES
    gated = geometry.architecture == "Qwen2_5_VLForConditionalGeneration"
    width = _count(vision.get("hidden_size") if qwen3 or gated else vision.get("embed_dim"), 1 << 20) or 0
    head = width // (_count(vision.get("num_heads"), 1 << 12) or 16)
    if qwen3 or gated:
        inner = _count(vision.get("intermediate_size"), 1 << 22) or 4 * width
    else:
        ratio = vision.get("mlp_ratio", 4)
        ratio = ratio if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 64 else 4
        inner = int(width * ratio)  # Qwen2VisionBlock: int(embed_dim * mlp_ratio)
    split = tp > 1  # the all-reduced outputs beside the shards (and Qwen2-VL's all-gathered qkv)
    if qwen3:
        out = _count(vision.get("out_hidden_size"), 1 << 20) or geometry.hidden_size
        phases = [3 * width + 9 * width // tp, 4 * width + 2 * inner // tp]
        phases += [5 * width + 8 * width // tp, 6 * width + inner // tp] if split else []
        values, indices = max(phases) + head + _deepstack_levels(geometry) * out // 4, 16
        # Before the blocks, `fast_pos_embed_interpolate` holds four gathered position embeddings, their weighted
        # sum and its permuted copy per patch of a frame (7 W, and ~160 B of int64 indices and weights): the peak
        # where the blocks' shards are small (TP 8)
        before_blocks = (7 * width * act_dtype_bytes + 160) // max(frames, 1)
    elif gated:
        phases = [2 * width + 9 * width // tp, 4 * width + 4 * inner // tp]
        phases += [4 * width + 8 * width // tp, 6 * width + 3 * inner // tp] if split else []
        values, indices, before_blocks = max(phases) + 2 * head, 6, 0
    else:
        phases = [2 * width + 9 * width if not split else 7 * width + 8 * width // tp, 3 * width + 3 * inner // tp]
        phases += [8 * width + 3 * width // tp, 5 * width + inner // tp] if split else []
        values, indices, before_blocks = max(phases) + head, 0, 0
    return patches * max(values * act_dtype_bytes + indices, before_blocks)


def encoder_profile(geometry: ModelGeometry, *, batched_tokens: int, num_seqs: int, max_model_len: int | None,
                    act_dtype_bytes: int, inputs_alive: bool, tp: int = 1,
                    limits: Mapping[str, int] | None = None, max_pixels: int | None = None,
                    vision_tp: int | None = None) -> EncoderProfile:
    """The encoder outputs (and, where `inputs_alive`, the dummy pixels) the profile run holds at its peak, and
    for the towers derived the vision forward's own peak (`forward_bytes`, before the language model runs)."""
    t, h = batched_tokens, geometry.hidden_size
    if geometry.architecture in QWEN_VL_ARCHITECTURES | QWEN3_VL_ARCHITECTURES:
        qwen = (_qwen_vl_dummy(geometry, max_model_len=max_model_len, limits=limits or {}, max_pixels=max_pixels)
                if geometry.architecture in QWEN_VL_ARCHITECTURES else
                # a flat max_pixels reaches both scopes (processing/context.py:502-515, qwen3_vl.py :949-957)
                _qwen3_vl_dummy(geometry, limits=limits or {}, image_pixels=max_pixels, video_pixels=max_pixels))
        if qwen is not None:
            tokens, patches, per_patch, modality = qwen
            items = _mm_items(tokens, t, num_seqs, max_model_len, (limits or {}).get(modality, MM_DEFAULT_LIMIT))
            pixels = items * patches * per_patch * act_dtype_bytes
            forward = pixels + _vision_forward_bytes(geometry, patches=items * patches, tp=vision_tp or tp,
                                                     act_dtype_bytes=act_dtype_bytes)
            levels = _deepstack_levels(geometry)  # Qwen3-VL's outputs carry the deepstack features
            return EncoderProfile(act_dtype_bytes * items * tokens * h * (1 + levels), pixels if inputs_alive else 0, 0,
                                  f"{items} dummy {modality}{'s' if items > 1 else ''} x {tokens:,} tokens x {h}"
                                  + (f" x {1 + levels} (deepstack)" if levels else "")
                                  + (f" + their pixels {format_gib(pixels)}" if inputs_alive else "")
                                  + _forward_rule(items * patches, forward, vision_tp or tp),
                                  forward_bytes=forward,
                                  forward_error_bytes=int(forward * VISION_FORWARD_ERROR_FRACTION), item=modality)
    dummy = _dummy_image(geometry)
    if dummy is None:
        # Not derived: the outputs at the budget's tokens (one item per batched token), the pixels in the band.
        error = MM_UNDERIVED_INPUT_BYTES_PER_TOKEN * t if inputs_alive else 0
        return EncoderProfile(act_dtype_bytes * t * h, 0, error,
                              f"encoder outputs {t:,} tokens x {h} (the dummy batch not derived for "
                              f"{geometry.architecture}"
                              + (f"; its pixels +/- {error / GiB:.2f} GiB" if error else "") + ")")
    tokens, side = dummy
    pixels = 3 * side * side
    items = _mm_items(tokens, t, num_seqs, max_model_len, (limits or {}).get("image", MM_DEFAULT_LIMIT))
    inputs = items * pixels * act_dtype_bytes if inputs_alive else 0
    patches = _image_tower(geometry)
    forward = items * pixels * act_dtype_bytes + items * patches * _image_tower_per_patch(
        geometry, tp=vision_tp or tp, act_dtype_bytes=act_dtype_bytes) if patches else 0
    return EncoderProfile(act_dtype_bytes * items * tokens * h, inputs, 0,
                          f"{items} dummy images x {tokens} embeds x {h}"
                          + (f" + their pixels {items} x {pixels:,} x {act_dtype_bytes} B" if inputs else "")
                          + (_forward_rule(items * patches, forward, vision_tp or tp) if patches else ""),
                          forward_bytes=forward, forward_error_bytes=int(forward * VISION_FORWARD_ERROR_FRACTION),
                          item="fixed image")


# The sorting top-k/top-p in the profile's dummy sampler run before 0.17 (v1/sample/ops/topk_topp_sampler.py
# apply_top_k_top_p: the fp32 logits sorted with their int64 indices, masks, softmax and the scatter back, beside
# the model-dtype and fp32 logits): 9.5 fp32 copies per row and vocabulary entry, fitted on the V0/early-V1 logs
# (9.4-9.9) and, with the hidden states and PROFILE_CONSTANT_BYTES beside it, on five H100 runs of 0.13-0.14
# at 1,024 rows (llm-d-benchmark: Llama-3.1-8B 4.76 GiB, Qwen3-0.6B 5.56, Qwen3-32B 5.64 at TP 1 and 2,
# gpt-oss-20b 7.38; each within 0.01 GiB).
SORTING_SAMPLER_BYTES_PER_ENTRY = 38
# FlashInfer's top-k/top-p in the profile's dummy sampler run (before 0.17, where it replaces the sort): the
# model-dtype logits (2 B, alive in _dummy_sampler_run), their fp32 copy (4, v1/sample/sampler.py: `logits.to(
# torch.float32)`; temperature divides it in place), then flashinfer.sampling.top_k_top_p_sampling_from_logits's
# top-k-masked logits (4) and their softmax (4) (flashinfer 0.3.1 sampling.py:979-982, called from vLLM 0.11.0
# v1/sample/ops/topk_topp_sampler.py:287-290): 14 B per row and vocabulary entry.
FLASHINFER_SAMPLER_BYTES_PER_ENTRY = 14


def uses_flashinfer_sampler(rules: VllmRules, packages: Mapping[str, str] | None, env: Mapping[str, str],
                            logprobs_mode: str | None = None) -> bool | None:
    """Whether the profile's sampler is FlashInfer's top-k/top-p rather than the sort (before 0.17; from
    0.17 the Triton kernel is modelled either way), by `VllmRules.flashinfer_sampler`; None where that
    turns on FlashInfer being installed beside the engine and `packages` is not known (None), or on a
    VLLM_USE_FLASHINFER_SAMPLER vLLM cannot read (it raises at start)."""
    if not rules.sorting_sampler:
        return False
    if logprobs_mode in ("processed_logits", "processed_logprobs"):
        return False  # FlashInfer cannot return them (0.10.2 v1/sample/ops/topk_topp_sampler.py:39-41)
    switch: bool | None = None
    if "VLLM_USE_FLASHINFER_SAMPLER" in env:  # vllm/envs.py: bool(int(value)) where the variable is set
        try:
            switch = bool(int(env["VLLM_USE_FLASHINFER_SAMPLER"]))
        except ValueError:
            return None
    if rules.flashinfer_sampler == "opt_in":
        return bool(switch)
    if switch is False:
        return False
    if packages is None:
        return None
    installed = packages.get("flashinfer-python") or packages.get("flashinfer")
    if installed is None:
        return False
    older = installed < "0.2.3" if rules.flashinfer_version_as_string else \
        version_key(installed) < version_key("0.2.3")
    return older if rules.flashinfer_sampler == "below_0.2.3" else not older


def profile_peak(geometry: ModelGeometry, *, rules: VllmRules, batched_tokens: int, num_seqs: int, tp: int,
                 gpu_name: str = "", act_dtype_bytes: int = 2, language_only: bool = False, dp: int = 1,
                 expert_parallel: bool = False, flashinfer_sampler: bool | None = False,
                 max_model_len: int | None = None, mm_limits: Mapping[str, int] | None = None,
                 mm_max_pixels: int | None = None, vision_tp: int | None = None,
                 compiled_as_traced: bool = True, moe_on_triton: bool = True,
                 int4: Int4Gemm | None = None, fp8: str | None = None) -> ProfilePeak:
    """What vLLM's profile run allocates at its peak, for the runner that version uses.

    V1 (0.19-0.21, and 0.22-0.28 outside the V2 architecture list): the sampler dummy run holds
    the model-dtype logits (2 B), their fp32 copy (4), softmax probabilities (4) and the exponential
    noise (4) per row and vocabulary entry, plus the top-k/top-p buffer, while the forward's hidden
    states (T x H) and the MoE workspace are alive. V2 (every model from 0.29): the default dummy
    batch has no top-k/top-p, so the sampler holds only the logits and the forward peak (the compiled
    pieces' buffers, `v2_forward_bytes`; attention skipped) dominates; 0.33 adds a warmup pass (fp32 copy +
    top-k/top-p buffer). A penalty state int32 [max_num_seqs, V] is allocated at V2 runner init.

    Under data parallelism (`dp` > 1) a MoE layer takes every DP rank's padded batch, gathered
    (allgather_reducescatter, the default all2all): its workspace is sized for dp x T tokens, and the
    gathered rows and the experts' output before the reduce-scatter are held beside it (parallel.py);
    with expert parallelism each expert runs whole (its intermediate size not split).

    `compiled_as_traced`: the start compiles the model and quantizes nothing at run time (no --enforce-eager, no
    --quantization), as the V2 forward's oracle ran it; otherwise its band stays V2_PEAK_ERROR_BYTES. `moe_on_triton`:
    a MoE model's experts run the Triton kernels the oracle stood in (`moe_runs_triton`). `int4`: the kernel a 4-bit
    weight-only checkpoint's linear layers run (`int4_gemm`), whose per-call scratch widens the traced band; `fp8`:
    an FP8 checkpoint's activation quantization where its forward was run so (`fp8_activations`).
    """
    v, h, t, r = geometry.vocab_size, geometry.hidden_size, batched_tokens, min(batched_tokens, num_seqs)
    sms = min(sm_count(gpu_name), r)
    hidden = act_dtype_bytes * t * h
    moe_tp = 1 if expert_parallel else tp * dp  # the experts' own split (parallel.py)
    moe = moe_workspace_bytes(geometry, batched_tokens=t * dp, tp=moe_tp)
    if not moe and dp > 1 and geometry.num_experts:  # gpt-oss's MXFP4 path holds no fused-MoE workspace
        moe = mxfp4_dp_workspace_bytes(geometry, tokens=t * dp, one_rank_tokens=t, tp=moe_tp)
    gathered = 2 * act_dtype_bytes * (dp - 1) * t * h if geometry.num_experts and dp > 1 else 0
    v2 = not rules.sorting_sampler and uses_v2_runner(rules, geometry.architecture)
    mm = (encoder_profile(geometry, batched_tokens=t, num_seqs=num_seqs, max_model_len=max_model_len,
                          act_dtype_bytes=act_dtype_bytes, inputs_alive=not v2, tp=tp, limits=mm_limits,
                          max_pixels=mm_max_pixels, vision_tp=vision_tp)
          if geometry.is_multimodal and not language_only else EncoderProfile(0, 0, 0, ""))
    encoder, pixels = mm.outputs_bytes, mm.inputs_bytes
    vision_rope = vision_rope_table_bytes(geometry) if encoder else 0
    if rules.sorting_sampler:
        # Before 0.19: the larger of the forward and the sampler dummy run, which sorts the vocabulary
        # (SORTING_SAMPLER_BYTES_PER_ENTRY) or runs FlashInfer's top-k/top-p (uses_flashinfer_sampler),
        # beside the forward's hidden states, a VLM's encoder outputs (kept in encoder_cache through the
        # profile: 0.14.1 v1/worker/gpu_model_runner.py:4694-4756) and the fitted constant, as from 0.19.
        forward = forward_peak_bytes(geometry, batched_tokens=t, tp=tp)
        beside = hidden + encoder + pixels + vision_rope + PROFILE_CONSTANT_BYTES
        sort = SORTING_SAMPLER_BYTES_PER_ENTRY * r * v + beside
        flashinfer = FLASHINFER_SAMPLER_BYTES_PER_ENTRY * r * v + beside
        sampler = flashinfer if flashinfer_sampler else sort
        legacy = max(forward, sampler)
        # The sampler's bytes per entry within +/- 10 % (the V0/early-V1 logs spread 9.4-9.9 copies); the
        # forward's shapes, fitted on no GPU log, +/- 25 %.
        error = (int(0.10 * legacy) if sampler >= forward else int(0.25 * legacy)) + mm.error_bytes
        label = "forward" if forward > sampler else "sampler (FlashInfer top-k/top-p)" if flashinfer_sampler \
            else "sampler (sort)"
        if flashinfer_sampler is None:
            # Not known whether FlashInfer is installed beside the engine: the sort, the larger peak, with its
            # own band; how much less FlashInfer's would hold is said (ProfilePeak.flashinfer_saves_bytes).
            label += "; FlashInfer's if installed"
        terms_legacy: tuple[tuple[str, int], ...] = ((label, legacy),)
        if dp > 1 and geometry.num_experts:
            # Before 0.19 the modular kernel runs chunks of VLLM_FUSED_MOE_CHUNK_SIZE (16384) tokens, and with DP
            # and EP its profile allocates a whole chunk (0.12.0 fused_moe/modular_kernel.py:756-840); counted
            # on top of the fitted peak, with the gathered rows.
            chunk = 16384 if expert_parallel else min(t * dp, 16384)
            terms_legacy += (("MoE workspace", moe_workspace_bytes(geometry, batched_tokens=chunk, tp=moe_tp)),
                             ("DP-gathered MoE rows", gathered))
        terms_legacy, error = _with_vision_forward(terms_legacy, error, mm)
        total = sum(b for _, b in terms_legacy)
        saves = legacy - max(forward, flashinfer) if flashinfer_sampler is None else 0
        return ProfilePeak(terms_legacy, total, error, "V0/V1 (before 0.17)", flashinfer_saves_bytes=saves,
                           encoder_rule=mm.rule, encoder_item=mm.item)
    # The compiled forward, on either runner (from 0.19); its band narrower where vLLM's own pieces were run.
    forward = v2_forward_bytes(geometry, batched_tokens=t, tp=tp, act_dtype_bytes=act_dtype_bytes, fp8=fp8)
    # An architecture the release serves through the Transformers backend runs the HF decoder, not the class traced.
    hf_backend = served_by_transformers_backend(geometry.architecture, rules.version)
    traced = compiled_as_traced and not hf_backend and _forward_traced(geometry, moe_on_triton, int4, fp8)
    forward_error = v2_peak_error_bytes(traced, forward, int4)
    if hf_backend:
        forward_error = max(forward_error, t * TRANSFORMERS_BACKEND_EXCESS_H * h * act_dtype_bytes // 2)
    if not uses_v2_runner(rules, geometry.architecture):
        # 12 B an entry beside the model-dtype logits: a --dtype float32 start (0.19 H100, Llama-3.1-8B) peaks
        # 0.32 GiB above the bf16 one, 2 B an entry more at 1,024 x 128,256 plus the wider hidden states.
        sampler = (12 + act_dtype_bytes) * r * v + 4 * sms * v
        # The dummy forward runs first (gpu_model_runner.py:5721 `profile_run`), compiled as on the V2 runner: with
        # few sampler rows (a small --max-num-seqs) its pieces' buffers are the larger phase, and its band the V2
        # forward's.
        phase: tuple[tuple[str, int], ...] = (("sampler", sampler), ("hidden states", hidden))
        error, rule = V1_PEAK_ERROR_BYTES, ""
        if forward > sampler + hidden:
            phase, error = (("forward", forward),), forward_error
            rule = v2_forward_rule(geometry, compiled_as_traced, moe_on_triton, int4, fp8, hf_backend=hf_backend)
        terms: tuple[tuple[str, int], ...] = (*phase, ("MoE workspace", moe), ("DP-gathered MoE rows", gathered),
                                               ("encoder cache", encoder), ("dummy images", pixels),
                                               ("vision rope table", vision_rope),
                                               ("constant", PROFILE_CONSTANT_BYTES))
        terms, error = _with_vision_forward(terms, error + mm.error_bytes, mm)
        return ProfilePeak(terms, sum(b for _, b in terms), error, "V1", encoder_rule=mm.rule,
                           encoder_item=mm.item, forward_rule=rule)
    sampler = 2 * r * v + (4 * r * v + 4 * sms * v if rules.sampler_warmup_pass else 0)
    transient = max(forward, hidden + sampler)
    penalty = 4 * num_seqs * v + 4 * num_seqs * -(-v // 32)  # vllm/v1/worker/gpu/sample/penalties.py:40
    terms = (("forward" if forward >= hidden + sampler else "sampler", transient), ("MoE workspace", moe),
             ("DP-gathered MoE rows", gathered), ("encoder cache", encoder), ("vision rope table", vision_rope),
             ("constant", PROFILE_CONSTANT_BYTES))
    terms, error = _with_vision_forward(terms, forward_error, mm)
    return ProfilePeak(terms, sum(b for _, b in terms), error, "V2",
                       persistent_bytes=penalty if rules.budget_from_consumed else 0, encoder_rule=mm.rule,
                       encoder_item=mm.item, forward_rule=v2_forward_rule(geometry, compiled_as_traced,
                                                                               moe_on_triton, int4, fp8,
                                                                               hf_backend=hf_backend))


def fp8_activations(geometry: ModelGeometry, *, compute_capability: tuple[int, int] | None,
                    version: str) -> str | None:
    """How an FP8 checkpoint's inputs are quantized where its compiled forward was run as this start runs it
    (FP8_FORWARD_TRACED, CUTLASS on SM 8.9/9.0, from FP8_FORWARD_SINCE): "dynamic" (a scale per token), "static" (one
    per tensor, QuantFP8 in the piece) or "static-fused" (Llama's activation quantizes itself, from
    FP8_FUSED_ACT_QUANT_SINCE); else None."""
    from launcher.model.linear_tensors import scheme

    method = scheme(geometry) if geometry.quantization is not None else None
    if method is None or method.name not in ("fp8-tensor", "fp8-channel") \
            or compute_capability not in ((8, 9), (9, 0)) or geometry.architecture not in FP8_FORWARD_TRACED \
            or geometry.num_experts or version_key(version) < version_key(FP8_FORWARD_SINCE):
        return None
    if method.name == "fp8-channel":
        return "dynamic"
    fused = geometry.architecture in FP8_FUSED_ACT_QUANT and \
        version_key(version) >= version_key(FP8_FUSED_ACT_QUANT_SINCE)
    return "static-fused" if fused else "static"


def v2_forward_bytes(geometry: ModelGeometry, *, batched_tokens: int, tp: int, act_dtype_bytes: int,
                     fp8: str | None = None) -> int:
    """The language model's forward peak on one rank as vLLM compiles it (piecewise at the attention ops, Inductor
    planning each piece's buffers; tests/oracles/vllm_lm_forward_oracle.py). The split graph holds a piece's inputs
    (the attention output, q, and the residual, H) until it returns; inside, o_proj's (all-reduced) output H stays
    for the second residual add, which Inductor recomputes rather than keeping the sum. Its three phases:
    - the gated MLP's activation: gate_up (2 I) and silu x up (I), fused into one kernel, beside those (3 I + 2 H + q);
    - the next layer's input norm: the MLP's (all-reduced) output, the new residual and the normed input, with
      o_proj's output and the inputs (5 H + q), and its fp32 variance (4 B a token);
    - the piece's end: the new residual, qkv, rotated q and k and the attention output buffer beside the inputs
      (2 H + 4 q + 3 kv).
    I, q and kv are the rank's shards (heads x head dim; kv heads at least one; the attention output is heads x
    v's head dim).

    `fp8` (`fp8_activations`): an FP8 checkpoint's pieces as the oracle ran them. The MLP's activation ends in fp8
    (I bytes) beside gate_up: 2 I + 2 H + q in the activations' dtype where Llama fuses the static quantization into
    the activation ("static-fused"), 2 I + 3 H + q where QuantFP8 quantizes it in the piece ("static"), 3 I + 3 H + q
    and 6 B of scales a token where the scale is each token's own. At the next norm the normed input is quantized
    to fp8 (H bytes) beside the qkv GEMM's output: 4 H + q + qkv and the variance (static), 5 H + q + qkv and
    10 B (dynamic)."""
    t, h, tp = batched_tokens, geometry.hidden_size, max(tp, 1)
    intermediate = (geometry.intermediate_size or 4 * h) // tp
    heads = max(geometry.num_attention_heads // tp, 1)
    kv_heads = max(geometry.num_kv_heads // tp, 1)
    q, out = heads * geometry.head_dim, heads * geometry.v_head_dim
    kv = kv_heads * geometry.head_dim
    moe = _moe_layer_bytes(geometry, tokens=t, tp=tp, out=out, act_dtype_bytes=act_dtype_bytes)
    dense = act_dtype_bytes * t * (3 * intermediate + 2 * h + out)
    first_dense = geometry.text_config.get("first_k_dense_replace")
    mlp = dense if moe is None else max(moe, dense) if isinstance(first_dense, int) and first_dense > 0 else moe
    norm = act_dtype_bytes * t * (5 * h + out) + 4 * t
    if fp8 is not None and moe is None:
        qkv = q + 2 * kv
        gate, hidden, scales = (3, 3, 6) if fp8 == "dynamic" else (2, 2, 0) if fp8 == "static-fused" else (2, 3, 0)
        mlp = act_dtype_bytes * t * (gate * intermediate + hidden * h + out) + t * intermediate + scales * t
        norm = (act_dtype_bytes * t * ((5 if fp8 == "dynamic" else 4) * h + out + qkv) + t * h
                + (10 if fp8 == "dynamic" else 4) * t)
    if geometry.architecture in RESIDUAL_MULTIPLIER_ARCHITECTURES:
        mlp = max(mlp, act_dtype_bytes * t * (3 * h + out + 2 * intermediate))
        norm = act_dtype_bytes * t * (4 * h + out) + 4 * t
    end = act_dtype_bytes * t * (2 * h + 2 * out + 2 * q + 3 * kv) \
        + (4 * t * (heads + kv_heads) if geometry.architecture in QK_NORM_ARCHITECTURES else 0) \
        + act_dtype_bytes * t * (q + kv) * _partial_rotary_dim(geometry) // geometry.head_dim
    return max(mlp, norm, end)


def _partial_rotary_dim(geometry: ModelGeometry) -> int:
    """The rotated part of a head where the rotary embedding covers only part of it (partial_rotary_factor < 1),
    else 0: vLLM's rotary embedding rotates q[..., :rotary_dim] and k[..., :rotary_dim] into new buffers and
    concatenates the rest (layers/rotary_embedding/base.py `forward_static`), which the compiled piece keeps to
    its end (GLM-4.5's records)."""
    factor = partial_rotary_factor(geometry.text_config)
    return int(geometry.head_dim * factor) if factor is not None and factor < 1 else 0


def _moe_layer_bytes(geometry: ModelGeometry, *, tokens: int, tp: int, out: int, act_dtype_bytes: int) -> int | None:
    """A MoE layer's phases on the rank, where its compiled piece was run (MOE_FORWARD_HELD), else None: beside
    what the piece holds and the router's logits (E), the op allocates `fused_topk`'s weights, ids and indices
    (12 B a slot, router/fused_topk_router.py:172-183), the aligned rows and their block experts (int32,
    moe_align_block_size.py:83-97) and its output (H, modular_kernel.py:1595-1600); a shared expert runs first,
    its gate_up (2 I), activation (I) and output alive at its down projection, then, for Qwen2-MoE's, gate_up,
    output and the sigmoid-gated product (models/qwen2_moe.py), its output kept beside the routed experts'. GLM-4.5's
    shared experts (n_shared_experts x moe_intermediate_size, models/glm4_moe.py:165-180) are ungated."""
    held = MOE_FORWARD_HELD.get(geometry.architecture)
    experts, topk = geometry.num_experts, geometry.experts_per_token
    if held is None or not experts or not topk:
        return None
    t, h, act = tokens, geometry.hidden_size, act_dtype_bytes
    hidden_buffers, variances = held
    logits = MOE_ROUTER_LOGIT_BYTES.get(geometry.architecture, act)
    beside = act * t * (hidden_buffers * h + out) + logits * t * experts + variances * t
    padded = t * topk + experts * (MOE_ALIGN_BLOCK - 1)
    routing = 12 * t * topk + 4 * padded + 4 * -(-padded // MOE_ALIGN_BLOCK)
    text = geometry.text_config
    gated, count, expert = (text.get("shared_expert_intermediate_size"), text.get("n_shared_experts"),
                            geometry.expert_intermediate_size)
    if isinstance(gated, int) and gated > 0:
        i = gated // tp
        shared_mlp = beside + act * t * max(3 * i + h, 2 * i + 2 * h + 1)
    elif isinstance(count, int) and count > 0 and isinstance(expert, int) and expert > 0:
        shared_mlp = beside + act * t * (3 * (count * expert // tp) + h)
    else:
        return beside + routing + act * t * h
    return max(shared_mlp, beside + routing + 2 * act * t * h)


def _forward_traced(geometry: ModelGeometry, moe_on_triton: bool = True, int4: Int4Gemm | None = None,
                    fp8: str | None = None) -> bool:
    """An unquantized checkpoint of an architecture whose compiled forward was run, dense (LM_FORWARD_TRACED) or MoE
    (MOE_FORWARD_HELD), or a dense one whose 4-bit weight-only linear layers run a kernel `int4_gemm` names, or whose
    FP8 ones were run as this start runs them (`fp8_activations`)."""
    dense = geometry.architecture in LM_FORWARD_TRACED and not geometry.num_experts
    moe = geometry.architecture in MOE_FORWARD_HELD and bool(geometry.num_experts) and moe_on_triton
    weights = geometry.quantization is None or (dense and (int4 is not None or fp8 is not None))
    return (dense or moe) and geometry.mla is None and weights


def v2_peak_error_bytes(traced: bool, forward: int, int4: Int4Gemm | None = None) -> int:
    """The V2 peak's band: a traced forward V1's plus a share of the forward (and an int4 kernel's per-call
    scratch, which may add where a GEMM is the peak's phase), else 0.5 GiB."""
    if not traced:
        return V2_PEAK_ERROR_BYTES
    return V1_PEAK_ERROR_BYTES + int(forward * LM_FORWARD_ERROR_FRACTION) + (int4.scratch_bytes if int4 else 0)


def v2_forward_rule(geometry: ModelGeometry, compiled_as_traced: bool, moe_on_triton: bool = True,
                    int4: Int4Gemm | None = None, fp8: str | None = None, *, hf_backend: bool = False) -> str:
    """Where the V2 forward's figure and band come from, for the plan's activation row."""
    if hf_backend:
        return (f"forward from the layer's shapes (the Transformers backend compiles {geometry.architecture}'s HF "
                f"decoder, which holds up to 6.3 H bytes a token more in the oracle's runs), +/- the larger of "
                f"{V2_PEAK_ERROR_BYTES / GiB:.1f} GiB and {TRANSFORMERS_BACKEND_EXCESS_H} H bytes a token")
    if compiled_as_traced and _forward_traced(geometry, moe_on_triton, int4, fp8):
        kernel = scratch = ""
        if int4 is not None:
            kernel = (f"; {int4.method}'s linear layers on {int4.kernel}: a GEMM's output each, beside it "
                      f"{int4.rule}, in the band")
            scratch = f" + {int4.scratch_bytes / MiB:.1f} MiB"
        elif fp8 is not None:
            scale = "token" if fp8 == "dynamic" else "tensor"
            kernel = f"; FP8 linear layers on CUTLASS, their inputs quantized per {scale}"
        return (f"forward as vLLM compiles it (Inductor's buffers, {geometry.architecture} traced{kernel}), "
                f"+/- {V1_PEAK_ERROR_BYTES / GiB:.2f} GiB + {LM_FORWARD_ERROR_FRACTION:.0%}{scratch}")
    why = ("eager, another compilation mode, or quantized at run time" if not compiled_as_traced else
           "a quantized checkpoint" if geometry.quantization is not None else
           "MLA" if geometry.mla is not None else
           "its experts on another kernel than the Triton one traced" if _forward_traced(geometry) else
           f"{geometry.architecture}'s compiled forward not traced")
    return f"forward from the layer's shapes ({why}), +/- {V2_PEAK_ERROR_BYTES / GiB:.1f} GiB"


def _with_vision_forward(terms: tuple[tuple[str, int], ...], error: int,
                         mm: EncoderProfile) -> tuple[tuple[tuple[str, int], ...], int]:
    """The peak is the larger of the language model's phase (`terms`) and the vision tower's own forward, which
    runs first (with the fitted constant beside it); the band spans both ends of both."""
    if not mm.forward_bytes:
        return terms, error
    lm = sum(b for _, b in terms)
    vision = mm.forward_bytes + PROFILE_CONSTANT_BYTES
    total = max(lm, vision)
    high = max(lm + error, vision + mm.forward_error_bytes)
    low = max(lm - error, vision - mm.forward_error_bytes)
    return (*terms, ("vision forward beyond", total - lm)), max(high - total, total - low)


# Host RAM on the CPU backend: only the RAM check and the default VLLM_CPU_KVCACHE_SPACE use this
# (the CPU KV cache is the space itself). The larger of the forward (gate+up and output of the MLP,
# ~3 x hidden for attention) and ~9.5 fp32 vocabulary rows per sequence for the sampler.
CPU_SAMPLER_LOGIT_COPIES = 9.5


def forward_peak_bytes(geometry: ModelGeometry, *, batched_tokens: int, tp: int) -> int:
    """The profile forward's MLP activations: gate+up and output (~3 x the intermediate) and ~3 x hidden, bf16."""
    intermediate = geometry.intermediate_size or 4 * geometry.hidden_size
    moe = geometry.text_config.get("moe_intermediate_size")
    if geometry.num_experts and geometry.experts_per_token and isinstance(moe, int) and moe > 0:
        intermediate = moe * geometry.experts_per_token
    return batched_tokens * (3 * intermediate // max(tp, 1) + 3 * geometry.hidden_size) * 2


def cpu_activation_peak_bytes(geometry: ModelGeometry, *, batched_tokens: int, num_seqs: int, tp: int) -> int:
    forward = forward_peak_bytes(geometry, batched_tokens=batched_tokens, tp=tp)
    return max(forward, int(num_seqs * geometry.vocab_size * 4 * CPU_SAMPLER_LOGIT_COPIES))


def context_bytes(tp: int, pp: int) -> int:
    """Memory a worker holds before vLLM's init snapshot (outside the budget)."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)


def non_torch_bytes(tp: int, pp: int, *, since_019: bool = True, graphs_profiled: bool | None = None,
                    compute_capability: tuple[int, int] | None = None) -> tuple[int, int]:
    """Non-torch memory after the snapshot and its expected error, per rank.

    One rank: the 0.19 logs' 0.25-0.27 GiB where what CUDA-graph capture allocates outside torch is inside
    the measured non-torch (`graphs_profiled`: graphs captured, and 0.18-0.26's profile of them inside
    memory_profiling, `VllmRules.graphs_profiled_in_budget`, or 0.34's sizing after capture), else the
    0.13-0.16 GiB of releases and starts without it (None: as `since_019`).

    With parallel ranks, the 2.08 GiB of the 0.19 H100 logs is the symmetric-memory all-reduce
    (vllm/distributed/device_communicators/all_reduce_utils.py:52: sm90 and sm100 only); other
    GPUs keep NCCL's and the custom all-reduce's few hundred MiB (0.34-0.43 GiB per rank at TP 4
    on A100s).
    """
    if tp * pp > 1:
        symmetric = compute_capability is None or compute_capability[0] in (9, 10)
        if since_019 and symmetric:
            return NON_TORCH_BYTES_TP_V019, NON_TORCH_TP_ERROR_BYTES
        return NON_TORCH_BYTES_TP, NON_TORCH_ERROR_BYTES
    profiled = since_019 if graphs_profiled is None else graphs_profiled
    return (NON_TORCH_BYTES_TP1_V019 if profiled else NON_TORCH_BYTES_TP1), NON_TORCH_ERROR_BYTES


def utilization_for(room_bytes: int, cuda_total_bytes: int) -> float:
    """The largest 4-decimal utilization whose ceil(total x u) stays within `room_bytes`."""
    u = math.floor(room_bytes / cuda_total_bytes * 10_000) / 10_000
    while u > 0 and requested_bytes(cuda_total_bytes, u) > room_bytes:
        u = round(u - 0.0001, 4)
    return u


# --------------------------------------------------------------------------- weights as loaded
#
# gpt-oss's MXFP4 experts are re-laid out for the MoE kernel vLLM picks, and vLLM's "Model loading
# took" - the weights its KV budget subtracts - counts them as the kernel holds them. The pick
# (0.19.0 fused_moe/oracle/mxfp4.py:169-184 priority, :345-353 the first whose is_supported_config
# passes; 0.33.0 :402-435) for gpt-oss with default flags and environment:
# - Hopper (9.x): Triton (TRITON: (9,0) <= cc < (11,0), 0.19.0 gpt_oss_triton_kernels_moe.py:564; the 0.19
#   logs: "Using 'TRITON' Mxfp4 MoE backend"). The weights are swizzled after loading (oracle/mxfp4.py:
#   728-744 in 0.19.0, quantization/mxfp4.py:403-418 in 0.10.1): values re-laid out with padding, biases
#   made fp32, block scales copied into a padded swizzled layout while, before 0.25, the loaded scales are
#   kept too ("del layer.w13_weight_scale" first appears in 0.25.0): 13.64 GiB for gpt-oss-20b's 12.82 GiB
#   checkpoint on vLLM 0.19 (this rule: 13.60, and the 0.02 GiB rotary table: 13.62).
# - Ampere/Ada (8.x), SM12x (RTX 50, RTX PRO 6000) and, before 0.32, SM110: Marlin. FlashInfer TRT-LLM is
#   SM100-family only (0.19.0 experts/trtllm_mxfp4_moe.py:81), FlashInfer CUTLASS takes MXFP4 x bf16 on
#   SM90 only (flashinfer_cutlass_moe.py:158-167), Triton stops below SM110 until 0.31 and from 0.32 is
#   ordered after Marlin on SM12x (0.32.0 oracle/mxfp4.py:413-421); Marlin runs from 7.5 (fused_marlin_moe.py:567).
# - SM100 (B200, B300): FlashInfer TRT-LLM (FLASHINFER_TRTLLM_MXFP4_BF16, first in the list) when FlashInfer
#   can run, which needs flashinfer-cubin or nvcc (utils/flashinfer.py:47-62): a default install has the cubins
#   only in 0.19-0.25 (`VllmRules.flashinfer_cubin_bundled`); otherwise Triton may run instead.
# The expert tensors are created at padded sizes (mxfp4_round_up_hidden_size_and_intermediate_size, 0.19.0
# oracle/mxfp4.py:376-400): Marlin hidden to 256 and intermediate per rank to 128; TRT-LLM hidden to 256 and
# intermediate to 256 (128 from 0.27); Triton intermediate to 64. Non-expert weights (attention, router,
# embeddings) are UnquantizedLinearMethod in the model dtype, as stored (quantization/mxfp4.py:68-80).

MXFP4_BLOCK = 32  # values per e8m0 block scale
MXFP4_TRITON = "TRITON"
MXFP4_MARLIN = "MARLIN"
MXFP4_TRTLLM = "FLASHINFER_TRTLLM_MXFP4_BF16"


@dataclass(frozen=True)
class Mxfp4AsLoaded:
    """gpt-oss's MXFP4 experts as vLLM's kernel holds them, per rank, beyond the checkpoint's share."""

    # Bytes the plan adds: the middle of the layouts the install may hold, so that `extra + error` is the
    # largest (the band's unfavourable end, where the plan's length comes from) and `extra - error` the
    # smallest (its favourable end); one layout: that layout, error 0.
    extra: int
    error: int
    backend: str  # vLLM's Mxfp4MoeBackend value of the largest layout
    rule: str


NOT_MXFP4 = Mxfp4AsLoaded(0, 0, "", "")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _padded_expert_bytes(hidden: int, inter: int, bias_bytes: int) -> int:
    """w13 [2I, H/2] and w2 [H, I/2] u8 values, their [2I, H/32] and [H, I/32] scales, biases [2I] and [H]
    (the checkpoint's share: I the share, bf16 biases)."""
    values = (2 * inter * hidden // 2) + (hidden * inter // 2)
    scales = 2 * inter * (hidden // MXFP4_BLOCK) + hidden * (inter // MXFP4_BLOCK)
    return values + scales + bias_bytes * (2 * inter + hidden)


def _triton_hopper_expert_bytes(hidden: int, share: int, version: str) -> int:
    # The expert tensors are created with the intermediate size per rank rounded up to 64
    # (mxfp4_round_up_hidden_size_and_intermediate_size, the Triton branch).
    inter = _round_up(share, 64)
    old_layout = version_key(version) < version_key("0.22")  # third_party/triton_kernels hopper_value.py: pad to 64
    scales_kept = version_key(version) < version_key("0.25")

    def values(rows: int, cols: int) -> int:  # u8 [rows, cols] after the transpose the swizzle takes
        if old_layout:
            return _round_up(rows, 64) * _round_up(cols, 64)
        return _round_up(cols, 16) * _round_up(rows, 32)  # mT, then packs of 16 and 32 (0.22+)

    loaded_values = values(hidden // 2, 2 * inter) + values(inter // 2, hidden)
    # Scales swizzled for Hopper (hopper_scale.py: rows padded to 2 x 8 warps x 2 x 8 = 256, the groups to
    # 2); from 0.26 the groups are first padded to a multiple of 4 on sm90 ("Patches #47303", 0.32.0
    # quantization/utils/mxfp4_utils.py:117-122; not in 0.25).
    groups = 4 if version_key(version) >= version_key("0.26") else 2
    swizzled_scales = (_round_up(2 * inter, 256) * _round_up(hidden // 32, groups)
                       + _round_up(hidden, 256) * _round_up(inter // 32, groups))
    # The loaded scales kept before 0.25 are the tensors create_weights made, at the padded intermediate.
    kept_scales = 2 * inter * (hidden // 32) + hidden * (inter // 32)
    return loaded_values + swizzled_scales + (kept_scales if scales_kept else 0) + 4 * (2 * inter + hidden)


def _triton_blackwell_expert_bytes(hidden: int, share: int, version: str) -> int:
    """Triton on SM100+ (third_party/triton_kernels/tensor_details/layout_details/, the same padding from
    0.12 to 0.33): blackwell_value.py pads each row of u8 values to 128 bytes, blackwell_scale.py pads the
    transposed scales [K = size/32, N] to K % 8 and N % 128; fp32 biases; loaded scales kept before 0.25."""
    inter = _round_up(share, 64)
    values = 2 * inter * _round_up(hidden // 2, 128) + hidden * _round_up(inter // 2, 128)
    scales = (_round_up(hidden // MXFP4_BLOCK, 8) * _round_up(2 * inter, 128)
              + _round_up(inter // MXFP4_BLOCK, 8) * _round_up(hidden, 128))
    scales_kept = version_key(version) < version_key("0.25")
    kept = 2 * inter * (hidden // MXFP4_BLOCK) + hidden * (inter // MXFP4_BLOCK) if scales_kept else 0
    return values + scales + kept + 4 * (2 * inter + hidden)


def _mxfp4_expert_bytes(backend: str, hidden: int, share: int, *, version: str, rules: VllmRules,
                        hopper: bool) -> int:
    if backend == MXFP4_MARLIN:
        # gptq_marlin_repack keeps 4 bits a value; the scales stay one e8m0 byte per 32 values
        # (mxfp4_marlin_process_scales, 0.19.0 quantization/utils/marlin_utils_fp4.py:115-129, :589-616);
        # biases in the model dtype (:619-629); the loaded tensors are replaced (quantization/mxfp4.py:299-303).
        return _padded_expert_bytes(_round_up(hidden, 256), _round_up(share, 128), bias_bytes=2)
    if backend == MXFP4_TRTLLM:
        # Rows shuffled per expert, scales interleaved in place (nvfp4_block_scale_interleave, reshaped back
        # to [E, 2I, H/32]), biases fp32 (0.19.0 oracle/mxfp4.py:444-583, the same text to 0.33).
        return _padded_expert_bytes(_round_up(hidden, 256), _round_up(share, rules.mxfp4_trtllm_intermediate_align),
                                    bias_bytes=4)
    if hopper:
        return _triton_hopper_expert_bytes(hidden, share, version)
    return _triton_blackwell_expert_bytes(hidden, share, version)


def _mxfp4_backends(compute_capability: tuple[int, int], rules: VllmRules) -> tuple[tuple[str, ...], str]:
    """The backends vLLM may pick for gpt-oss with default flags on this card, and when the others run."""
    major = compute_capability[0]
    if major == 9:
        if rules.triton_kernels_bundled:
            return (MXFP4_TRITON,), ""
        # 0.10-0.11: Triton only where the optional triton_kernels package imports, else Marlin (0.11.0
        # quantization/mxfp4.py:59-107); the 0.10.1 H100 gpt-oss-120b log ran Marlin (its warning comes
        # from marlin_utils_fp4.py:196) and loaded 65.97 GiB, the Marlin layout's 65.9.
        return (MXFP4_TRITON, MXFP4_MARLIN), "without the optional triton_kernels package"
    if major == 10:
        if rules.flashinfer_cubin_bundled:
            return (MXFP4_TRTLLM,), ""
        if rules.triton_kernels_bundled:
            return (MXFP4_TRTLLM, MXFP4_TRITON), "where FlashInfer has neither flashinfer-cubin nor nvcc"
        return ((MXFP4_TRTLLM, MXFP4_TRITON, MXFP4_MARLIN),
                "without the optional flashinfer-python or triton_kernels package")
    if major == 11 and rules.mxfp4_triton_sm110 and not rules.mxfp4_marlin_first_sm110:
        return (MXFP4_TRITON,), ""
    if major >= 11 and not rules.triton_kernels_bundled:
        return (MXFP4_MARLIN, MXFP4_TRITON), "without the optional triton_kernels package"
    return (MXFP4_MARLIN,), ""


# `--moe-backend` (KernelConfig.moe_backend, engine/arg_utils.py:1805-1807 and :2757 in 0.32) picks the MXFP4
# backend from 0.19 (fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend: `map_mxfp4_backend`, then
# `_return_or_raise` of its BF16-activation variant); 0.18.1 accepts the flag but its MXFP4 path
# (quantization/mxfp4.py:109-184 get_mxfp4_backend) does not read it. The names each release maps
# (map_mxfp4_backend's dict, oracle/mxfp4.py:149-166 in 0.19.0, :352-399 in 0.33.0), by first release:
MOE_BACKEND_SINCE = "0.19"
_MAPPED_0_19 = ("flashinfer_trtllm", "flashinfer_trtllm_afp8", "flashinfer_cutlass", "flashinfer_cutlass_afp8",
                "triton", "marlin", "ck", "xpu")
_MAPPED_0_20 = ("deep_gemm", "flashinfer_trtllm", "flashinfer_trtllm_afp8", "flashinfer_cutlass",
                "flashinfer_cutlass_afp8", "triton", "triton_unfused", "marlin", "aiter", "xpu", "emulation")
_MAPPED_0_21 = (*_MAPPED_0_20[:7], "humming", "marlin", "aiter", "aiter_mxfp4_fp8", "xpu", "emulation")
_MAPPED_0_22 = (*_MAPPED_0_21[:11], "aiter_mxfp4_mxfp4", "xpu", "cpu", "emulation")
_MAPPED_0_29 = ("b12x", *_MAPPED_0_22)
_MAPPED_0_30 = (*_MAPPED_0_29[:11], "aiter_triton_mxfp4_bf16", *_MAPPED_0_29[11:])
_MAPPED_0_32 = (*_MAPPED_0_30[:6], "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm", *_MAPPED_0_30[6:])
_MAPPED_0_33 = (*_MAPPED_0_32[:16], "aiter_triton_mxfp4_mxfp4", *_MAPPED_0_32[16:])
# (release, (names mapped, line of the raise for an unmapped name, line of `_return_or_raise`'s raise))
MXFP4_MOE_BACKENDS: tuple[tuple[str, tuple[tuple[str, ...], int, int]], ...] = (
    ("0.19.0", (_MAPPED_0_19, 164, 260)), ("0.20.0", (_MAPPED_0_20, 188, 309)), ("0.21.0", (_MAPPED_0_21, 226, 340)),
    ("0.22.0", (_MAPPED_0_22, 265, 383)), ("0.24.0", (_MAPPED_0_22, 299, 417)), ("0.25.0", (_MAPPED_0_22, 299, 418)),
    ("0.26.0", (_MAPPED_0_22, 302, 421)), ("0.27.0", (_MAPPED_0_22, 305, 427)), ("0.28.0", (_MAPPED_0_22, 301, 423)),
    ("0.29.0", (_MAPPED_0_29, 316, 440)), ("0.30.0", (_MAPPED_0_30, 327, 455)), ("0.31.0", (_MAPPED_0_30, 337, 464)),
    ("0.32.0", (_MAPPED_0_32, 384, 542)), ("0.33.0", (_MAPPED_0_33, 397, 611)),
    # 0.34.0: the same names (the mapping :352-416); the refusal of a backend the card cannot run moved to the
    # shared oracle (MoEKernelOracle.return_or_raise, oracle/base.py:236, its text built at :168-177, unchanged).
    ("0.34.0", (_MAPPED_0_33, 416, 236)),
)
# From this release the "does not support the deployment configuration" refusal is raised in oracle/base.py.
MXFP4_REFUSAL_IN_BASE_SINCE = "0.34"
# The pinned names whose layout is derived here (the BF16-activation variant `_filter_by_activation` keeps;
# flashinfer_trtllm_afp8 shares the TRT-LLM weight format, TRTLLM_BACKENDS and
# mxfp4_round_up_hidden_size_and_intermediate_size :850-852 in 0.32.0).
_PINNED_LAYOUT = {"marlin": MXFP4_MARLIN, "triton": MXFP4_TRITON, "flashinfer_trtllm": MXFP4_TRTLLM,
                  "flashinfer_trtllm_afp8": MXFP4_TRTLLM}
# VLLM_MXFP4_USE_MARLIN (envs.py, maybe_convert_bool: int(value) != 0), read for MXFP4 in 0.10-0.23 (gone
# from 0.24.0 envs.py): from 0.19 oracle/mxfp4.py:335-343 (0.19.0) returns Marlin when set, after the
# FlashInfer variables; before 0.19 quantization/mxfp4.py:165-167 (0.18.1) picks Marlin unless the card took
# FlashInfer first (SM100 with FlashInfer installed, :139-146). The FlashInfer variables
# (VLLM_USE_FLASHINFER_MOE_MXFP4_BF16/_MXFP8/_MXFP8_CUTLASS) are not read here: the plan keeps the default pick.
MARLIN_ENV = "VLLM_MXFP4_USE_MARLIN"
MARLIN_ENV_UNTIL = "0.24"


# AWQ (4 bits, zero points), GPTQ (4 bits, symmetric) and compressed-tensors W4A16 (`int4_weights`) on CUDA: each
# linear layer is one opaque op whose output is the unquantized GEMM's
# ([tokens, out] in the activations' dtype), the kernel chosen by choose_mp_linear_kernel in the order CUTLASS W4A8
# (fp8 activations only), Machete, AllSpark (8-bit GPTQ only), Marlin (0.19.0 kernels/linear/__init__.py:132-140,
# 0.29.0 :479-488, 0.34.0 :540-549): Machete on SM 9.0 where every shard's in and out are multiples of 64 and 128
# (machete_utils.py:9, :37-53) and the group is -1, 64 or 128; Marlin from SM 7.5 (mixed_precision/marlin.py:30-32)
# for groups -1, 32, 64, 128 (marlin_utils.py:32) on shards with n % 64 and k % 128 (0.19.0 marlin_utils.py:163-193;
# 0.34 also takes n % 128 with k % 64, and pads the rest with a copy of the input and of the output,
# marlin_utils.py:221-302: not derived here).
# What each call allocates beside its output, read in the 0.34.0 sdist's csrc (not in the wheel):
# - Marlin: the fp32 global-reduce buffer, SMs x min(64, M rounded up to 16) x 256 floats (use_fp32_reduce, the
#   default: csrc/quantization/marlin/marlin.cu:528-541, marlin.cuh:28), freed when the op returns;
# - Machete: CUTLASS's stream-K workspace (csrc/quantization/machete/machete_mm_launcher.cuh:70-73), sized by
#   CUTLASS's scheduler; bounded here at two 256 x 128 fp32 partial tiles per SM.
MARLIN_MAX_THREAD_N = 256
MACHETE_BLOCK = (64, 128)
MARLIN_GROUPS = (-1, 32, 64, 128)
MACHETE_GROUPS = (-1, 64, 128)


@dataclass(frozen=True)
class Int4Gemm:
    """The kernel a 4-bit weight-only checkpoint's linear layers run, and what one call allocates beside its
    output."""

    kernel: str  # "Marlin" or "Machete"
    scratch_bytes: int
    rule: str
    method: str = "AWQ"  # "AWQ", "GPTQ" or "compressed-tensors W4A16"


def int4_weights(geometry: ModelGeometry) -> tuple[str, int] | None:
    """(method, group size) of a 4-bit weight-only checkpoint whose linear layers go through choose_mp_linear_kernel
    with no activation reordering: AWQ (zero points); GPTQ 4-bit symmetric (AutoGPTQ from 0.22, gptq_marlin before,
    0.19.0 quantization/gptq_marlin.py) without group act order (desc_act with a group adds Marlin's permuted copy
    of the input, [M, K], before 0.30: 0.19.0 csrc/quantization/marlin/marlin.cu:726; refused from 0.30) and
    without GPTQModel `dynamic` rules, which change bits or groups per module; compressed-tensors W4A16 (int 4-bit
    weights by group or channel, no input quantization, actorder none or static: CompressedTensorsWNA16,
    schemes/compressed_tensors_wNa16.py). None otherwise; group -1 is one group per output channel."""
    from launcher.model.linear_tensors import scheme

    method = scheme(geometry)
    if method is not None and method.name == "awq" and method.group_size is not None:
        return "AWQ", method.group_size
    qc = geometry.text_config.get("quantization_config")
    if geometry.quantization is None or not isinstance(qc, Mapping):
        return None
    name = str(qc.get("quant_method") or "").lower()
    group = qc.get("group_size")
    if name == "gptq" and qc.get("bits") == 4 and qc.get("sym") is True and isinstance(group, int) \
            and not (qc.get("desc_act") and group != -1) and not qc.get("dynamic"):
        return "GPTQ", group
    groups = qc.get("config_groups")
    if name != "compressed-tensors" or not isinstance(groups, Mapping) or len(groups) != 1:
        return None
    group_config = next(iter(groups.values()))
    weights = group_config.get("weights") if isinstance(group_config, Mapping) else None
    if not isinstance(weights, Mapping) or group_config.get("input_activations") or weights.get("type") != "int" \
            or weights.get("num_bits") != 4 or weights.get("actorder") not in (None, False, "weight", "static"):
        return None
    strategy, size = weights.get("strategy"), weights.get("group_size")
    if strategy == "channel":
        return "compressed-tensors W4A16", -1
    return ("compressed-tensors W4A16", size) if strategy == "group" and isinstance(size, int) and size > 0 else None


def int4_gemm(geometry: ModelGeometry, *, tp: int, compute_capability: tuple[int, int] | None, gpu_name: str,
              tokens: int) -> Int4Gemm | None:
    """The kernel a dense decoder's 4-bit weight-only linear layers (`int4_weights`) run on this card, where every
    shard takes it unpadded in every release from 0.19; None for another method, a MoE, a card not known or below
    SM 7.5, or another shard."""
    weights = int4_weights(geometry)
    if weights is None or geometry.num_experts or compute_capability is None \
            or compute_capability < (7, 5) or geometry.mla is not None:
        return None
    label, group = weights
    tp = max(tp, 1)
    heads, kv_heads = max(geometry.num_attention_heads // tp, 1), max(geometry.num_kv_heads // tp, 1)
    intermediate = (geometry.intermediate_size or 0) // tp
    h = geometry.hidden_size
    shards = (((heads + 2 * kv_heads) * geometry.head_dim, h), (h, heads * geometry.v_head_dim),
              (2 * intermediate, h), (h, intermediate))  # (n out, k in) of qkv, o_proj, gate_up, down
    if intermediate <= 0 or group not in MARLIN_GROUPS or any(k % group or n % 64 or k % 128 for n, k in shards):
        return None
    sms = sm_count(gpu_name)
    machete = compute_capability == (9, 0) and group in MACHETE_GROUPS and all(
        k % MACHETE_BLOCK[0] == 0 and n % MACHETE_BLOCK[1] == 0 for n, k in shards)
    if machete:
        return Int4Gemm("Machete", 2 * sms * 256 * 128 * 4,
                        f"CUTLASS's stream-K workspace, at most two 256 x 128 fp32 tiles on each of {sms} SMs", label)
    rows = min(64, -(-tokens // 16) * 16)
    return Int4Gemm("Marlin", sms * rows * MARLIN_MAX_THREAD_N * 4,
                    f"its fp32 reduce buffer, {sms} SMs x {rows} x {MARLIN_MAX_THREAD_N} floats", label)


def moe_runs_triton(compute_capability: tuple[int, int] | None, moe_backend: object, *, dp: int = 1) -> bool:
    """An unquantized checkpoint's experts run the Triton kernels (the MoE forward's oracle stood in what they
    allocate): CUDA's priority is FlashInfer TRT-LLM, FlashInfer CUTLASS, Triton, with FlashInfer moved last on
    SM 9.x and supported only on 9.0, 10.x and 12.x (fused_moe/oracle/unquantized.py:50-95 in 0.29.0-0.34.0,
    experts/flashinfer_cutlass_moe.py:135-143, experts/trtllm_bf16_moe.py:117): Triton on SM 8.x and 9.x, unless
    --moe-backend names another, or data parallelism dispatches each rank's rows to the experts (naive dispatch,
    runner/moe_runner.py:815-838). An unknown card: not known."""
    if normalized_moe_backend(moe_backend) not in (None, "triton") or dp > 1 or compute_capability is None:
        return False
    return compute_capability[0] in (8, 9)


def normalized_moe_backend(value: object) -> str | None:
    """--moe-backend as vLLM stores it (lower case, '-' as '_'; arg_utils.py:1806), None for auto/unset."""
    if not isinstance(value, str) or not value.strip():
        return None
    name = value.strip().lower().replace("-", "_")
    return None if name == "auto" else name


def marlin_env_set(env: Mapping[str, str], version: str) -> bool:
    """Whether vLLM `version` reads VLLM_MXFP4_USE_MARLIN from `env` as true."""
    raw = env.get(MARLIN_ENV, "").strip()
    if version_key(version) >= version_key(MARLIN_ENV_UNTIL) or not raw:
        return False
    try:
        return int(raw) != 0
    except ValueError:
        return False


def _backend_runs_on(backend: str, compute_capability: tuple[int, int], rules: VllmRules) -> bool:
    """The kernel class's `_supports_current_device` (the first check of is_supported_config)."""
    if backend == MXFP4_MARLIN:  # experts/marlin_moe.py:587-589 (0.32.0): capability 7.5 or newer
        return compute_capability >= (7, 5)
    if backend == MXFP4_TRTLLM:  # experts/trtllm_mxfp4_moe.py:121-123 (0.32.0): the SM100 family (and FlashInfer)
        return compute_capability[0] == 10
    # gpt_oss_triton_kernels_moe.py: (9, 0) <= cc < (11, 0) to 0.31 (0.19.0 :555-564, 0.31.0 :48), < (13, 0)
    # from 0.32 (0.32.0 :53)
    return (9, 0) <= compute_capability < ((13, 0) if rules.mxfp4_triton_sm110 else (11, 0))


def mxfp4_backend_refusal(geometry: ModelGeometry, *, version: str, moe_backend: object,
                          compute_capability: tuple[int, int] | None, lora: bool = False) -> tuple[str, str] | None:
    """(vLLM's message, its file:line) where vLLM stops loading gpt-oss under this --moe-backend, else None:
    a name the release does not map for MXFP4 (names its MoEBackend literal does not offer are refused
    before, by checks.py as argparse does), or a derived backend whose kernel does not run on this card."""
    from launcher.engines.vllm.rules import rules_for

    name = normalized_moe_backend(moe_backend)
    method = (geometry.quantization.method if geometry.quantization else "") or ""
    if (name is None or "mxfp4" not in method.lower() or not geometry.num_experts or compute_capability is None
            or version_key(version) < version_key(MOE_BACKEND_SINCE) or _lora_marlin(lora, version)):
        return None
    release, (mapped, map_line, raise_line) = lines_for(MXFP4_MOE_BACKENDS, version)
    path = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
    if name not in mapped:  # a name the release's argparse offers (checks.py refuses the others first)
        return (f"moe_backend='{name}' is not supported for MXFP4 MoE. Expected one of {list(mapped)}.",
                f"{path}:{map_line} (vLLM {release})")
    backend = _PINNED_LAYOUT.get(name)
    if backend is None or _backend_runs_on(backend, compute_capability, rules_for(version)[0]):
        return None
    if version_key(release) >= version_key(MXFP4_REFUSAL_IN_BASE_SINCE):
        path = "vllm/model_executor/layers/fused_moe/oracle/base.py"
    return (f"Mxfp4 MoE backend '{backend}' does not support the deployment configuration since kernel does not "
            "support current device cuda.", f"{path}:{raise_line} (vLLM {release})")


# 0.19-0.20: with --enable-lora the MXFP4 oracle returns before the pinned --moe-backend is read, Marlin
# unless VLLM_MXFP4_USE_MARLIN is set to false where Triton runs (TRITON_UNFUSED, Triton's layout, the
# smaller one) (0.19.0 oracle/mxfp4.py:209-223, the pin read at :262; 0.20.0 :259-272; no such branch in 0.21).
LORA_MARLIN_SINCE, LORA_MARLIN_UNTIL = "0.19", "0.21"


def _lora_marlin(lora: bool, version: str) -> bool:
    return lora and version_key(LORA_MARLIN_SINCE) <= version_key(version) < version_key(LORA_MARLIN_UNTIL)


def _pinned_backends(name: str | None, marlin_env: bool, compute_capability: tuple[int, int], version: str,
                     rules: VllmRules, lora: bool = False) -> tuple[tuple[str, ...], str, str] | None:
    """(backends, when the others run, why) where a pinned flag or VLLM_MXFP4_USE_MARLIN decides; None: default."""
    if _lora_marlin(lora, version):
        return (MXFP4_MARLIN,), "", "--enable-lora (vLLM 0.19-0.20 take Marlin for MXFP4 LoRA, before --moe-backend)"
    if name is not None and version_key(version) >= version_key(MOE_BACKEND_SINCE):
        backend = _PINNED_LAYOUT.get(name)
        if backend is not None:
            return (backend,), "", f"--moe-backend {name}"
        return (), "", f"--moe-backend {name}"
    if marlin_env:
        if version_key(version) < version_key(MOE_BACKEND_SINCE) and compute_capability[0] == 10:
            return ((MXFP4_TRTLLM, MXFP4_MARLIN), "where FlashInfer is not installed (picked before the variable)",
                    f"{MARLIN_ENV}=1")
        return (MXFP4_MARLIN,), "", f"{MARLIN_ENV}=1"
    return None


def _mxfp4_rule(backend: str, *, hopper: bool, version: str, rules: VllmRules) -> str:
    if backend == MXFP4_MARLIN:
        return "MXFP4 experts repacked for Marlin: hidden padded to 256, intermediate to 128 per rank"
    if backend == MXFP4_TRTLLM:
        return (f"MXFP4 experts shuffled for FlashInfer TRT-LLM ({MXFP4_TRTLLM}): hidden padded to 256, "
                f"intermediate to {rules.mxfp4_trtllm_intermediate_align} per rank, fp32 biases")
    kept = ", loaded scales kept (before 0.25)" if version_key(version) < version_key("0.25") else ""
    if hopper:
        return "MXFP4 experts swizzled for Hopper's Triton kernels: padded values and scales, fp32 biases" + kept
    return "MXFP4 experts swizzled for the Triton kernels on Blackwell: padded values and scales, fp32 biases" + kept


# --------------------------------------------------------------------------- rotary tables

# vLLM's weights term ("Model loading took", DeviceMemoryProfiler around the load) counts the buffers
# the modules allocate beside the checkpoint: above all the rotary embedding's cos/sin table, built on
# the device in the model dtype (0.32.0 model_executor/layers/rotary_embedding/base.py:58-63), one per
# distinct rope configuration (get_rope caches them, rotary_embedding/__init__.py:74-85), on every rank.
# Positions by rope type (rotary_embedding/__init__.py:112-330): the model's maximum for default,
# llama3 and longrope's long table (plus its original for the short one, phi3_long_rope_scaled_rope.py),
# x factor for linear and dynamic, original x factor for YaRN and DeepSeek's YaRN, x 4 for M-RoPE
# (mrope.py:319-351). Checked against the tables vLLM 0.32 builds (tests/oracles/vllm_params.py ->
# tests/data/vllm_params.json); the same table in the model dtype and the same M-RoPE x 4 in 0.10.1
# and 0.19.0 (base.py:35-37, mrope.py:197/238). Llama 4 Scout's 10,485,760 positions make 2.5 GiB on
# each rank.
MROPE_POSITIONS_FACTOR = 4
# Qwen3-VL and Qwen3.5 build theirs with factor 1 unless video pruning is on (0.32.0 models/qwen3_vl.py:
# 1818-1831); 0.19.0 has no such argument (x 4, mrope.py:238): before 0.32 the plan counts x 4 (the safe side).
MROPE_FACTOR_ONE = ("Qwen3VL", "Qwen3_5")
MROPE_FACTOR_ONE_SINCE = "0.32"
# No rotary embedding: NoPE attention layers (Jamba, Nemotron-H; Granite 4.0-H with
# position_embedding_type "nope"), or no attention at all.
ROPE_FREE = frozenset({"JambaForCausalLM", "NemotronHForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM",
                       "FalconMambaForCausalLM"})
# Served by the Transformers backend in 0.32 (model_executor/models/registry.py:709-730), whose HF rotary
# module computes its table in the forward pass: no table at load. Earlier releases ran some of them
# natively; the plan counts a table there (the safe side).
TRANSFORMERS_BACKEND_SINCE_032 = frozenset({
    "ArceeForCausalLM", "CwmForCausalLM", "FlexOlmoForCausalLM", "GlmForCausalLM", "GPTBigCodeForCausalLM",
    "GPTNeoXForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM", "Jais2ForCausalLM",
    "MellumForCausalLM", "NanbeigeForCausalLM", "OlmoForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM",
    "PhiForCausalLM", "SeedOssForCausalLM", "SmolLM3ForCausalLM", "Starcoder2ForCausalLM", "VaultGemmaForCausalLM"})
# Added in 0.34 (registry.py:782-811 in 0.34.0; models/gemma.py, olmoe.py, stablelm.py, aria.py are gone),
# and Kolibri1, new there.
TRANSFORMERS_BACKEND_SINCE_034 = frozenset({
    "GemmaForCausalLM", "OlmoeForCausalLM", "StableLmForCausalLM", "AriaForConditionalGeneration",
    "Kolibri1ForCausalLM"})
# Each architecture and the first release that serves it on the Transformers backend.
TRANSFORMERS_BACKEND_SINCE: Mapping[str, str] = {
    **dict.fromkeys(TRANSFORMERS_BACKEND_SINCE_032, "0.32"), **dict.fromkeys(TRANSFORMERS_BACKEND_SINCE_034, "0.34")}
# The backend compiles the HF decoder itself (models/transformers/base.py:286-299), with vLLM's fused QKV and GLU
# linears but the HF code between them: its forward's peak is not the native formula's. Run by the forward oracle
# (tests/data/vllm_lm_forward_oracle-transformers-0.32.0.json, -0.34.0.json: OLMo 2/3, Phi-2, Seed-OSS, SmolLM3,
# Gemma 1): from 6,016 B a token below the formula (Phi-2) to 4.1 H bytes (OLMo 2/3 at TP 1) and 6.3 H bytes
# (Seed-OSS at TP 8) above it. Its band: 0.5 GiB, or 7 H bytes a token (2-byte activations) where that is more.
TRANSFORMERS_BACKEND_EXCESS_H = 7


def served_by_transformers_backend(architecture: str | None, version: str) -> bool:
    since = TRANSFORMERS_BACKEND_SINCE.get(architecture or "")
    return since is not None and version_key(version) >= version_key(since)


@dataclass(frozen=True)
class RopeTables:
    """The cos/sin tables one rank holds beside the checkpoint."""

    bytes: int
    rule: str


def _rope_positions(text: Mapping[str, Any], scaling: Mapping[str, Any] | None, positions: int,
                    architecture: str, version: str) -> int | None:
    if not scaling:
        return positions
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings", text.get("original_max_position_embeddings", positions))
    if "mrope_section" in scaling or kind == "mrope":
        one = architecture.startswith(MROPE_FACTOR_ONE) and version_key(version) >= version_key(MROPE_FACTOR_ONE_SINCE)
        return positions * (1 if one else MROPE_POSITIONS_FACTOR)
    if kind in ("default", "llama3"):
        return positions
    if kind in ("linear", "dynamic") and isinstance(factor, (int, float)):
        return int(positions * factor)
    if kind in ("yarn", "deepseek_yarn") and isinstance(factor, (int, float)) and isinstance(original, int):
        return int(original * factor)
    if kind in ("longrope", "su") and isinstance(original, int):
        return positions + original
    return None


def rope_tables(geometry: ModelGeometry, *, dtype: str, version: str) -> RopeTables | None:
    """vLLM's rotary tables for this model (one rank), None where its rope type is not derived here."""
    text = geometry.text_config
    positions = text.get("max_position_embeddings")
    element = ELEMENT_BYTES.get(dtype)
    architecture = geometry.architecture
    if geometry.kv_layers == 0 or architecture in ROPE_FREE or text.get("position_embedding_type") == "nope":
        return RopeTables(0, "no rotary embedding")
    if served_by_transformers_backend(architecture, version):
        return RopeTables(0, "Transformers backend: the table is computed in the forward pass")
    if not isinstance(positions, int) or element is None:
        return None
    factor = partial_rotary_factor(text)
    if geometry.mla is not None:
        rotary = geometry.mla.qk_rope_head_dim
    elif architecture == "Zamba2ForCausalLM" and isinstance(text.get("attention_head_dim"), int):
        rotary = text["attention_head_dim"]  # its shared transformer's heads (models/zamba2.py)
    elif factor is not None:
        rotary = int(geometry.head_dim * factor)
    else:
        return None
    scaling = text.get("rope_scaling") or text.get("rope_parameters")
    if scaling is not None and not isinstance(scaling, Mapping):
        return None
    if scaling and all(isinstance(value, Mapping) for value in scaling.values()):
        # transformers 5's rope_parameters per layer type ({"sliding_attention": {...}, ...}): a table each
        # distinct configuration (models/gemma3.py:157 reads config.rope_parameters[layer_type]).
        distinct = {json.dumps(value, sort_keys=True): value for value in scaling.values()}
        tables = [_rope_positions(text, value, positions, architecture, version) for value in distinct.values()]
    else:
        tables = [_rope_positions(text, scaling, positions, architecture, version)]
    if isinstance(text.get("rope_local_base_freq"), (int, float)) and len(tables) == 1:
        # Gemma 3: the sliding layers' rope (its own base, no scaling) is a second table.
        tables.append(positions)
    if any(table is None or table <= 0 for table in tables) or rotary <= 0:
        return None  # a length, factor or rotary fraction vLLM would not build a table from
    sized = [int(table or 0) * rotary * element for table in tables]
    return RopeTables(sum(sized), " + ".join(f"{table:,} positions x {rotary}" for table in tables)
                      + f" x {element} B")


def counted_rope_tables(geometry: ModelGeometry, *, dtype: str, version: str) -> RopeTables:
    """The tables the plan counts: rope_tables, else (a rope type not derived) the default rope's table
    of the maximum length."""
    tables = rope_tables(geometry, dtype=dtype, version=version)
    if tables is not None:
        return tables
    positions = geometry.text_config.get("max_position_embeddings")
    fallback = positions * geometry.head_dim * ELEMENT_BYTES.get(dtype, 2) if isinstance(positions, int) else 0
    return RopeTables(fallback, "rope type not derived: the default table of the maximum length counted")


# MLA's decode weights: MLAAttention.process_weights_after_loading takes W_UK_T and W_UV as views of
# kv_b_proj's weight in [kv_lora_rank, heads x (qk_nope + v_head)] (0.10.1 v1/attention/backends/mla/
# common.py:956-1005; 0.19.0 model_executor/layers/attention/mla_attention.py:710-797; 0.32.0 :407-422
# split_kv_b_proj, :1220-1320). An unquantized kv_b_proj is its own weight; a quantized one (fp8 blocks,
# compressed-tensors, AWQ/GPTQ, online fp8) is dequantized into a model-dtype copy (quant_utils.py
# get_and_maybe_dequant_weights: the identity through the layer, or the scales applied) that the views
# keep alive beside the quantized weight, inside "Model loading took".
# Where a checkpoint leaves kv_b_proj unquantized: its ignore lists (compressed-tensors `ignore`, fp8
# `ignored_layers` / `modules_to_not_convert`, Quark `exclude`, ModelOpt `exclude_modules`) matched as vLLM
# matches them (compressed_tensors/utils.py:53 should_ignore_layer: exact or `re:` re.match, fnmatch for
# ModelOpt; quant_utils.py:617 is_layer_skipped: exact, AWQ's modules_to_not_convert by substring), and
# compressed-tensors' config_groups targets (a layer no target matches stays unquantized).
_IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert", "exclude", "exclude_modules")
_SUBSTRING_METHODS = frozenset({"awq", "awq_marlin", "bitsandbytes"})
# A stranger's regex runs against our short layer names only when it cannot backtrack for long: a few
# quantifiers, no quantified group. Anything else is taken as not matching an ignore entry (the copy is
# counted: the safe side) and as matching a quantization target (the same).
_REGEX_MAX_LENGTH = 200
_REGEX_MAX_QUANTIFIERS = 4
_QUANTIFIED_GROUP = re.compile(r"\)[*+?{]")


@dataclass(frozen=True)
class MlaDecodeWeights:
    """The dequantized kv_b_proj copies one rank holds beside the checkpoint."""

    bytes: int
    rule: str


def mla_decode_weights(geometry: ModelGeometry, *, dtype: str, tp: int, pp: int,
                       online_quantization: object = None) -> MlaDecodeWeights:
    """One rank's model-dtype copies of the quantized kv_b_proj of its MLA layers (0 where none), on the
    pipeline stage that holds the most (vLLM's get_pp_indices split)."""
    mla, element = geometry.mla, ELEMENT_BYTES.get(dtype, 2)
    online = isinstance(online_quantization, str) and online_quantization.strip().lower() not in ("", "none")
    if mla is None or (geometry.quantization is None and not online):
        return MlaDecodeWeights(0, "")
    config = geometry.text_config.get("quantization_config") if not online else None
    method = geometry.quantization.method if geometry.quantization is not None and not online else "fp8"
    quantized = {index for index, kind in enumerate(geometry.layer_kinds)
                 if kind == MLA and _kv_b_quantized(index, config, method)}
    stages = pp_partitions(len(geometry.layer_kinds), max(pp, 1))
    layers = max(sum(1 for index in stage if index in quantized) for stage in stages)
    if not layers:
        return MlaDecodeWeights(0, "kv_b_proj left unquantized by the checkpoint: no dequantized copy")
    heads = max(geometry.num_attention_heads // max(tp, 1), 1)
    per_layer = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim) * element
    return MlaDecodeWeights(layers * per_layer, (
        f"MLA W_UK_T/W_UV: kv_b_proj dequantized to {dtype}, {layers} layers x {mla.kv_lora_rank} x {heads} heads x "
        f"{mla.qk_nope_head_dim + mla.v_head_dim}"))


def _kv_b_quantized(index: int, config: object, method: str) -> bool:
    """Whether vLLM quantizes layer `index`'s kv_b_proj under this quantization_config."""
    if not isinstance(config, Mapping):
        return True
    names = (f"model.layers.{index}.self_attn.kv_b_proj", f"language_model.model.layers.{index}.self_attn.kv_b_proj")
    substring = method.lower() in _SUBSTRING_METHODS
    for key in _IGNORE_KEYS:
        entries = config.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, str) and any(_ignored(name, entry, substring) for name in names):
                return False
    groups = config.get("config_groups")
    if isinstance(groups, Mapping) and groups:
        targets: list[object] = []
        for group in groups.values():
            listed = group.get("targets") if isinstance(group, Mapping) else None
            targets += listed if isinstance(listed, list) else []
        return any(_targeted(name, target) for name in names for target in targets if isinstance(target, str))
    return True


def _ignored(name: str, entry: str, substring: bool) -> bool:
    if entry.startswith("re:"):
        return _regex_match(entry[3:], name) is True
    if "*" in entry or "?" in entry:
        return fnmatch.fnmatchcase(name, entry)
    return name == entry or name.endswith("." + entry) or (substring and bool(entry) and entry in name)


def _targeted(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return _regex_match(target[3:], name) is not False  # too complex to run: taken as quantized
    return target in ("Linear", "ColumnParallelLinear") or name == target or name.endswith("." + target)


def _regex_match(pattern: str, name: str) -> bool | None:
    """re.match of a config's pattern against a layer name, None where the pattern is not run."""
    quantifiers = sum(pattern.count(q) for q in "*+?{")
    if len(pattern) > _REGEX_MAX_LENGTH or quantifiers > _REGEX_MAX_QUANTIFIERS or _QUANTIFIED_GROUP.search(pattern):
        return None
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return None


def mxfp4_as_loaded(geometry: ModelGeometry, *, version: str, tp: int, pp: int,
                    compute_capability: tuple[int, int] | None, moe_backend: object = None,
                    marlin_env: bool = False, lora: bool = False) -> Mxfp4AsLoaded:
    """gpt-oss's MXFP4 experts per rank as the kernel vLLM picks holds them, beyond the checkpoint's share.

    Where the pick depends on what the install has (FlashInfer's kernels, an optional package) or the card
    is not known (a bare --gpu size), the band spans the layouts it may hold: the largest at its unfavourable
    end. A pinned --moe-backend (0.19+) or VLLM_MXFP4_USE_MARLIN (0.10-0.23) decides the layout; a pinned
    backend whose layout is not derived here spans the largest derived one down to the checkpoint's
    (`mxfp4_backend_refusal` says where vLLM refuses the pin instead). Only gpt-oss takes this backend list
    (0.33.0 quantization/mxfp4.py:132-149; other MXFP4 MoE models go through `_get_priority_backends`)."""
    from launcher.engines.vllm.rules import rules_for

    method = (geometry.quantization.method if geometry.quantization else "") or ""
    if "mxfp4" not in method.lower() or not geometry.num_experts or geometry.model_type != "gpt_oss":
        return NOT_MXFP4
    experts, hidden = geometry.num_experts, geometry.hidden_size
    moe = geometry.expert_intermediate_size
    if not isinstance(moe, int) or moe <= 0:
        return NOT_MXFP4
    rules = rules_for(version)[0]
    share = moe // max(tp, 1)
    checkpoint = _padded_expert_bytes(hidden, share, bias_bytes=2)
    cards = (compute_capability,) if compute_capability is not None else ((8, 9), (9, 0), (10, 0), (12, 0))
    layouts: dict[tuple[str, bool], int] = {}  # (backend, on Hopper) -> bytes beyond the checkpoint an expert
    decided_by, pinned_rule, underived = "", "", ""
    for card in cards:
        backends, decided_by = _mxfp4_backends(card, rules)
        pinned = _pinned_backends(normalized_moe_backend(moe_backend), marlin_env, card, version, rules, lora)
        if pinned is not None:
            pinned_rule = pinned[2]
            if pinned[0]:
                backends, decided_by = pinned[0], pinned[1]
            else:  # a pinned backend whose layout is not derived: the largest layout derived for this card
                underived = pinned[2]
                backends = tuple(b for b in (MXFP4_TRITON, MXFP4_MARLIN, MXFP4_TRTLLM)
                                 if _backend_runs_on(b, card, rules)) or backends
        for b in backends:
            layouts[(b, card[0] == 9)] = max(_mxfp4_expert_bytes(b, hidden, share, version=version, rules=rules,
                                                                 hopper=card[0] == 9) - checkpoint, 0)
    (largest, hopper), smallest = max(layouts, key=lambda k: layouts[k]), min(layouts.values())  # ties: vLLM's order
    expert_layers = experts * -(-geometry.num_layers // max(pp, 1))
    high = layouts[(largest, hopper)] * expert_layers
    low = 0 if underived else smallest * expert_layers
    extra = (high + low) // 2
    rule = _mxfp4_rule(largest, hopper=hopper, version=version, rules=rules)
    if underived:
        rule = (f"{underived}: its layout is not derived here; the band spans the largest derived layout on "
                f"this card ({rule}) down to the checkpoint's ({format_gib(high)} less)")
    elif high != low:
        others = "/".join(sorted({b for b, on_hopper in layouts if (b, on_hopper) != (largest, hopper)}))
        why = "the card is not known" if compute_capability is None else decided_by
        rule = (f"{pinned_rule + ': ' if pinned_rule else ''}{rule}; {others} where {why}: "
                f"{format_gib(high - low)} less; the plan counts the middle, the band spans both")
    elif pinned_rule:
        rule = f"{pinned_rule}: {rule}"
    return Mxfp4AsLoaded(extra, high - extra, largest, rule)


# Online quantization: `--quantization fp8` (fp8_per_tensor from 0.31: model_loader/weight_utils.py:349-356
# in 0.32), fp8_per_tensor and fp8_per_block (0.20+), fp8_per_channel (0.24+) on a checkpoint without a
# quantization config. From 0.16 every LinearBase and FusedMoE weight is created on the meta device,
# materialized one layer at a time and quantized as it loads (0.16.0 quantization/fp8.py:525-600
# `Fp8OnlineLinearMethod`; 0.32 quantization/online/fp8.py:118-201 `OnlineLinearBase`); the embedding and
# lm_head (VocabParallelEmbedding, not LinearBase) keep the model dtype, so "Model loading took" is the
# quantized model. Before 0.16 the 16-bit weights are allocated when the model is built (0.15.0
# quantization/fp8.py:604-612; 0.12.0 quantizes only after the whole load, :529-530): the checkpoint's bytes
# stay the plan's weights (the load peak). Only 0.32 empties the allocator's cache right after loading
# (model_loader/base_loader.py:89-93, :111-113); before, one layer's 16-bit weights, freed after quantizing,
# may stay cached: that is the term's error there.
ONLINE_QUANT_SINCE = "0.16"
EMPTIES_CACHE_AFTER_LOAD_SINCE = "0.32"
ONLINE_FP8_BYTES_PER_ELEMENT = {"fp8": 1.0, "fp8_per_tensor": 1.0, "fp8_per_channel": 1.0,
                                "fp8_per_block": 1.0 + 4 / (128 * 128)}


def online_quant_delta_bytes(geometry: ModelGeometry, *, quantization: str | None, checkpoint_bytes: int,
                             model_dtype: str, version: str) -> tuple[int, int, str]:
    """(change, +/- error, rule) to the whole model's bytes when vLLM quantizes it while loading
    (launcher/engines/online_quant.py); the error is the norms and biases counted as quantized, and
    before 0.32 one layer's 16-bit weights the caching allocator may keep."""
    per_element = ONLINE_FP8_BYTES_PER_ELEMENT.get(quantization or "")
    if per_element is None or geometry.quantization is not None:
        return 0, 0, ""
    if version_key(version) < version_key(ONLINE_QUANT_SINCE):
        return 0, 0, (f"--quantization {quantization}: vLLM {version} allocates the whole model in 16 bits before "
                      "quantizing it (0.15.0 quantization/fp8.py:604-612): its load peak is the checkpoint's bytes")
    if geometry.is_multimodal:
        return 0, 0, (f"--quantization {quantization}: which of the wrapper's encoder layers vLLM quantizes is not "
                      "derived here: the checkpoint's bytes are counted (more than vLLM holds)")
    weights = quantized_weights(geometry, checkpoint_bytes=checkpoint_bytes, model_dtype=model_dtype,
                                bytes_per_element=per_element)
    if weights is None:
        return 0, 0, ""
    error = weights.small_error
    if version_key(version) < version_key(EMPTIES_CACHE_AFTER_LOAD_SINCE):
        # one layer's 16-bit weights, cached
        error += weights.quantized_elements // max(geometry.num_layers, 1) * ELEMENT_BYTES[model_dtype]
    rule = (f"--quantization {quantization}: linear and expert weights quantized to fp8 while loading, "
            f"{kept_layers(geometry)} kept in {model_dtype}")
    return weights.loaded - checkpoint_bytes, error, rule


def upcast_weights_delta(geometry: ModelGeometry, *, checkpoint_bytes: int, model_dtype: str,
                         quantization: str | None) -> tuple[int, str]:
    """(extra bytes, rule) when the model dtype is wider than the checkpoint's: vLLM creates every parameter
    in the model dtype (model_loader/base_loader.py:53 in 0.19.0, set_default_torch_dtype(model_config.dtype))
    and copies the checkpoint into it, so --dtype float32 on a 16-bit checkpoint holds twice its bytes (the
    0.19 H100 log of Llama-3.1-8B: "Model loading took 29.98 GiB", 14.99 in bf16). Quantized checkpoints and
    online quantization keep their own rules. A narrower model dtype (a float32 config run in 16 bits) is
    not taken off: the config's dtype need not be the files', and counting the stored bytes is the safe side."""
    if geometry.quantization is not None or quantization:
        return 0, ""
    stored_name = canonical(geometry.config_dtype)
    stored, held = ELEMENT_BYTES.get(stored_name or ""), ELEMENT_BYTES.get(canonical(model_dtype) or "")
    if stored is None or held is None or held <= stored:
        return 0, ""
    return checkpoint_bytes * (held - stored) // stored, (
        f"{stored_name} checkpoint held in {canonical(model_dtype)}: every parameter is created in the model dtype "
        f"(x{held // stored}, model_loader/base_loader.py:53)")


# --------------------------------------------------------------------------- CUDA graphs
#
# What vLLM subtracts from the KV budget (0.20+, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1) is a
# measurement on the GPU, not a formula: it captures the two largest graphs of each mode into a
# throwaway pool and extrapolates, estimate = first capture + (graphs - 1) x max(second, 1 MiB)
# (V1 runner: vllm/v1/worker/gpu_model_runner.py:6333-6480 in 0.32, the larger first capture of the
# two modes, which share a pool; V2 runner from 0.29: v1/worker/gpu/cudagraph_utils.py:873-990,
# PIECEWISE measured in full, FULL extrapolated). Before 0.29 the V2 runner estimates nothing
# (v1/worker/gpu/model_runner.py:843 in 0.28: "return 0"): its graphs are captured after the KV
# cache, outside the budget. The engine then logs the actual pool against the estimate
# (gpu_worker.py:964-980), which it is built to match.
#
# The arithmetic is how many graphs. With the default FULL_AND_PIECEWISE (config/vllm.py:303) one
# PIECEWISE graph per capture size and one FULL decode graph per size up to max_num_seqs
# (v1/cudagraph_dispatcher.py:164-230; v1/worker/gpu/cudagraph_utils.py:251-373), the sizes from
# `_set_cudagraph_sizes` (config/vllm.py:2292-2500). What the graphs cost is fitted in vLLM's own form, a
# first capture and a cost per graph that grows with the layers on the rank (the kernels a graph records):
# dense = CUDAGRAPH_FIRST_CAPTURE_BYTES + graphs x layers x CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER, on every
# published capture with a known model ("Graph capturing finished ... took X GiB": 50 dense ones, 38 distinct,
# vLLM 0.11 and 0.19, 102 graphs each; 44 of them llm-d-planner's 0.19 H100 sweep, from 8 to 80 layers a rank:
# Llama-3.1-8B took 0.51 / 0.65 / 0.91 GiB at 8 / 16 / 32 layers, PP 4 / PP 2 / one rank). The first capture is
# the least-squares intercept over the distinct captures (0.32 GiB; the 0.19 logs print the FULL first capture
# at 228-266 MiB and the PIECEWISE one at 96-224 on one rank); the per graph-layer cost is refitted
# leave-one-out by bench/startup_logs.py with it fixed: held-out residuals within 0.085 MiB, band 0.09. A cost
# proportional to the layers alone (0.242, fitted on six logs) missed the stages of PP 4 by 0.37 MiB a
# graph-layer and put 80-layer models 0.3-0.5 GiB over.
# MoE captures do not grow with the layers (Qwen3-30B-A3B 48 layers 14.2 MiB per graph, Kimi-VL-A3B 27 layers
# 15.1, gpt-oss-20b 24 layers 11.4 over its 166 graphs, Mixtral-8x7B at TP 2 32 layers 9.3; per graph and
# layer 0.29-0.47): per graph, 12.75 MiB (the median of those four; nine logs now give 11.35, held-out
# residuals within 4.4 MiB: 12.75 kept, the safe side), band 5.8 MiB, and never less than a dense model of
# as many layers.
# One capture outside the data (vLLM 0.31, A100-80GB, 32 layers, 86 graphs: 0.23 GiB) is below the dense
# band: the V2 runner's graphs may cost less; the plan stays on the safe side.
CUDAGRAPH_FIRST_CAPTURE_BYTES = int(0.32 * GiB)
CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER = int(0.1845 * MiB)
CUDAGRAPH_DENSE_ERROR_PER_GRAPH_LAYER = int(0.09 * MiB)
CUDAGRAPH_MOE_BYTES_PER_GRAPH = int(12.75 * MiB)
CUDAGRAPH_MOE_ERROR_PER_GRAPH = int(5.8 * MiB)
# Before 0.11 no capture in the data has a known count (V0 graphs cost more: 0.8.2 Phi-4, 1.12 GiB for
# 35 sizes x 40 layers, 0.82 MiB each): the band stays at least the farthest the old fixed formula
# (256 MiB + 13.5 MiB per layer) was from a published capture, and the reported OOM in capture on
# 0.8.5 (4 x A10, Qwen3-30B-A3B) stays a doubt.
CUDAGRAPH_UNFITTED_ERROR_BYTES = int(1.27 * GiB)
CUDAGRAPH_FITTED_SINCE = "0.11"
# Every fitted capture but gpt-oss's (to 1024) stopped at 512 (the default ceiling off data-centre
# Blackwell): a graph of a larger size (gpt-oss's, Blackwell's 1024 from 0.28 and 0.34's 8192-token prefill
# grid there, a pinned --max-cudagraph-capture-size or list) carries its whole fitted cost again in the band.
CUDAGRAPH_FITTED_LARGEST_SIZE = 512
V2_CUDAGRAPH_ESTIMATE_SINCE = "0.29"  # v1/worker/gpu/cudagraph_utils.py:718 profile_cudagraph_memory (0.29.0)


# gpt-oss's config hook widens the default capture sizes when none is pinned (GptOssForCausalLMConfig,
# model_executor/models/config.py): an explicit list to 1024 in 0.10 (:258-275 in 0.10.1), to 992 in
# 0.11 (:256-273 in 0.11.0), max_cudagraph_capture_size 1024 from 0.12 (:263-276 in 0.12.0, :120-133 in
# 0.19.0, :549-562 in 0.33.0); from 0.34 the same token sizes for mixed batches and a decode grid up to
# 1024 requests, not on compute capability 10.x, whose defaults are wider (:843-880 in 0.34.0).
GPT_OSS_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
GPT_OSS_TOKEN_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 1024, 16))  # below its 1024-token ceiling
NO_SPLIT_PINS = SplitPins()
SPLIT_DEFAULT_BUDGET = 8192  # SM100's prefill ceiling and decode token budget (config/vllm.py:2604-2611)


class CaptureSizesRefused(ValueError):
    """vLLM refuses the pinned capture sizes at start (a ValueError in config/vllm.py)."""

    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.message, self.source = message, source


def _walk_grid(limit: int, step: Callable[[float], float]) -> list[int]:
    """0.34.0 config/compilation.py:78-87: 1 .. limit, each the next multiple of the largest power of two
    not above step(size)."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def prefill_capture_grid(max_tokens: int, dense_head: bool = False) -> list[int]:
    """0.34.0 config/compilation.py:90-101 (`prefill_cudagraph_capture_grid`): 54 sizes at 8192."""
    grid = _walk_grid(max_tokens, lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))
    return sorted({*grid, *(t for t in range(1, 33) if t < max_tokens)}) if dense_head else grid


def decode_capture_grid(max_requests: int) -> list[int]:
    """0.34.0 config/compilation.py:122-127 (`decode_cudagraph_capture_grid`): 64 sizes at 1024."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def graph_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, version: str,
                compute_capability: tuple[int, int] | None = None, interactivity: bool = False,
                explicit: tuple[int, ...] | None = None, max_capture_size: int | None = None,
                gpt_oss: bool = False, split: SplitPins = NO_SPLIT_PINS) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(token sizes of the mixed-batch graphs, request counts of the uniform-decode graphs).

    Before 0.34 one list serves both, the decode graphs at its sizes up to max_num_seqs; gpt-oss's hook
    widens it (GPT_OSS_ARCHITECTURES). From 0.34 each kind from its own pins (`split_graph_sizes`)."""
    sm100 = compute_capability is not None and compute_capability[0] == 10
    legacy = explicit is not None or max_capture_size is not None
    if version_key(version) < version_key(SPLIT_SIZES_SINCE):
        if gpt_oss and not legacy and version_key(version) < version_key("0.12"):
            top = 992 if version_key(version) >= version_key("0.11") else 1024
            explicit = (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16))
        elif gpt_oss and not legacy:
            max_capture_size = 1024
    shared = capture_sizes(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, version=version,
                           compute_capability=compute_capability, interactivity=interactivity, explicit=explicit,
                           max_capture_size=max_capture_size)
    if version_key(version) < version_key(SPLIT_SIZES_SINCE):
        return shared, tuple(n for n in shared if n <= max_num_seqs)
    if gpt_oss and not legacy and not split.sets_sizes and not sm100:
        # Its hook, on what no pin set (model_executor/models/config.py:843-880 in 0.34.0).
        top = min(max_num_batched_tokens, 1024)
        split = dataclasses.replace(split, prefill_sizes=tuple(sorted({s for s in GPT_OSS_TOKEN_SIZES if s < top}
                                                                      | {top})), max_decode_requests=1024)
    return split_graph_sizes(shared, legacy=legacy, pins=split, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, sm100=sm100, interactivity=interactivity)


def split_graph_sizes(shared: tuple[int, ...], *, legacy: bool, pins: SplitPins, max_num_seqs: int,
                      max_num_batched_tokens: int, sm100: bool,
                      interactivity: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """0.34's `_split_cudagraph_capture_sizes` (config/vllm.py:2558-2737 in 0.34.0) and the decode shapes its
    V2 runner captures (config/compilation.py:54-67, v1/worker/gpu/cudagraph_utils.py:333-341), without
    speculation: each kind from its own sizes, else its ceiling's grid, else (off SM100, or beside the
    deprecated legacy keys) the shared list; SM100's wide defaults cap decode graphs at 8192 tokens."""
    wide = not legacy and sm100
    budget = pins.max_decode_tokens if pins.max_decode_tokens is not None else (SPLIT_DEFAULT_BUDGET if wide else None)
    if pins.prefill_sizes is not None:
        prefill = _within(pins.prefill_sizes, max_num_batched_tokens, pins.max_prefill_tokens, "prefill_cudagraph_"
                          "capture_token_sizes", "max_prefill_cudagraph_capture_tokens")
    elif pins.max_prefill_tokens is not None or wide:
        ceiling = SPLIT_DEFAULT_BUDGET if pins.max_prefill_tokens is None else pins.max_prefill_tokens
        prefill = prefill_capture_grid(min(ceiling, max_num_batched_tokens), dense_head=interactivity)
    else:
        prefill = list(shared)
    if pins.decode_sizes is not None:
        decode = _within(pins.decode_sizes, max_num_seqs, pins.max_decode_requests, "decode_cudagraph_capture_"
                         "request_sizes", "max_decode_cudagraph_capture_requests")
    elif pins.max_decode_requests is not None or wide:
        decode = decode_capture_grid(max_num_seqs if pins.max_decode_requests is None
                                     else min(pins.max_decode_requests, max_num_seqs))
    else:
        decode = sorted({min(n, max_num_seqs) for n in shared})
    # A batch pads to the smallest graph holding it: the first size above the limit is captured at it.
    limit = min(max_num_seqs, max_num_batched_tokens if budget is None else min(budget, max_num_batched_tokens))
    reachable = decode[:bisect.bisect_left(decode, limit) + 1] if limit >= 1 else []
    decode = sorted({min(n, limit) for n in reachable})
    if legacy and pins.sets_sizes and list(shared) not in (sorted({*decode, *prefill}), decode):
        raise CaptureSizesRefused("The deprecated cudagraph_capture_sizes and max_cudagraph_capture_size cannot be "
                                  "combined with the prefill and decode CUDA graph capture sizes; set only the latter.",
                                  "vllm/config/vllm.py:2717-2729 (vLLM 0.34.0)")
    return tuple(prefill), tuple(decode)


def _within(sizes: tuple[int, ...], limit: int, cap: int | None, name: str, cap_name: str) -> list[int]:
    """0.34's `explicit` (config/vllm.py:2613-2626): the sizes in [1, limit]; one above a pinned cap refused."""
    kept = sorted({n for n in sizes if 1 <= n <= limit})
    if cap is not None and kept and kept[-1] > cap:
        raise CaptureSizesRefused(f"{name} holds {kept[-1]}, above {cap_name}={cap}.",
                                  "vllm/config/vllm.py:2625 (vLLM 0.34.0)")
    return kept


def capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, version: str,
                  compute_capability: tuple[int, int] | None = None, interactivity: bool = False,
                  explicit: tuple[int, ...] | None = None, max_capture_size: int | None = None) -> tuple[int, ...]:
    """`VllmConfig._set_cudagraph_sizes` without a speculative config (config/vllm.py:2292-2500 in 0.32).

    The ceiling is min(2 x max_num_seqs, 512), 1024 on the data-centre Blackwell family (compute
    capability 10.x) from 0.28 (not in 0.27), then at most max_num_batched_tokens. From 0.26 (not in
    0.20) max_num_batched_tokens is captured when under the ceiling; from 0.32 (not in 0.29)
    max_num_seqs too. Before 0.12 every multiple of 8 up to the ceiling (0.11.0 config/__init__.py:595,
    scheduler.py:227); from 0.12 multiples of 16 above 256 (0.12.0 config/vllm.py:1069-1074).
    `explicit` sizes (0.12+) are kept as given up to max_num_batched_tokens (config/vllm.py:2453-2463);
    an explicit `max_capture_size` replaces the ceiling, and then max_num_seqs is not appended (:2346-2444)."""
    since = version_key(version)
    if explicit is not None:
        return tuple(sorted({n for n in explicit if n <= max_num_batched_tokens}))
    if since < version_key("0.12"):
        ceiling = min(max_num_seqs * 2, 512)
        return tuple(n for n in [1, 2, 4, *range(8, ceiling + 1, 8)] if n <= max_num_batched_tokens)
    blackwell = compute_capability is not None and compute_capability[0] == 10 and since >= version_key("0.28")
    default_ceiling = min(max_num_seqs * 2, 1024 if blackwell else 512)
    ceiling = min(default_ceiling if max_capture_size is None else max_capture_size, max_num_batched_tokens)
    sizes = set(range(1, min(ceiling, 32) + 1)) if interactivity else {n for n in (1, 2, 4) if n <= ceiling}
    sizes |= set(range(8, min(ceiling + 1, 256), 8)) | set(range(256, ceiling + 1, 16))
    if since >= version_key("0.26") and max_num_batched_tokens <= ceiling:
        sizes.add(max_num_batched_tokens)
    if since >= version_key("0.32") and max_capture_size is None and max_num_seqs <= default_ceiling:
        sizes |= {max_num_seqs} if max_num_seqs <= max_num_batched_tokens else set()
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class CudaGraphs:
    """The CUDA graphs vLLM captures on a rank and what they are planned to take (bytes)."""

    piecewise: int  # one per capture size (mixed prefill-decode batches)
    full: int  # one per capture size up to max_num_seqs (uniform decode batches)
    largest: int  # the largest capture size
    layers: int  # layers on the rank
    moe: bool
    subtracted: bool  # whether this version takes its estimate out of the KV budget
    fitted: bool = True  # a version whose captures the per-graph cost was fitted on (0.11+)
    mode: str = "FULL_AND_PIECEWISE"  # vLLM's cudagraph_mode
    mode_reason: str = ""  # why that mode (pinned, the version's default)
    # Graphs FULL_AND_PIECEWISE would add at these sizes: the per-graph cost was fitted on captures of
    # both kinds together, so a mode with one kind keeps their cost inside its band (the safe side).
    other_mode_graphs: int = 0
    beyond_fitted_graphs: int = 0  # graphs of sizes above CUDAGRAPH_FITTED_LARGEST_SIZE

    @property
    def count(self) -> int:
        return self.piecewise + self.full

    @property
    def per_graph_bytes(self) -> int:
        dense = self.layers * CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER
        return max(CUDAGRAPH_MOE_BYTES_PER_GRAPH, dense) if self.moe else dense

    @property
    def _dense_bytes(self) -> int:
        """The dense form: the first capture and each graph's cost per layer."""
        return CUDAGRAPH_FIRST_CAPTURE_BYTES + self.count * self.layers * CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER

    @property
    def _moe_form_binds(self) -> bool:
        """A MoE model's per-graph cost is the estimate unless the dense form of as many layers is larger."""
        return self.moe and self.count * CUDAGRAPH_MOE_BYTES_PER_GRAPH >= self._dense_bytes

    @property
    def estimate_bytes(self) -> int:
        """The first capture and each graph's cost (dense); a MoE model's per graph, never below the dense form."""
        if not self.count:
            return 0
        return self.count * CUDAGRAPH_MOE_BYTES_PER_GRAPH if self._moe_form_binds else self._dense_bytes

    @property
    def error_bytes(self) -> int:
        if not self.count:
            return 0
        dense = self.layers * CUDAGRAPH_DENSE_ERROR_PER_GRAPH_LAYER
        error = self.count * (max(CUDAGRAPH_MOE_ERROR_PER_GRAPH, dense) if self.moe else dense)
        error += (self.other_mode_graphs + self.beyond_fitted_graphs) * self.per_graph_bytes
        return error if self.fitted else max(error, CUDAGRAPH_UNFITTED_ERROR_BYTES)

    def describe(self) -> str:
        if not self.count:
            return f"{self.mode_reason}: no graphs" if self.mode == "NONE" else f"{self.mode_reason}: no sizes"
        graphs = f"{self.piecewise} PIECEWISE + {self.full} FULL graphs (sizes up to {self.largest})"
        if self.mode_reason:
            graphs = f"{self.mode_reason}; {graphs}"
        if self._moe_form_binds:
            graphs += f" x {CUDAGRAPH_MOE_BYTES_PER_GRAPH / MiB:.1f} MiB (MoE, per graph: fitted on published captures)"
        else:
            graphs += (f" x {self.layers} layers x {CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER / MiB:.3f} MiB beside a "
                       f"{format_gib(CUDAGRAPH_FIRST_CAPTURE_BYTES)} first capture (fitted on published captures"
                       + ("; a MoE model of this many layers takes the dense form, the larger)" if self.moe else ")"))
        if self.other_mode_graphs:
            graphs += (f"; the band holds the {self.other_mode_graphs} graphs FULL_AND_PIECEWISE would add, "
                       "as the cost was fitted on captures of both kinds")
        if self.beyond_fitted_graphs:
            graphs += (f"; {self.beyond_fitted_graphs} graphs above size {CUDAGRAPH_FITTED_LARGEST_SIZE}, "
                       "beyond the fitted captures, count twice in the band")
        return graphs


def cuda_graphs(geometry: ModelGeometry, *, rules: VllmRules, layers: int, max_num_seqs: int,
                max_num_batched_tokens: int, compute_capability: tuple[int, int] | None = None,
                interactivity: bool = False, version: str | None = None,
                mode: GraphMode | None = None) -> CudaGraphs:
    """The graphs `mode` (FULL_AND_PIECEWISE by default) captures on one rank, and whether the version
    subtracts them. `version`: the engine's own (the rule rows do not mark every release these read),
    else the rules'."""
    version = version or rules.version
    mode = mode or graph_mode(GraphPins(), enforce_eager=False, version=version)
    sizes, decode_sizes = ((), ()) if mode.mode == "NONE" else graph_sizes(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, version=version,
        compute_capability=compute_capability, interactivity=interactivity, explicit=mode.capture_sizes,
        max_capture_size=mode.max_capture_size, gpt_oss=geometry.architecture in GPT_OSS_ARCHITECTURES,
        split=mode.split)
    v2_estimates = version_key(version) >= version_key(V2_CUDAGRAPH_ESTIMATE_SINCE)
    subtracted = rules.cudagraph_estimate_subtracted and (
        v2_estimates or not uses_v2_runner(rules, geometry.architecture))
    # One piecewise graph per size for mixed batches; one full graph per size up to max_num_seqs for
    # uniform decode batches (FULL_AND_PIECEWISE's separate decode routine, FULL_DECODE_ONLY), or per size
    # in FULL (config/compilation.py `CUDAGraphMode`; v1/cudagraph_dispatcher.py).
    decode = len(decode_sizes)
    piecewise = len(sizes) if mode.mode in ("PIECEWISE", "FULL_AND_PIECEWISE") else 0
    full = {"FULL": len(sizes), "FULL_DECODE_ONLY": decode, "FULL_AND_PIECEWISE": decode}.get(mode.mode, 0)
    other_mode_graphs = len(sizes) + decode - piecewise - full if mode.mode != "NONE" else 0
    large = [n for n in sizes if n > CUDAGRAPH_FITTED_LARGEST_SIZE]
    large_decode = sum(1 for n in decode_sizes if n > CUDAGRAPH_FITTED_LARGEST_SIZE)
    large_full = {"FULL": len(large), "FULL_DECODE_ONLY": large_decode,
                  "FULL_AND_PIECEWISE": large_decode}.get(mode.mode, 0)
    beyond = (len(large) if piecewise else 0) + large_full
    return CudaGraphs(piecewise=piecewise, full=full, other_mode_graphs=other_mode_graphs, beyond_fitted_graphs=beyond,
                      largest=sizes[-1] if sizes else 0, layers=layers, moe=bool(geometry.num_experts),
                      subtracted=subtracted, fitted=version_key(version) >= version_key(CUDAGRAPH_FITTED_SINCE),
                      mode=mode.mode, mode_reason=mode.reason if mode.pinned else "")
