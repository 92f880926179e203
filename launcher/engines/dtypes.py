"""The model dtype both engines run with: `--dtype auto` resolved as each engine resolves it.

vLLM (`vllm/config/model.py:_resolve_auto_dtype`) and SGLang (`srt/configs/model_config.py`,
`_get_and_verify_dtype`, taken from vLLM) agree: keep a config dtype the GPU supports,
downcast float32 to bf16 (fp16 before Ampere), bf16 to fp16 where the GPU has no bf16.
"""

from __future__ import annotations

from launcher.model import ModelGeometry

__all__ = ["resolve_dtype"]


def resolve_dtype(geometry: ModelGeometry, *, compute_capability: tuple[int, int] | None, device: str,
                  pinned: str | None) -> tuple[str, str]:
    """`_resolve_auto_dtype`: keep a supported config dtype, float32 -> bf16, bf16 -> fp16 pre-Ampere."""
    if pinned and pinned != "auto":
        return {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(pinned, pinned), \
            "pinned --dtype"
    supports_bf16 = device == "cpu" or compute_capability is None or compute_capability >= (8, 0)
    preferred = "bfloat16" if supports_bf16 else "float16"
    config = geometry.config_dtype or "float32"
    if config in ("float32", "float"):
        return preferred, f"config dtype {config} is downcast to {preferred}"
    if config == "bfloat16" and not supports_bf16:
        return "float16", "this GPU has no bf16 (compute capability < 8.0): vLLM falls back to float16"
    return config, f"config.json dtype {config}"
