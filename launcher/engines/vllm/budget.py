"""vLLM 0.32's memory budget: what it requests, what it subtracts, what is left for KV.

Per worker (`v1/worker/gpu_worker.py`, `v1/worker/utils.py:request_memory`):

    requested = ceil(cuda_total x gpu_memory_utilization)     must be <= free at init
    kv        = requested - consumed - activation_peak - cudagraph_estimate

`consumed` is the drop in free memory from the init snapshot to the end of profiling:
the weights on this rank plus non-torch allocations made after the snapshot. The CUDA
context (and NCCL buffers with TP) is taken before the snapshot: it only tightens the
startup check. The constants below are estimates; each names where it comes from, and
`launcher.calibration` replaces them with what the engine measured on the same key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.model import ModelGeometry
from launcher.units import GiB, MiB

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py Field(default=0.92)

# CUDA context + torch before the init snapshot. vLLM 0.10.2 on an idle 80 GB card printed
# "Free memory on device (78.66/79.19 GiB) on startup": 0.53 GiB gone before weights.
CUDA_CONTEXT_BYTES = 544 * MiB
# NCCL and custom all-reduce buffers per rank with tensor/pipeline parallelism.
NCCL_BYTES = 320 * MiB
# Non-torch memory that appears after the snapshot (cuBLAS workspaces, allocator slack).
# Logs: 0.03-0.13 GiB on one GPU (T4, 4060, A100, 3090), 0.34-0.43 GiB per rank at TP 4.
NON_TORCH_BYTES_TP1 = 160 * MiB
NON_TORCH_BYTES_TP = 400 * MiB
# CUDA graphs (PIECEWISE+FULL capture, sizes up to 512): "Graph capturing finished ...
# took 0.67 GiB" for a 32-layer 7B, 0.55 GiB for a 24-layer 0.5B. A fixed part plus per layer.
CUDAGRAPH_BASE_BYTES = 256 * MiB
CUDAGRAPH_PER_LAYER_BYTES = int(13.5 * MiB)


# Expected errors of the estimates above (+/-), from the published logs behind each.
# CUDA total where neither the catalog nor NVML's v2 reserve knows it: NVML total - 2 %
# with published totals 1.1-2.9 % below NVML, so +/- 0.9 % of the NVML total.
CUDA_TOTAL_ERROR_FRACTION = 0.009
NON_TORCH_ERROR_BYTES = 256 * MiB  # logs: 0.03-0.43 GiB against 0.16/0.39 GiB estimates
CONTEXT_ERROR_BYTES = 128 * MiB  # CUDA context + torch before the snapshot: 0.45-0.62 GiB seen
CUDAGRAPH_ERROR_FRACTION = 0.5  # vLLM measures its graphs when profiling; ours is a fit on few logs
ACTIVATION_ERROR_FRACTION = 0.25  # profile-run peak vs our shape formula (bench/startup_logs.py)


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    reason: str


def batch_defaults(*, nvml_total_bytes: int | None, gpu_name: str, device: str, world_size: int) -> BatchDefaults:
    """`EngineArgs.get_batch_defaults` for `vllm serve` (arg_utils.py:2894)."""
    if device == "cpu":
        return BatchDefaults(2048 * world_size, 128 * world_size, "CPU default for vllm serve (2048 x ws / 128 x ws)")
    total = nvml_total_bytes or 0
    if total >= 160 * GiB:
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


# The sampler's peak in "fp32 logits copies" (logits, probabilities, log-probs, sort buffers).
# Fitted on five published profiles where the sampler dominates: Qwen2.5 1.5B/3B/7B at
# 256 x 151,936 (1.40-1.42 GiB), Phi-4 at 320 x 100,352 (1.16 GiB), Qwen2.5-0.5B at
# 288 x 151,936 (1.61 GiB): 9.4-9.9 copies.
SAMPLER_LOGIT_COPIES = 9.5


def activation_peak_bytes(geometry: ModelGeometry, *, batched_tokens: int, num_seqs: int, tp: int,
                          act_dtype_bytes: int = 2) -> int:
    """Transient peak of the profile run: the larger of the forward pass and the sampler.

    The two run one after the other, so their peaks do not add. Forward: for every token
    the MLP holds gate+up (2 x intermediate) and its output, the attention block ~3 x hidden
    (Llama-3.1-8B: 2.06 GiB at 20,000 tokens and 2.99 GiB at 29,000, logged 2.07 and 2.99).
    Sampler: `SAMPLER_LOGIT_COPIES` fp32 rows of the vocabulary per sequence.
    """
    intermediate = geometry.intermediate_size or 4 * geometry.hidden_size
    moe = geometry.text_config.get("moe_intermediate_size")
    if geometry.num_experts and geometry.experts_per_token and isinstance(moe, int) and moe > 0:
        intermediate = moe * geometry.experts_per_token
    per_token = (3 * intermediate // max(tp, 1) + 3 * geometry.hidden_size) * act_dtype_bytes
    forward = batched_tokens * per_token
    sampler = int(num_seqs * geometry.vocab_size * 4 * SAMPLER_LOGIT_COPIES)
    return max(forward, sampler)


def cudagraph_estimate_bytes(kv_layers_on_rank: int) -> int:
    return CUDAGRAPH_BASE_BYTES + CUDAGRAPH_PER_LAYER_BYTES * kv_layers_on_rank


def context_bytes(tp: int, pp: int) -> int:
    """Memory a worker holds before vLLM's init snapshot (outside the budget)."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)


def non_torch_bytes(tp: int, pp: int) -> int:
    return NON_TORCH_BYTES_TP if tp * pp > 1 else NON_TORCH_BYTES_TP1
