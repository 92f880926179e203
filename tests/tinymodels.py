"""Tiny, deterministic, randomly initialised HF checkpoints for engine tests.

Each KIND is a few-MB model of a real architecture family (same config keys as
the real checkpoints) so that vLLM / SGLang load it through their normal code
paths and size the KV cache exactly as they would for the full-size model.

Usage as a library::

    from tests.tinymodels import build, KINDS
    path = build("/tmp/models", "qwen2")

CLI::

    python tests/tinymodels.py OUTDIR KIND [KIND ...]   # or KIND=all

Requirements: torch, transformers (>= 5), tokenizers, safetensors.  Nothing is
downloaded: the tokenizer is trained in-process on a generated word list.

Notes
-----
* Weights are saved as safetensors in bfloat16 and ``config.json`` carries
  ``dtype: bfloat16``; the vLLM CPU backend runs bf16 (the reference machine
  has AVX512-BF16).  Everything is seeded, so two builds give identical files.
* ``vocab_size`` is 512 for every kind; the trained byte-level BPE tokenizer
  has <= 512 entries including the special tokens.
* deepseek_v2 uses ``kv_lora_rank=512`` and ``qk_rope_head_dim=64`` because
  the vLLM CPU MLA decode kernel only supports a latent head of 576
  (``vllm/v1/attention/backends/mla/cpu_mla.py``); all layers are dense
  (``first_k_dense_replace == num_hidden_layers``).  On a non-AMX CPU vLLM
  forces block 16 for it; ``--kv-cache-dtype fp8`` starts but crashes on the
  first request.
* gpt_oss: vLLM always builds YaRN rope for it, so the YaRN keys are set as
  in the real checkpoint.  /v1/completions works; /v1/chat/completions
  returns HTTP 400 ("Token id 200008 is out of vocabulary") because vLLM
  renders gpt-oss chats with the Harmony encoding (ids >= 200000) and the
  vocabulary here is 512.
* gemma3 is the text-only ``Gemma3ForCausalLM`` (model_type gemma3_text).

* The further families (``MORE_KIND_CONFIGS``) prove the per-architecture layouts in
  ``launcher/engines/vllm/architectures.py``.  ``phimoe`` is written with the real
  checkpoints' class name ``PhiMoEForCausalLM`` (vLLM's own model); ``phimoe_tf`` keeps
  transformers 5's ``PhimoeForCausalLM``, which vLLM serves with its Transformers MoE
  backend and which fails its first request on CPU.  vLLM 0.32 cannot map the expert
  weights transformers 5 writes for ``dbrx``: the harness starts it with
  ``--load-format dummy`` (the KV cache depends on the config only).

Sizes: 1.4-3.2 MB per kind; ``all`` builds in ~20 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB_SIZE = 512

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]  # ids 0..4

# ChatML-like template (works with vLLM's chat/completions endpoint).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Shared small dims.  hidden = heads * head_dim for the dense kinds.
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _cfg_llama() -> dict[str, Any]:
    # GQA: 4 q heads, 2 kv heads, head 32.  Long context allowed (32768) so
    # the same checkpoint serves the long --max-model-len case.
    return {**_COMMON, "model_type": "llama", "max_position_embeddings": 32768}


def _cfg_qwen2() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "qwen2", "use_sliding_window": False}
    c.pop("head_dim")  # Qwen2 derives head_dim = hidden / heads = 32
    return c


def _cfg_qwen3() -> dict[str, Any]:
    return {**_COMMON, "model_type": "qwen3", "use_sliding_window": False}


def _cfg_mistral() -> dict[str, Any]:
    # Model-wide sliding window (no layer_types): every layer is SWA.
    return {**_COMMON, "model_type": "mistral", "sliding_window": 256}


def _cfg_gemma2() -> dict[str, Any]:
    # Alternating sliding (even idx) / full (odd idx), as in real Gemma-2.
    return {
        **_COMMON,
        "model_type": "gemma2",
        "sliding_window": 256,
        "query_pre_attn_scalar": 32,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _cfg_gemma3() -> dict[str, Any]:
    # Gemma-3 text-only (Gemma3ForCausalLM).  6 layers, 5:1 sliding:full
    # (sliding_window_pattern 6 -> layer 5 is full).
    return {
        **_COMMON,
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "sliding_window": 256,
        "query_pre_attn_scalar": 32,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    }


def _cfg_deepseek_v2() -> dict[str, Any]:
    c = {
        **_COMMON,
        "model_type": "deepseek_v2",
        "num_key_value_heads": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        # All layers dense: MoE block would only add weights, not KV.
        "first_k_dense_replace": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
    }
    c.pop("head_dim")
    return c


def _cfg_gpt_oss() -> dict[str, Any]:
    # Alternating sliding (even idx) / full, attention sinks, tiny MoE.
    c = {
        **_COMMON,
        "model_type": "gpt_oss",
        "head_dim": 64,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 128,
        # vLLM's gpt_oss always builds YaRN rope and needs these keys.  As in the
        # real checkpoint, max_position_embeddings = factor * original (131072);
        # vLLM 0.32 does not multiply the derived max len for YaRN.
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
    }
    return c


KIND_CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "llama": _cfg_llama,
    "qwen2": _cfg_qwen2,
    "qwen3": _cfg_qwen3,
    "mistral": _cfg_mistral,
    "gemma2": _cfg_gemma2,
    "gemma3": _cfg_gemma3,
    "deepseek_v2": _cfg_deepseek_v2,
    "gpt_oss": _cfg_gpt_oss,
}
KINDS = tuple(KIND_CONFIGS)


# --------------------------------------------------------------------------- more families
# Tiny configs of further architectures vLLM 0.32 serves (tests/engines/vllm/test_architectures.py).
# Keys are each family's own spelling (n_embd, n_head, attn_config.kv_n_heads, ...), as
# in the real checkpoints, because that is what the geometry parser must read.
_TOK = {"vocab_size": VOCAB_SIZE, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DENSE = {**_TOK, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 4, "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _cfg_qwen3_moe() -> dict[str, Any]:
    return {**_COMMON, "model_type": "qwen3_moe", "use_sliding_window": False, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1,
            "mlp_only_layers": []}


def _cfg_qwen2_moe() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "qwen2_moe", "use_sliding_window": False, "num_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64}
    c.pop("head_dim")
    return c


def _cfg_mixtral() -> dict[str, Any]:
    # Real Mixtral-8x7B-v0.1 writes "sliding_window": null.
    return {**_COMMON, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": None}


def _cfg_gemma() -> dict[str, Any]:
    # Gemma-7B: head_dim 256 != hidden / heads; tiny keeps head_dim explicit (64) != 128/4.
    return {**_COMMON, "model_type": "gemma", "head_dim": 64, "num_key_value_heads": 1,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}


def _cfg_phi3() -> dict[str, Any]:
    # Phi-3-mini-4k writes sliding_window 2047 and no layer_types: every layer slides.
    c = {**_COMMON, "model_type": "phi3", "num_key_value_heads": 4, "sliding_window": 255,
         "original_max_position_embeddings": 4096}
    c.pop("head_dim")
    return c


def _cfg_phi() -> dict[str, Any]:
    # Phi-2: partial rotary, MHA (no num_key_value_heads), served by the Transformers backend.
    return {**_DENSE, "model_type": "phi", "partial_rotary_factor": 0.5, "num_key_value_heads": None}


def _cfg_granite() -> dict[str, Any]:
    return {**_COMMON, "model_type": "granite", "embedding_multiplier": 12.0, "logits_scaling": 8.0,
            "residual_multiplier": 0.22, "attention_multiplier": 0.0078125}


def _cfg_granitemoe() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "granitemoe", "num_local_experts": 4, "num_experts_per_tok": 2,
         "embedding_multiplier": 12.0, "logits_scaling": 6.0, "residual_multiplier": 0.22,
         "attention_multiplier": 0.015625}
    c.pop("head_dim")
    return c


def _cfg_cohere() -> dict[str, Any]:
    # Command-R v01: MHA-ish GQA, no window, use_qk_norm false.
    c = {**_COMMON, "model_type": "cohere", "logit_scale": 0.0625, "tie_word_embeddings": True,
         "layer_norm_eps": 1e-5}
    c.pop("head_dim")
    return c


def _cfg_cohere2() -> dict[str, Any]:
    # Command-R7B: sliding_window 4096, 3 sliding : 1 full (layer_types from the pattern).
    c = {**_COMMON, "model_type": "cohere2", "logit_scale": 0.25, "tie_word_embeddings": True,
         "sliding_window": 256, "layer_norm_eps": 1e-5,
         "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}
    c.pop("head_dim")
    return c


def _cfg_starcoder2() -> dict[str, Any]:
    # StarCoder2-3b/7b/15b write sliding_window 4096 and no layer_types.
    c = {**_COMMON, "model_type": "starcoder2", "sliding_window": 256, "use_bias": True,
         "norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh"}
    c.pop("head_dim")
    return c


def _cfg_gpt_bigcode() -> dict[str, Any]:
    # StarCoder / SantaCoder: multi_query true -> one KV head; no num_key_value_heads key.
    return {**_TOK, "model_type": "gpt_bigcode", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_inner": 256,
            "n_positions": 4096, "multi_query": True, "tie_word_embeddings": True}


def _cfg_falcon() -> dict[str, Any]:
    # Falcon-7B: multi_query, old decoder: one KV head.
    return {**_TOK, "model_type": "falcon", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True, "alibi": False,
            "bias": False, "max_position_embeddings": 4096, "tie_word_embeddings": True}


def _cfg_falcon_ndarch() -> dict[str, Any]:
    # Falcon-40B/180B: new_decoder_architecture with num_kv_heads (multi_query is ignored).
    return {**_TOK, "model_type": "falcon", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_kv_heads": 2, "multi_query": True, "new_decoder_architecture": True, "parallel_attn": True,
            "alibi": False, "bias": False, "max_position_embeddings": 4096, "tie_word_embeddings": True}


def _cfg_gpt_neox() -> dict[str, Any]:
    # Pythia / GPT-NeoX-20B: MHA, rotary_pct 0.25.
    return {**_DENSE, "model_type": "gpt_neox", "rotary_pct": 0.25, "use_parallel_residual": True,
            "layer_norm_eps": 1e-5}


def _cfg_gptj() -> dict[str, Any]:
    return {**_TOK, "model_type": "gptj", "n_embd": 128, "n_layer": 4, "n_head": 4, "rotary_dim": 16,
            "n_positions": 4096, "n_inner": 256, "tie_word_embeddings": False}


def _cfg_olmo() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "olmo", "num_key_value_heads": 4}
    c.pop("head_dim")
    return c


def _cfg_olmo2() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "olmo2", "num_key_value_heads": 4}
    c.pop("head_dim")
    return c


def _cfg_olmo3() -> dict[str, Any]:
    # OLMo-3: 3 sliding (window 4096) : 1 full, written as layer_types.
    c = {**_COMMON, "model_type": "olmo3", "num_key_value_heads": 4, "sliding_window": 256,
         "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}
    c.pop("head_dim")
    return c


def _cfg_glm4() -> dict[str, Any]:
    # GLM-4-0414: partial rotary, GQA with head_dim.
    return {**_COMMON, "model_type": "glm4", "partial_rotary_factor": 0.5, "attention_bias": True,
            "rms_norm_eps": 1e-5}


def _cfg_deepseek_v3() -> dict[str, Any]:
    # DeepSeek-V3 / R1 / Kimi-K2 style MLA (512 + 64), q_lora, one dense layer then MoE.
    c = {**_cfg_deepseek_v2(), "model_type": "deepseek_v3", "q_lora_rank": 64, "first_k_dense_replace": 1,
         "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "routed_scaling_factor": 2.5, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
         "norm_topk_prob": True}
    return c


def _cfg_minicpm3() -> dict[str, Any]:
    # MiniCPM3-4B: MLA-like fields, but vLLM caches plain K/V of qk_nope + qk_rope (96) per head.
    return {**_DENSE, "model_type": "minicpm3", "num_key_value_heads": 4, "kv_lora_rank": 64, "q_lora_rank": 64,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "scale_emb": 12,
            "scale_depth": 1.4, "dim_model_base": 256, "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def _cfg_llama4() -> dict[str, Any]:
    # Llama-4 text: chunked local attention (chunk 8192 in Scout) on RoPE layers, every 4th
    # layer NoPE with full attention; MoE every layer.
    return {**_COMMON, "model_type": "llama4_text", "attention_chunk_size": 256, "no_rope_layers": [1, 1, 1, 0],
            "num_local_experts": 2, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
            "intermediate_size_mlp": 256, "use_qk_norm": True, "attn_temperature_tuning": True,
            "max_position_embeddings": 32768, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}


def _cfg_exaone4() -> dict[str, Any]:
    # EXAONE-4.0-32B: 3 sliding : 1 full (sliding_window_pattern "LLLG").
    return {**_COMMON, "model_type": "exaone4", "sliding_window": 256,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}


def _cfg_stablelm() -> dict[str, Any]:
    # StableLM-2: partial rotary 0.25, MHA.
    c = {**_COMMON, "model_type": "stablelm", "num_key_value_heads": 4, "partial_rotary_factor": 0.25,
         "layer_norm_eps": 1e-5}
    c.pop("head_dim")
    return c


def _cfg_ernie4_5() -> dict[str, Any]:
    return {**_COMMON, "model_type": "ernie4_5", "use_bias": False}


def _cfg_hunyuan_dense() -> dict[str, Any]:
    return {**_COMMON, "model_type": "hunyuan_v1_dense", "use_qk_norm": True}


def _cfg_bloom() -> dict[str, Any]:
    # BLOOM: ALiBi, MHA, n_head; no max_position_embeddings key at all.
    return {**_TOK, "model_type": "bloom", "hidden_size": 128, "n_layer": 4, "n_head": 4,
            "tie_word_embeddings": True}


def _cfg_opt() -> dict[str, Any]:
    return {**_TOK, "model_type": "opt", "hidden_size": 128, "ffn_dim": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "max_position_embeddings": 2048, "word_embed_proj_dim": 128,
            "do_layer_norm_before": True, "tie_word_embeddings": True}


def _cfg_gpt2() -> dict[str, Any]:
    return {**_TOK, "model_type": "gpt2", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 1024,
            "n_inner": 256, "tie_word_embeddings": True}


def _cfg_smollm3() -> dict[str, Any]:
    # SmolLM3: every 4th layer NoPE (no effect on the KV cache), GQA.
    return {**_COMMON, "model_type": "smollm3", "no_rope_layer_interval": 4, "use_sliding_window": False,
            "tie_word_embeddings": True}


def _cfg_phimoe() -> dict[str, Any]:
    # Phi-3.5-MoE writes sliding_window null... the 128k variant; mini-MoE writes 131072.
    return {**_COMMON, "model_type": "phimoe", "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": None}


def _cfg_dbrx() -> dict[str, Any]:
    # DBRX: d_model / n_heads / n_layers, KV heads in attn_config.kv_n_heads.
    return {**_TOK, "model_type": "dbrx", "d_model": 128, "n_heads": 4, "n_layers": 4, "max_seq_len": 4096,
            "attn_config": {"kv_n_heads": 1, "clip_qkv": 8, "rope_theta": 500000.0},
            "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
            "tie_word_embeddings": False}


def _cfg_seed_oss() -> dict[str, Any]:
    return {**_COMMON, "model_type": "seed_oss", "head_dim": 32}


def _cfg_glm4_moe() -> dict[str, Any]:
    # GLM-4.5 / 4.6: partial rotary, GQA, one dense layer then MoE.
    return {**_COMMON, "model_type": "glm4_moe", "partial_rotary_factor": 0.5, "n_routed_experts": 4,
            "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0, "use_qk_norm": False}


def _cfg_ernie4_5_moe() -> dict[str, Any]:
    return {**_COMMON, "model_type": "ernie4_5_moe", "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 64,
            "moe_num_shared_experts": 0, "moe_layer_start_index": 1, "use_bias": False}


def _cfg_olmoe() -> dict[str, Any]:
    c = {**_COMMON, "model_type": "olmoe", "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2}
    c.pop("head_dim")
    return c


def _cfg_nemotron() -> dict[str, Any]:
    # Nemotron-4 / Minitron: partial rotary 0.5, squared-ReLU MLP.
    return {**_COMMON, "model_type": "nemotron", "partial_rotary_factor": 0.5, "hidden_act": "relu2",
            "norm_eps": 1e-5}


def _cfg_apertus() -> dict[str, Any]:
    return {**_COMMON, "model_type": "apertus", "hidden_act": "xielu"}


def _cfg_arcee() -> dict[str, Any]:
    # Arcee AFM: ReLU^2 MLP, Llama-like attention; Transformers backend.
    return {**_COMMON, "model_type": "arcee", "hidden_act": "relu2"}


def _cfg_granitemoeshared() -> dict[str, Any]:
    c = {**_cfg_granitemoe(), "model_type": "granitemoeshared", "shared_intermediate_size": 64}
    return c


def _cfg_minimax_m2() -> dict[str, Any]:
    return {**_COMMON, "model_type": "minimax_m2", "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
            "rotary_dim": 16, "use_qk_norm": True, "qk_norm_type": "per_layer", "scoring_func": "sigmoid",
            "use_routing_bias": True, "intermediate_size": 64}


def _cfg_minimax_m2_softmax() -> dict[str, Any]:
    # Same layout with softmax routing: vLLM's CPU MoE router asserts softmax without grouped top-k
    # (fused_moe/router/cpu_router.py:238-239), so only this variant answers a request on CPU.
    return {**_cfg_minimax_m2(), "scoring_func": "softmax", "use_routing_bias": False}


def _cfg_glm() -> dict[str, Any]:
    # GLM-4-9B-0414's predecessor (GlmForCausalLM): partial rotary; Transformers backend.
    return {**_COMMON, "model_type": "glm", "partial_rotary_factor": 0.5, "attention_bias": True}


# --------------------------------------------------------------------------- hybrid state models
# Layers that keep a per-request state (Mamba, GDN, short conv) beside a few attention layers.
# Head sizes and state widths are ones vLLM's CPU kernels take (GDN heads of 128; 32 fails).
_HYB = {**_TOK, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False}
_GDN = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
_QWEN_LAYERS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def _cfg_qwen3_next() -> dict[str, Any]:
    return {**_HYB, **_GDN, "model_type": "qwen3_next", "head_dim": 64, "layer_types": _QWEN_LAYERS,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _cfg_qwen3_next_gdn32() -> dict[str, Any]:
    # GDN heads of 32: sized, then the CPU kernel refuses ("Unexpected head dim size, 32").
    return {**_cfg_qwen3_next(), "linear_key_head_dim": 32, "linear_value_head_dim": 32}


def _cfg_qwen3_5_text() -> dict[str, Any]:
    return {**_HYB, **_GDN, "model_type": "qwen3_5_text", "head_dim": 64, "layer_types": _QWEN_LAYERS,
            "mamba_ssm_dtype": "float32"}


def _cfg_qwen3_5_moe_text() -> dict[str, Any]:
    # Qwen3_5MoeForCausalLM without mamba_ssm_dtype (the SSM state then follows the conv state's dtype).
    return {**_HYB, **_GDN, "model_type": "qwen3_5_moe_text", "head_dim": 64, "layer_types": _QWEN_LAYERS,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64}


def _cfg_nemotron_h() -> dict[str, Any]:
    return {**_HYB, "model_type": "nemotron_h", "head_dim": 32, "hybrid_override_pattern": "M-M*",
            "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 32, "conv_kernel": 4,
            "expand": 2, "num_hidden_layers": 4}


def _cfg_granitemoehybrid() -> dict[str, Any]:
    return {**_HYB, "model_type": "granitemoehybrid", "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 32, "mamba_d_conv": 4,
            "mamba_expand": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64,
            "intermediate_size": 64, "position_embedding_type": "nope"}


def _cfg_falcon_h1() -> dict[str, Any]:
    return {**_HYB, "model_type": "falcon_h1", "head_dim": 32, "mamba_d_ssm": 256, "mamba_n_heads": 8,
            "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 32, "mamba_d_conv": 4, "mamba_expand": 2,
            "num_hidden_layers": 2}


def _cfg_mamba2() -> dict[str, Any]:
    return {**_TOK, "model_type": "mamba2", "hidden_size": 128, "num_hidden_layers": 4, "num_heads": 8,
            "head_dim": 32, "expand": 2, "n_groups": 1, "state_size": 32, "conv_kernel": 4,
            "tie_word_embeddings": False}


def _cfg_mamba() -> dict[str, Any]:
    return {**_TOK, "model_type": "mamba", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
            "state_size": 16, "conv_kernel": 4, "expand": 2, "tie_word_embeddings": False}


def _cfg_lfm2() -> dict[str, Any]:
    return {**_HYB, "model_type": "lfm2", "layer_types": ["conv", "conv", "full_attention", "conv"],
            "conv_L_cache": 3, "conv_dim": 128, "conv_dim_out": 128, "block_dim": 128,
            "block_auto_adjust_ff_dim": False,
            "block_ff_dim": 256}


def _cfg_zamba2() -> dict[str, Any]:
    return {**_HYB, "model_type": "zamba2", "num_hidden_layers": 4, "layers_block_type":
            ["mamba", "hybrid", "mamba", "hybrid"], "hybrid_layer_ids": [1, 3], "mamba_d_state": 32,
            "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1, "n_mamba_heads": 8, "mamba_headdim": 32,
            "num_attention_heads": 4, "num_key_value_heads": 4, "attention_head_dim": 64, "num_mem_blocks": 1,
            "use_shared_attention_adapter": False, "adapter_rank": 8}


def _cfg_jamba() -> dict[str, Any]:
    return {**_HYB, "model_type": "jamba", "attn_layer_period": 4, "attn_layer_offset": 3,
            "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 2, "num_experts_per_tok": 1,
            "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8}


def _cfg_llama_head(head: int) -> Callable[[], dict[str, Any]]:
    """Llama with 4 heads of `head` (vLLM's CPU kernels are compiled per head size)."""
    return lambda: {**_DENSE, "model_type": "llama", "num_key_value_heads": 2, "head_dim": head,
                    "hidden_size": 4 * head}


def _cfg_qwen2_moe_sw() -> dict[str, Any]:
    # use_sliding_window true: vLLM's qwen2_moe.py passes no per-layer window (every layer full).
    return {**_cfg_qwen2_moe(), "use_sliding_window": True, "sliding_window": 256, "max_window_layers": 2}


def _cfg_gemma4_text() -> dict[str, Any]:
    # Gemma 4: sliding layers of head_dim, full layers of global_head_dim (Gemma4TextConfig).
    return {**_DENSE, "model_type": "gemma4_text", "num_key_value_heads": 2, "head_dim": 32, "global_head_dim": 64,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 256, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 512,
            "num_kv_shared_layers": 0, "attention_k_eq_v": False, "final_logit_softcapping": None}


def _cfg_gemma3_swp() -> dict[str, Any]:
    # Gemma 3 as the real checkpoints write it: a config-level sliding_window and
    # sliding_window_pattern, no layer_types (CONFIG_JSON_EDITS drops the list transformers saves).
    # Pattern 3 over 6 layers: layers 2 and 5 full (Gemma3TextConfig: (i + 1) % pattern).
    cfg = {**_cfg_gemma3(), "sliding_window": 128, "sliding_window_pattern": 3}
    del cfg["layer_types"]
    return cfg


def _cfg_kimi_linear() -> dict[str, Any]:
    # Kimi-Linear as its checkpoints write it (vLLM's own KimiLinearConfig reads linear_attn_config;
    # the lists are 1-based): KDA layers 1-3, MLA layer 4 (latent 512 + 64, the CPU MLA kernel's
    # only size), dense MLP. Written as config.json only, served with --load-format dummy.
    return {**_TOK, "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
            "v_head_dim": 32, "mla_use_nope": True, "max_position_embeddings": 4096, "model_max_length": 4096,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16",
            "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 2,
                                   "head_dim": 128, "short_conv_kernel_size": 4}}


MORE_KIND_CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "qwen3_moe": _cfg_qwen3_moe,
    "qwen2_moe": _cfg_qwen2_moe,
    "mixtral": _cfg_mixtral,
    "gemma": _cfg_gemma,
    "phi3": _cfg_phi3,
    "phi": _cfg_phi,
    "granite": _cfg_granite,
    "granitemoe": _cfg_granitemoe,
    "cohere": _cfg_cohere,
    "cohere2": _cfg_cohere2,
    "starcoder2": _cfg_starcoder2,
    "gpt_bigcode": _cfg_gpt_bigcode,
    "falcon": _cfg_falcon,
    "falcon_ndarch": _cfg_falcon_ndarch,
    "gpt_neox": _cfg_gpt_neox,
    "gptj": _cfg_gptj,
    "olmo": _cfg_olmo,
    "olmo2": _cfg_olmo2,
    "olmo3": _cfg_olmo3,
    "glm4": _cfg_glm4,
    "deepseek_v3": _cfg_deepseek_v3,
    "minicpm3": _cfg_minicpm3,
    "llama4": _cfg_llama4,
    "exaone4": _cfg_exaone4,
    "stablelm": _cfg_stablelm,
    "ernie4_5": _cfg_ernie4_5,
    "hunyuan_dense": _cfg_hunyuan_dense,
    "bloom": _cfg_bloom,
    "opt": _cfg_opt,
    "gpt2": _cfg_gpt2,
    "smollm3": _cfg_smollm3,
    "phimoe": _cfg_phimoe,
    "phimoe_tf": _cfg_phimoe,  # transformers' own class name: vLLM serves it with its Transformers backend
    "dbrx": _cfg_dbrx,
    "seed_oss": _cfg_seed_oss,
    "glm4_moe": _cfg_glm4_moe,
    "ernie4_5_moe": _cfg_ernie4_5_moe,
    "olmoe": _cfg_olmoe,
    "nemotron": _cfg_nemotron,
    "apertus": _cfg_apertus,
    "arcee": _cfg_arcee,
    "granitemoeshared": _cfg_granitemoeshared,
    "minimax_m2": _cfg_minimax_m2,
    "minimax_m2_softmax": _cfg_minimax_m2_softmax,
    "glm": _cfg_glm,
    "qwen3_next": _cfg_qwen3_next,
    "qwen3_next_gdn32": _cfg_qwen3_next_gdn32,
    "qwen3_5_text": _cfg_qwen3_5_text,
    "qwen3_5_moe_text": _cfg_qwen3_5_moe_text,
    "nemotron_h": _cfg_nemotron_h,
    "granitemoehybrid": _cfg_granitemoehybrid,
    "falcon_h1": _cfg_falcon_h1,
    "mamba2": _cfg_mamba2,
    "mamba": _cfg_mamba,
    "lfm2": _cfg_lfm2,
    "zamba2": _cfg_zamba2,
    "jamba": _cfg_jamba,
    **{f"llama_h{head}": _cfg_llama_head(head) for head in (16, 40, 48)},
    "qwen2_moe_sw": _cfg_qwen2_moe_sw,
    "gemma4_text": _cfg_gemma4_text,
    "gemma3_swp": _cfg_gemma3_swp,
    "kimi_linear": _cfg_kimi_linear,
}
KIND_CONFIGS.update(MORE_KIND_CONFIGS)
KINDS = tuple(KIND_CONFIGS)
# config.json "architectures" as the real checkpoints write it, where transformers 5 names the
# class differently (Phi-3.5-MoE: "PhiMoEForCausalLM", which vLLM maps to models/phimoe.py).
ARCHITECTURE_OVERRIDE: dict[str, list[str]] = {"phimoe": ["PhiMoEForCausalLM"]}
# Keys transformers rewrites on save, restored as the real checkpoints write them.
def _gemma3_pattern_only(saved: dict[str, Any]) -> None:
    saved.pop("layer_types", None)
    saved["sliding_window_pattern"] = 3


CONFIG_JSON_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {"gemma3_swp": _gemma3_pattern_only}
# Kinds whose config.json is written as the checkpoint writes it, without weights: transformers'
# class for them saves other keys than vLLM's own config class reads (run with --load-format dummy).
CONFIG_ONLY = ("kimi_linear",)


def _words(n: int = 400) -> list[str]:
    """Deterministic pseudo-words (no randomness from the environment)."""
    onsets = ["b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "pl"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = ["", "n", "r", "s", "t", "l", "m"]
    out: list[str] = []
    i = 0
    while len(out) < n:
        a = onsets[i % len(onsets)]
        b = vowels[(i // len(onsets)) % len(vowels)]
        c = codas[(i // 7) % len(codas)]
        d = vowels[(i * 3) % len(vowels)]
        out.append(a + b + c + (d if i % 3 == 0 else ""))
        i += 1
    return out


def build_tokenizer(out_dir: str | os.PathLike[str]):
    """Train a byte-level BPE (vocab <= VOCAB_SIZE) and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    words = _words()
    corpus = [
        " ".join(words[j : j + 12]) + " . Hello , world ! 0 1 2 3 4 5 6 7 8 9 ?"
        for j in range(0, len(words), 12)
    ] + ["The quick brown fox jumps over the lazy dog .", "user assistant system"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def _make_config(kind: str):
    from transformers import AutoConfig

    raw = KIND_CONFIGS[kind]()
    model_type = raw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **raw)
    cfg.dtype = "bfloat16"
    return cfg


def build(out_root: str | os.PathLike[str], kind: str, force: bool = False) -> str:
    """Build KIND under OUT_ROOT/KIND and return that directory.

    Reuses an existing build (config.json + model.safetensors present) unless
    ``force``.
    """
    if kind not in KIND_CONFIGS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    out = Path(out_root) / kind
    if not force and (out / "config.json").exists() and (out / "model.safetensors").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    if kind in CONFIG_ONLY:
        if not force and (out / "config.json").exists():
            return str(out)
        (out / "config.json").write_text(json.dumps(KIND_CONFIGS[kind](), indent=2, sort_keys=True) + "\n")
        build_tokenizer(out)
        return str(out)

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(SEED)
    cfg = _make_config(kind)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # from_config's init is seeded above; re-init small to keep logits tame.
    with torch.no_grad():
        g = torch.Generator().manual_seed(SEED)
        for _name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
    if kind in ARCHITECTURE_OVERRIDE or kind in CONFIG_JSON_EDITS:
        saved = json.loads((out / "config.json").read_text())
        if kind in ARCHITECTURE_OVERRIDE:
            saved["architectures"] = ARCHITECTURE_OVERRIDE[kind]
        if kind in CONFIG_JSON_EDITS:
            CONFIG_JSON_EDITS[kind](saved)
        (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    build_tokenizer(out)
    return str(out)


def load_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    with open(Path(model_dir) / "config.json") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    force = "--force" in argv
    argv = [a for a in argv if a != "--force"]
    if len(argv) < 2:
        print(f"usage: {sys.argv[0]} OUTDIR KIND [KIND ...] [--force]   (KIND: {'|'.join(KINDS)}|all)")
        return 2
    out_root, kinds = argv[0], argv[1:]
    if kinds == ["all"]:
        kinds = list(KINDS)
    for k in kinds:
        print(build(out_root, k, force=force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
