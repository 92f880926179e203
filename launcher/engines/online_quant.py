"""Weights as an engine holds them after quantizing an unquantized checkpoint while loading it.

Both engines quantize the weights of their linear layers and fused experts (vLLM's LinearBase and
FusedMoE, SGLang's the same names) and leave the vocabulary embedding and the lm_head, which are not
linear layers there, in the model dtype. Which methods, versions and load peaks apply is each
engine's own rule (launcher/engines/<engine>/budget.py); this is the shared arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.model.config import ModelGeometry

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class QuantizedWeights:
    """The whole model's bytes as loaded, the quantized share, and the norms and biases counted in it."""

    loaded: int
    quantized_elements: int
    small_error: int  # norms and q/k/v biases counted among the quantized elements (bytes)


def quantized_weights(geometry: ModelGeometry, *, checkpoint_bytes: int, model_dtype: str,
                      bytes_per_element: float) -> QuantizedWeights | None:
    """The checkpoint's elements less the embedding (and an untied lm_head), at `bytes_per_element`;
    None where the checkpoint or model dtype has no known element size."""
    checkpoint_element = ELEMENT_BYTES.get(geometry.config_dtype or "bfloat16")
    model_element = ELEMENT_BYTES.get(model_dtype)
    if checkpoint_element is None or model_element is None:
        return None
    embedding = geometry.vocab_size * geometry.hidden_size * (1 if geometry.tie_word_embeddings else 2)
    quantized = max(checkpoint_bytes // checkpoint_element - embedding, 0)
    small = geometry.num_layers * (2 * geometry.hidden_size
                                   + (geometry.num_attention_heads + 2 * geometry.num_kv_heads) * geometry.head_dim)
    return QuantizedWeights(loaded=embedding * model_element + int(quantized * bytes_per_element),
                            quantized_elements=quantized, small_error=int(small * (model_element - bytes_per_element)))


def kept_layers(geometry: ModelGeometry) -> str:
    return "embedding" if geometry.tie_word_embeddings else "embedding and lm_head"
