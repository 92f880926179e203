"""Predicted vs logged KV GiB for the vLLM cases in ../shared/data/startup-logs.yaml.

For each case with a known model, GPU total, utilization and weights, we predict the
non-KV terms the engine subtracts (activation peak, non-torch memory, CUDA graphs where
that version subtracts them) with the rules of that case's vLLM version, and compare the
KV GiB that results with the engine's own figure. Weights are the engine's own
"Model loading took" figure where the checkpoint is not in profiles/ (bnb-on-the-fly,
LoRA, multimodal): the point here is the terms safe-serve has to estimate.
Prints one row per case and the median and worst absolute error.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.model import geometry_from_config
from launcher.resolve import resolve_model
from launcher.units import GiB


def qwen25(hidden: int, inter: int, layers: int, heads: int, kv: int) -> dict:
    return {"model_type": "qwen2", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": 151936,
            "max_position_embeddings": 32768}


PHI4 = {"model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
        "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352, "max_position_embeddings": 16384}
MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32064, "max_position_embeddings": 32768}


@dataclass(frozen=True)
class Case:
    id: str
    version: str
    config: dict
    total_gib: float
    utilization: float
    weights_gib: float
    max_model_len: int
    logged_kv_gib: float
    chunked_prefill: bool
    batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool = False


CASES = (
    Case("vllm-10517-rtx3090-llama31-8b-mml20000", "0.6.4", resolve_model("llama-3.1-8b").config, 23.58, 0.90,
         14.9888, 20000, 3.81, False),
    Case("vllm-10517-rtx3090-llama31-8b-mml29000-fail", "0.6.4", resolve_model("llama-3.1-8b").config, 23.58, 0.90,
         14.9888, 29000, 2.89, False),
    Case("vllm-tickertaka-colab-t4-qwen25-3b-instruct-v066", "0.6.6", qwen25(2048, 11008, 36, 16, 2), 14.56, 0.90,
         5.79, 4096, 5.79, False, enforce_eager=True),
    Case("vllm-qwen25-math-1.5b-22gib-v072-mml4096", "0.7.2", qwen25(1536, 8960, 28, 12, 2), 22.06, 0.90,
         2.88, 4096, 15.52, False),
    Case("vllm-13882-rtx4060-8gb-qwen25-7b-bnb4bit-util070-fail", "0.7.3", resolve_model("qwen2.5-7b").config,
         8.00, 0.70, 5.20, 4096, -1.05, False),
    Case("vllm-unsloth-a100-80gb-phi4-bnb4bit-lora-mml512-v082", "0.8.2", PHI4, 79.15, 0.70, 8.63, 512, 45.21,
         False, max_num_seqs=320),
    Case("vllm-unsloth-rtx3090-qwen25-0.5b-bnb4bit-lora-v0100", "0.10.0", qwen25(896, 4864, 24, 14, 2), 23.68, 0.78,
         0.52, 32768, 16.29, False, batched_tokens=32768, max_num_seqs=288),
    Case("vllm-80gb-llava-v16-mistral-7b-v0102", "0.10.2", MISTRAL, 79.19, 0.90, 14.08, 4096, 55.15, True,
         batched_tokens=16384),
)


def predict(case: Case) -> tuple[float, str]:
    geometry = geometry_from_config(case.config)
    rules, _ = vl.rules_for(case.version)
    defaults = vb.batch_defaults(nvml_total_bytes=int(case.total_gib * GiB), gpu_name="", device="cuda", world_size=1)
    if not case.chunked_prefill:
        # V0 profiled with max(max_model_len, 2048) tokens over 256 sequences.
        defaults = vb.BatchDefaults(2048, 256, "V0 engine")
    batched, seqs = vb.resolve_batch(defaults=defaults, max_model_len=case.max_model_len,
                                     pinned_batched_tokens=case.batched_tokens, pinned_num_seqs=case.max_num_seqs,
                                     chunked_prefill=case.chunked_prefill)
    activation = vb.activation_peak_bytes(geometry, batched_tokens=batched, num_seqs=min(seqs, batched), tp=1)
    graphs = 0 if case.enforce_eager or not rules.cudagraph_estimate_subtracted else vb.cudagraph_estimate_bytes(
        geometry.kv_layers)
    requested = case.total_gib * case.utilization * GiB
    kv = requested - case.weights_gib * GiB - vb.non_torch_bytes(1, 1) - activation - graphs
    return kv / GiB, f"{batched} tok, act {activation / GiB:.2f}"


def main() -> None:
    errors = []
    print(f"{'case':58} {'logged':>7} {'predicted':>9} {'error':>7}  detail")
    for case in CASES:
        predicted, detail = predict(case)
        error = predicted - case.logged_kv_gib
        errors.append(abs(error))
        print(f"{case.id[:58]:58} {case.logged_kv_gib:7.2f} {predicted:9.2f} {error:+7.2f}  {detail}")
    print(f"\nKV GiB error over {len(errors)} cases: median {statistics.median(errors):.2f} GiB, "
          f"worst {max(errors):.2f} GiB")


if __name__ == "__main__":
    main()
