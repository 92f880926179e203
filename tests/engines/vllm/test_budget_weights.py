"""Weights as vLLM loads them, not as the checkpoint stores them: gpt-oss's MXFP4 experts are re-laid
out for the MoE kernel vLLM picks on the card (Triton on Hopper, Marlin on Ampere/Ada/SM12x, FlashInfer
TRT-LLM on SM100), with padding, fp32 biases and, on Triton before 0.25, a second copy of the block
scales; vLLM's KV budget subtracts what it loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import COMPUTED, PlanRequest

MODELS = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "models"
CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def _geometry(name: str):  # type: ignore[no-untyped-def]
    return geometry_from_config(json.loads((MODELS / name / "config.json").read_text()))


def _config(name: str):  # type: ignore[no-untyped-def]
    return geometry_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


def test_gpt_oss_20b_on_h100_loads_what_vllm_019_printed() -> None:
    """vLLM 0.19.0 on an H100: "Model loading took 13.64 GiB" for a 12.82 GiB checkpoint."""
    model = resolve_model(str(MODELS / "gpt-oss-20b"))
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.19.0",
                          engine_args=("--max-model-len", "8192", "--gpu-memory-utilization", "0.95"))
    weights = next(i for i in make_plan(request).budget if i.key == "weights")
    assert abs(weights.bytes / GiB - 13.64) < 0.05
    assert weights.source == COMPUTED and "Hopper" in weights.detail and weights.error_bytes == 0


def test_the_hopper_rule_by_version() -> None:
    geometry = _geometry("gpt-oss-20b")

    def extra(version: str, tp: int = 1) -> float:
        return vb.mxfp4_as_loaded(geometry, version=version, tp=tp, pp=1, compute_capability=(9, 0)).extra / GiB

    assert round(extra("0.19.0"), 2) == 0.79  # 0.20 values padded to 64, scales kept twice
    assert round(extra("0.22.0"), 2) == 0.59  # packs of 16/32: no value padding at 2880
    assert round(extra("0.25.0"), 2) == 0.03  # loaded scales deleted ("del layer.w13_weight_scale")
    assert extra("0.19.0", tp=2) > extra("0.19.0") / 2  # 1440 per rank is rounded up to 1472


# Hand-derived bytes per expert and layer, gpt-oss (hidden H = intermediate I = 2880), TP 1. The checkpoint:
#   values  w13 2I x H/2 + w2 H x I/2 = 5760*1440 + 2880*1440 = 12,441,600
#   scales  w13 2I x H/32 + w2 H x I/32 = 5760*90 + 2880*90 =       777,600
#   biases  bf16 (2I + H) x 2 = 8640*2 =                              17,280   -> 13,236,480
# Marlin (hidden to 256 = 3072, intermediate to 128 = 2944; 4-bit values, e8m0 scales, bf16 biases):
#   5888*1536 + 3072*1472 = 13,565,952; 5888*96 + 3072*92 = 847,872; (5888 + 3072)*2 = 17,920
#   -> 14,431,744: +1,195,264
# FlashInfer TRT-LLM before 0.27 (hidden and intermediate to 256 = 3072; fp32 biases):
#   6144*1536 + 3072*1536 = 14,155,776; 6144*96 + 3072*96 = 884,736; (6144 + 3072)*4 = 36,864
#   -> 15,077,376: +1,840,896
# FlashInfer TRT-LLM from 0.27 (hidden to 256 = 3072, intermediate to 128 = 2944; fp32 biases):
#   13,565,952 + 847,872 + (5888 + 3072)*4 = 35,840 -> 14,449,664: +1,213,184
# Triton on Blackwell from 0.25 (intermediate to 64 = 2880; each row of u8 values padded to 128 bytes:
# 1440 -> 1536; transposed scales [K, N] padded to K % 8, N % 128; fp32 biases; loaded scales freed):
#   5760*1536 + 2880*1536 = 13,271,040; 96*5760 + 96*2944 = 835,584; 8640*4 = 34,560
#   -> 14,141,184: +904,704
# Experts x layers: gpt-oss-20b 32 x 24 = 768, gpt-oss-120b 128 x 36 = 4608.
MARLIN, TRTLLM_256, TRTLLM_128, TRITON_BW = 1_195_264, 1_840_896, 1_213_184, 904_704
ROPE = 4096 * 32 * 64 * 2  # vLLM's rotary table: YaRN, 4096 x 32 positions x 64, bfloat16 (vllm/budget.py rope_tables)
EXPERT_LAYERS = {"gpt-oss-20b": 768, "gpt-oss-120b": 4608}


@pytest.mark.parametrize("model", sorted(EXPERT_LAYERS))
@pytest.mark.parametrize(("cc", "version", "per_expert", "low_per_expert", "backend"), [
    ((8, 0), "0.19.0", MARLIN, MARLIN, "MARLIN"),  # A100
    ((8, 6), "0.25.0", MARLIN, MARLIN, "MARLIN"),  # RTX 3090, A10, RTX A6000
    ((8, 9), "0.33.0", MARLIN, MARLIN, "MARLIN"),  # L4, L40S, RTX 4090
    ((12, 0), "0.19.0", MARLIN, MARLIN, "MARLIN"),  # RTX 5090: Triton stops below SM110
    ((12, 0), "0.33.0", MARLIN, MARLIN, "MARLIN"),  # from 0.32 Triton runs on SM12x, ordered after Marlin
    ((10, 0), "0.19.0", TRTLLM_256, TRTLLM_256, vb.MXFP4_TRTLLM),  # B200: flashinfer-cubin installed
    ((10, 0), "0.26.0", TRTLLM_256, TRITON_BW, vb.MXFP4_TRTLLM),  # no cubin: Triton without nvcc
    ((10, 0), "0.27.0", TRTLLM_128, TRITON_BW, vb.MXFP4_TRTLLM),  # TRT-LLM intermediate to 128
    ((10, 0), "0.33.0", TRTLLM_128, TRITON_BW, vb.MXFP4_TRTLLM),
    ((11, 0), "0.32.0", TRITON_BW, TRITON_BW, "TRITON"),  # SM110: Triton before Marlin from 0.32
    ((11, 0), "0.33.0", TRITON_BW, TRITON_BW, "TRITON"),
    ((11, 0), "0.34.0", MARLIN, MARLIN, "MARLIN"),  # 0.34: Marlin first on SM110 too (oracle/mxfp4.py:445-457)
])
def test_the_layout_by_card_and_version(model: str, cc: tuple[int, int], version: str, per_expert: int,
                                        low_per_expert: int, backend: str) -> None:
    """The band spans the layouts the install may hold: the largest at its unfavourable end (extra + error),
    the smallest at its favourable end (extra - error); the plan counts the middle."""
    loaded = vb.mxfp4_as_loaded(_config(model), version=version, tp=1, pp=1, compute_capability=cc)
    assert loaded.extra + loaded.error == per_expert * EXPERT_LAYERS[model]
    assert loaded.extra - loaded.error == low_per_expert * EXPERT_LAYERS[model]
    assert loaded.backend == backend


def test_the_figures_in_gib() -> None:
    """The docs' table: gpt-oss-20b / 120b at TP 1."""
    def gib(model: str, cc: tuple[int, int], version: str) -> tuple[float, float]:
        loaded = vb.mxfp4_as_loaded(_config(model), version=version, tp=1, pp=1, compute_capability=cc)
        return round((loaded.extra + loaded.error) / GiB, 2), round(2 * loaded.error / GiB, 2)  # largest, spread

    assert gib("gpt-oss-20b", (8, 9), "0.33.0") == (0.85, 0.0)  # 917,962,752 bytes
    assert gib("gpt-oss-120b", (8, 0), "0.33.0") == (5.13, 0.0)  # 5,507,776,512
    assert gib("gpt-oss-20b", (10, 0), "0.25.0") == (1.32, 0.0)  # 1,413,808,128
    assert gib("gpt-oss-120b", (10, 0), "0.25.0") == (7.9, 0.0)  # 8,482,848,768
    assert gib("gpt-oss-20b", (10, 0), "0.33.0") == (0.87, 0.22)  # 931,725,312 - 694,812,672
    assert gib("gpt-oss-120b", (10, 0), "0.33.0") == (5.21, 1.32)  # 5,590,351,872 - 4,168,876,032


def test_marlin_at_tp2() -> None:
    """1440 per rank: intermediate 1536 (to 128), hidden 3072. Loaded 3072*1536 + 3072*768 = 7,077,888
    values, 3072*96 + 3072*48 = 442,368 scales, (3072 + 3072)*2 = 12,288 bias bytes: 7,532,544; the
    checkpoint's share 2880*1440 + 2880*720 + 2880*90 + 2880*45 + 5760*2 = 6,621,120: +911,424 x 768."""
    loaded = vb.mxfp4_as_loaded(_config("gpt-oss-20b"), version="0.33.0", tp=2, pp=1, compute_capability=(8, 9))
    assert loaded.extra == 911_424 * 768 and loaded.error == 0


def test_before_0_12_the_optional_packages_decide() -> None:
    """0.10/0.11: flashinfer-python is an extra and triton_kernels an optional package (0.11.0
    quantization/mxfp4.py:59-107): SM100 runs TRT-LLM, Triton or Marlin, SM12x Marlin or Triton. Triton
    before 0.25 keeps the loaded scales too (+777,600 a expert): 904,704 + 777,600 = 1,682,304."""
    geometry = _config("gpt-oss-20b")
    b200 = vb.mxfp4_as_loaded(geometry, version="0.10.0", tp=1, pp=1, compute_capability=(10, 0))
    assert (b200.extra + b200.error, b200.extra - b200.error) == (TRTLLM_256 * 768, MARLIN * 768)
    rtx5090 = vb.mxfp4_as_loaded(geometry, version="0.10.0", tp=1, pp=1, compute_capability=(12, 0))
    assert (rtx5090.extra + rtx5090.error, rtx5090.extra - rtx5090.error) == (1_682_304 * 768, MARLIN * 768)
    assert vb.mxfp4_as_loaded(geometry, version="0.12.0", tp=1, pp=1, compute_capability=(12, 0)).error == 0


def test_hopper_before_0_12_counts_marlin_or_triton_whichever_is_larger() -> None:
    """0.10/0.11 on an H100: Triton only where the optional triton_kernels package imports, else Marlin
    (the 0.10.1 gpt-oss-120b log ran Marlin and loaded 65.97 GiB). Marlin's layout (+1,195,264 bytes an
    expert) is larger than Triton's of 0.19 (the same layout before 0.22: 0.79 GiB for 768 experts), so
    Marlin is counted and Triton is the band's other end; from 0.12 triton_kernels is bundled: Triton."""
    geometry = _config("gpt-oss-20b")
    old = vb.mxfp4_as_loaded(geometry, version="0.10.0", tp=1, pp=1, compute_capability=(9, 0))
    new = vb.mxfp4_as_loaded(geometry, version="0.19.0", tp=1, pp=1, compute_capability=(9, 0))
    assert (old.backend, old.extra + old.error) == ("MARLIN", MARLIN * 768)
    assert old.extra - old.error == new.extra and new.backend == "TRITON" and new.error == 0
    assert vb.mxfp4_as_loaded(geometry, version="0.12.0", tp=1, pp=1, compute_capability=(9, 0)).backend == "TRITON"


def test_dense_and_other_quantizations_load_as_stored() -> None:
    assert vb.mxfp4_as_loaded(_geometry("llama-3.1-8b-instruct"), version="0.19.0", tp=1, pp=1,
                              compute_capability=(8, 9)) == vb.NOT_MXFP4


def test_gpt_oss_20b_on_rtx4090_plans_the_marlin_weights() -> None:
    model = resolve_model(str(MODELS / "gpt-oss-20b"))
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["rtx4090"]), engine_version="0.33.0",
                          engine_args=("--max-model-len", "8192"))
    weights = next(i for i in make_plan(request).budget if i.key == "weights")
    assert weights.bytes == model.weight_bytes + MARLIN * 768 + ROPE
    assert weights.source == COMPUTED and "Marlin" in weights.detail and weights.error_bytes == 0


def test_gpt_oss_20b_on_b200_carries_the_triton_fallback_in_the_band() -> None:
    model = resolve_model(str(MODELS / "gpt-oss-20b"))
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["b200"]), engine_version="0.33.0",
                          engine_args=("--max-model-len", "8192"))
    plan = make_plan(request)
    weights = next(i for i in plan.budget if i.key == "weights")
    assert weights.bytes == model.weight_bytes + (TRTLLM_128 + TRITON_BW) * 768 // 2 + ROPE
    assert weights.error_bytes == (TRTLLM_128 - TRITON_BW) * 768 // 2
    assert "TRT-LLM" in weights.detail and "TRITON where" in weights.detail and "the middle" in weights.detail
    assert plan.kv_cache_bytes_high - plan.kv_cache_bytes >= (TRTLLM_128 - TRITON_BW) * 768 // 2


def test_an_unknown_card_spans_every_layout_of_the_release() -> None:
    """A bare --gpu size has no compute capability: the band spans what any card may hold on 0.33, from
    Triton on Hopper (+64,000 an expert: the scale groups padded to 92 from 0.26, 5888*92 + 3072*92 =
    824,320 scale bytes, 12,441,600 values, 34,560 fp32 bias bytes, less the checkpoint's 13,236,480) to
    TRT-LLM on B200 (+1,213,184)."""
    loaded = vb.mxfp4_as_loaded(_config("gpt-oss-20b"), version="0.33.0", tp=1, pp=1, compute_capability=None)
    assert (loaded.extra + loaded.error, loaded.extra - loaded.error) == (1_213_184 * 768, 64_000 * 768)
    assert "not known" in loaded.rule


def test_hopper_scale_groups_padded_to_four_from_0_26() -> None:
    """0.25: 5888*90 + 3072*90 = 806,400 scale bytes (+46,080 an expert); 0.26: 92 groups (+64,000)."""
    geometry = _config("gpt-oss-20b")
    at = {v: vb.mxfp4_as_loaded(geometry, version=v, tp=1, pp=1, compute_capability=(9, 0)).extra
          for v in ("0.25.0", "0.26.0")}
    assert at == {"0.25.0": 46_080 * 768, "0.26.0": 64_000 * 768}


def test_hopper_before_0_25_keeps_the_loaded_scales_at_the_padded_size() -> None:
    """TP 2 on 0.19: 1440 per rank, created at 1472 (to 64). Values padded to 64 both ways: 1472*2944 +
    768*2880 = 6,545,408; swizzled scales 3072*90 + 3072*46 = 417,792; the kept loaded scales as created,
    2*1472*90 + 2880*46 = 397,440; fp32 biases 4*(2944 + 2880) = 23,296: 7,383,936 less the checkpoint's
    share 6,621,120 = +762,816 an expert."""
    loaded = vb.mxfp4_as_loaded(_config("gpt-oss-20b"), version="0.19.0", tp=2, pp=1, compute_capability=(9, 0))
    assert (loaded.extra, loaded.error) == (762_816 * 768, 0)


def test_only_gpt_oss_takes_the_gpt_oss_backend_list() -> None:
    """Another MXFP4 MoE model goes through vLLM's general list (0.33.0 quantization/mxfp4.py:132-149)."""
    import dataclasses
    other = dataclasses.replace(_config("gpt-oss-20b"), model_type="qwen3_moe")
    assert vb.mxfp4_as_loaded(other, version="0.33.0", tp=1, pp=1, compute_capability=(9, 0)) == vb.NOT_MXFP4
