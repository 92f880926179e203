"""SGLang's KV pool cells: bytes per token on the fullest pipeline stage, KV dtype and page size.

Cell size (`mem_cache/kv_cache_configurator.py`): `n_kv_heads_per_rank x (head_dim + v_head_dim)
x layers x dtype bytes`; MLA `(kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.engines.dtypes import auto_kv_bytes, kv_element_bytes
from launcher.engines.sglang import architectures
from launcher.model.config import ModelGeometry

# The `--kv-cache-dtype` values safe-serve sizes, as SGLang's model runner stores them.
KV_CACHE_DTYPES = {
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "fp8": "float8_e4m3fn",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "float16": "float16",
}


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str, geometry: ModelGeometry) -> tuple[int, str]:
    value = (kv_cache_dtype or "auto").lower()
    if value == "auto":
        if geometry.quantization is not None and geometry.quantization.kv_cache_scheme == "fp8":
            return 1, "checkpoint asks for an FP8 KV cache (kv_cache_quant_algo)"
        return auto_kv_bytes(model_dtype), f"kv-cache-dtype auto = model dtype {model_dtype}"
    size = kv_element_bytes(value, KV_CACHE_DTYPES)
    if size is None:
        raise ValueError(f"kv-cache-dtype {value!r} is not one safe-serve can size yet")
    return size, f"kv-cache-dtype {value}"


def cell_size_bytes(geometry: ModelGeometry, *, kv_bytes: int, tp: int, pp: int,
                    pinned: Mapping[str, Any] | None = None) -> float:
    """Bytes one token takes in the pool on the fullest pipeline stage (`architectures.cell_size_bytes`)."""
    return architectures.cell_size_bytes(architectures.layout(geometry), kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1,
                                         tp=tp, pp=pp, pinned=pinned)


def default_page_size(geometry: ModelGeometry, compute_capability: tuple[int, int] | None) -> tuple[int, str]:
    """Page size of the default attention backend (`arg_groups` attention/page-size hooks).

    Hopper: fa3, page 1. Blackwell (sm100): trtllm_mha for MHA models, page 64; MLA uses
    flashinfer, page 1. Ampere/Ada: flashinfer (MHA) or triton (MLA), page 1.
    """
    if compute_capability is not None and compute_capability[0] == 10 and geometry.mla is None:
        return 64, "trtllm_mha backend on Blackwell (page 64)"
    return 1, "default attention backend (page 1)"
