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

Sizes: 1.4-3.2 MB per kind; ``all`` builds in ~6 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

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

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(SEED)
    cfg = _make_config(kind)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # from_config's init is seeded above; re-init small to keep logits tame.
    with torch.no_grad():
        g = torch.Generator().manual_seed(SEED)
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
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
