"""Dtypes both engines share: `--dtype auto` resolved as each engine resolves it, and the bytes
per element of the dtypes a KV cache is stored in.

vLLM (`vllm/config/model.py:_resolve_auto_dtype`) and SGLang (`srt/configs/model_config.py`,
`_get_and_verify_dtype`, taken from vLLM) agree: keep a config dtype the GPU supports,
downcast float32 to bf16 (fp16 before Ampere), bf16 to fp16 where the GPU has no bf16.
"""

from __future__ import annotations

from launcher.model.config import ModelGeometry

__all__ = ["ELEMENT_BYTES", "auto_kv_bytes", "kv_element_bytes", "resolve_dtype"]

# torch element sizes of the dtypes a KV cache is stored in (each engine maps its own
# `--kv-cache-dtype` spellings onto these names; vLLM stores most fp8 caches as uint8).
ELEMENT_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
}


# vllm/config/model.py:2380 _FLOAT16_NOT_SUPPORTED_MODELS (vLLM 0.32.0): fp16 is numerically unstable.
FLOAT16_NOT_SUPPORTED = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical(name: str | None) -> str | None:
    """A dtype spelling as torch names it ("half" -> "float16"); None stays None."""
    return None if name is None else _ALIASES.get(name, name)


def supported_dtypes(*, compute_capability: tuple[int, int] | None, device: str) -> tuple[str, ...]:
    """`current_platform.supported_dtypes`, preferred first (vllm/platforms/cuda.py:255; CPU: bf16 first)."""
    if device == "cpu" or compute_capability is None or compute_capability >= (8, 0):
        return ("bfloat16", "float16", "float32")
    if compute_capability >= (6, 0):
        return ("float16", "float32")  # Pascal, Volta and Turing: no bf16
    return ("float32",)


def resolve_dtype(geometry: ModelGeometry, *, compute_capability: tuple[int, int] | None, device: str,
                  pinned: str | None) -> tuple[str, str]:
    """`_resolve_auto_dtype` (vllm/config/model.py:2405): keep a config dtype the platform supports,
    downcast float32 to the preferred one, else fall back to the preferred one; fp16 is never
    chosen for the models where it is unstable (Gemma 2 before Ampere runs float32)."""
    if pinned and pinned != "auto":
        return _ALIASES.get(pinned, pinned), "pinned --dtype"
    supported = [d for d in supported_dtypes(compute_capability=compute_capability, device=device)
                 if not (d == "float16" and geometry.model_type in FLOAT16_NOT_SUPPORTED)]
    preferred = supported[0]
    config = _ALIASES.get(geometry.config_dtype or "float32", geometry.config_dtype or "float32")
    if config == "float32":
        return preferred, f"config dtype float32 is downcast to {preferred}"
    if config in supported:
        return config, f"config.json dtype {config}"
    return preferred, (f"this GPU (compute capability {compute_capability[0]}.{compute_capability[1]}) has no "
                       f"{config}: the engine falls back to {preferred}" if compute_capability else
                       f"{config} not supported here: the engine falls back to {preferred}")


def auto_kv_bytes(model_dtype: str) -> int:
    """`--kv-cache-dtype auto`: the cache takes the model dtype (float32 keeps 4 bytes, else 16-bit)."""
    return 4 if model_dtype == "float32" else 2


def kv_element_bytes(value: str, spellings: dict[str, str]) -> int | None:
    """Bytes per KV element for an engine's `--kv-cache-dtype` spelling, or None when the engine's
    table (`spellings`: spelling -> torch dtype name) does not hold it."""
    torch_dtype = spellings.get(value)
    return None if torch_dtype is None else ELEMENT_BYTES[torch_dtype]
