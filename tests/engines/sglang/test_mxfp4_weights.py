"""gpt-oss's MXFP4 experts as SGLang holds them after loading, not as the checkpoint stores them: the
MoE kernels of each card re-lay them out before SGLang reads the memory left for its pool (A), so what
they hold beyond the checkpoint's share shrinks the pool by as much (launcher/engines/sglang/budget.py,
`mxfp4_as_loaded`; docs/engine-versions.md, "gpt-oss MXFP4 weights as loaded (SGLang)").

The expected figures are worked out by hand from the layout rules. gpt-oss-20b: E = 32 experts, H = 2880,
I = 2880, 24 layers. Its checkpoint holds per layer:
  gate_up blocks 32 x 5760 x 1440 = 265,420,800   scales 32 x 5760 x 90 = 16,588,800   bias bf16 368,640
  down blocks    32 x 2880 x 1440 = 132,710,400   scales 32 x 2880 x 90 =  8,294,400   bias bf16 184,320
  = 423,567,360 B per layer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.engines.sglang import budget as sb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import COMPUTED, Plan, PlanRequest

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
GPT_OSS_20B = resolve_model("gpt-oss-20b")
GPT_OSS_120B = geometry_from_config(json.loads((CONFIGS / "gpt-oss-120b.json").read_text()))
LAYERS = 24
# Biases turned fp32 on triton_kernels (mxfp4.py:1049-1053): 32 x (5760 + 2880) x 2 more bytes per layer.
FP32_BIASES = 32 * (5760 + 2880) * 2  # 552,960
# sm80-89, 0.5.23: StridedLayout values keep their size; convert_layout copies the scales, and the loaded
# scales stay registered: 16,588,800 + 8,294,400 more per layer.
RTX4090_EXTRA = LAYERS * (FP32_BIASES + 16_588_800 + 8_294_400)  # 610,467,840 = 582.2 MiB
# sm90, 0.5.23: values [K/2, N] padded to 64 both ways: gate_up 32 x 5760 x 1472 (+5,898,240), down
# 32 x 2880 x 1472 (+2,949,120); scales K/32 padded to 2944 / 32 = 92, rows to 256, kept beside the loaded
# ones: 32 x 5888 x 92 = 17,334,272 and 32 x 3072 x 92 = 9,043,968.
H100_EXTRA = LAYERS * (5_898_240 + 2_949_120 + 17_334_272 + 9_043_968 + FP32_BIASES)  # 858,685,440 = 818.9 MiB
# The value padding vLLM 0.33's vendored triton_kernels does not do (packs of 16 x 32 only): the error.
H100_ERROR = LAYERS * (5_898_240 + 2_949_120)  # 212,336,640 = 202.5 MiB
# sm100, 0.5.23: H padded to 3072, I to 2944 (128); gate_up 32 x 5888 x 1536 = 289,406,976, scales
# 32 x 5888 x 96 = 18,087,936, bias fp32 32 x 5888 x 4 = 753,664; down 32 x 3072 x 1472 = 144,703,488,
# scales 32 x 3072 x 92 = 9,043,968, bias fp32 32 x 3072 x 4 = 393,216; alpha, beta, limit 3 x 32 x 4 = 384.
B200_LAYER = 289_406_976 + 18_087_936 + 753_664 + 144_703_488 + 9_043_968 + 393_216 + 384  # 462,389,632
B200_EXTRA = LAYERS * (B200_LAYER - 423_567_360)  # 931,734,528 = 888.6 MiB
# sm120, 0.5.23: the same padded shapes, biases kept bf16 (376,832 + 196,608), 4 x 32 x 4 = 512 B of fp32.
RTX5090_LAYER = 289_406_976 + 18_087_936 + 376_832 + 144_703_488 + 9_043_968 + 196_608 + 512  # 461,816,320
RTX5090_EXTRA = LAYERS * (RTX5090_LAYER - 423_567_360)  # 917,975,040 = 875.4 MiB


def _rule(cc: tuple[int, int] | None, version: str = "0.5.23", tp: int = 1,
          geometry: object = None) -> sb.Mxfp4AsLoaded | None:
    return sb.mxfp4_as_loaded(geometry or GPT_OSS_20B.geometry, version=version, tp=tp, pp=1,  # type: ignore[arg-type]
                              compute_capability=cc)


@pytest.mark.parametrize(("cc", "extra", "error", "words"), [
    ((8, 9), RTX4090_EXTRA, 0, "block scales copied"),
    ((8, 0), RTX4090_EXTRA, 0, "triton_kernels (sm80-sm89)"),
    ((9, 0), H100_EXTRA, H100_ERROR, "Hopper"),
    ((10, 0), B200_EXTRA, 0, "TRT-LLM MoE (sm100): hidden padded to 3072, intermediate to 2944"),
    ((12, 0), RTX5090_EXTRA, 0, "CUTLASS MoE (sm120)"),
])
def test_gpt_oss_20b_by_card(cc: tuple[int, int], extra: int, error: int, words: str) -> None:
    """`extra` is the larger layout, `error` how much smaller the other may be: the band spans both, the
    larger at its unfavourable end (extra_bytes + error_bytes), the smaller at its favourable end."""
    rule = _rule(cc)
    assert rule is not None
    assert (rule.extra_bytes + rule.error_bytes, rule.extra_bytes - rule.error_bytes) == (extra, extra - error)
    assert words in rule.rule


def test_gpt_oss_120b_on_hopper() -> None:
    """128 experts, 36 layers: four times 20b's experts per layer."""
    rule = _rule((9, 0), geometry=GPT_OSS_120B)
    assert rule is not None and rule.extra_bytes + rule.error_bytes == 36 * 4 * (H100_EXTRA // LAYERS)  # 4.80 GiB


def test_tensor_parallel_pads_the_rank_share() -> None:
    """TP 2 on an H100: I / 2 = 1440 is created as 1472 (64). Per layer: values 32 x 2944 x 1472 =
    138,674,176 and 32 x 2880 x 768 = 70,778,880; loaded scales 32 x 2944 x 90 = 8,478,720 and
    32 x 2880 x 46 = 4,239,360; swizzled 32 x 3072 x 92 = 9,043,968 and 32 x 3072 x 48 = 4,718,592; fp32
    biases 376,832 + 368,640: 236,679,168 against half the checkpoint's 423,567,360."""
    rule = _rule((9, 0), tp=2)
    assert rule is not None and rule.extra_bytes + rule.error_bytes == LAYERS * (236_679_168 - 423_567_360 // 2)


def test_by_version() -> None:
    # Before 0.5.18 (triton_kernels.matmul_ogs) the strided scale "layout" was the loaded tensor itself.
    assert _rule((8, 9), version="0.5.10").extra_bytes == LAYERS * FP32_BIASES  # type: ignore[union-attr]
    # 0.5.18: no K padding of the Hopper scales (90 stays 90): 32 x 5888 x 90 + 32 x 3072 x 90.
    hopper_0518 = LAYERS * (5_898_240 + 2_949_120 + 16_957_440 + 8_847_360 + FP32_BIASES)
    at_0518 = _rule((9, 0), version="0.5.18")
    assert at_0518 is not None and at_0518.extra_bytes + at_0518.error_bytes == hopper_0518
    # sm100 before 0.5.17 pads I to 256 (3072): 32 x 6144 x 1536 + 32 x 6144 x 96 + 32 x 6144 x 4 +
    # 32 x 3072 x 1536 + 32 x 3072 x 96 + 32 x 3072 x 4 + 384 = 482,476,416 per layer.
    assert _rule((10, 0), version="0.5.10").extra_bytes == LAYERS * (482_476_416 - 423_567_360)  # type: ignore[union-attr]
    # sm120 before 0.5.17 ran triton_kernel / marlin: not derived, carried with an error of as much.
    old = _rule((12, 0), version="0.5.16")
    assert old is not None and old.extra_bytes == old.error_bytes == RTX5090_EXTRA and "not derived" in old.rule


def test_a_card_not_known_spans_every_layout() -> None:
    """A bare --gpu size (no capability) or sm110: from the smallest layout of the cards SGLang runs (sm80-89,
    RTX4090_EXTRA) to the largest, triton_kernels' Blackwell layouts with the loaded scales kept. Per layer:
    values 32 x 5760 x 1536 + 32 x 2880 x 1536 = 424,673,280 (rows of 1440 bytes to 1536); scales
    32 x (96 x 5760 + 96 x 2944) = 26,738,688 (K 90 to 96, N 2880 to 2944); kept 32 x (5760 x 90 + 2880 x 90) =
    24,883,200; fp32 biases 32 x 8640 x 4 = 1,105,920: 477,401,088, 53,833,728 beyond the checkpoint's."""
    unknown = _rule(None)
    assert unknown is not None and "not known" in unknown.rule
    assert (unknown.extra_bytes + unknown.error_bytes, unknown.extra_bytes - unknown.error_bytes) == (
        LAYERS * 53_833_728, RTX4090_EXTRA)
    # sm110 with an NVIDIA driver >= 595 runs `triton` (0.5.10+), which upcasts the experts to bf16:
    # 49,783,680 B an expert (test_mxfp4_pinned_runner.py), 32 x 49,783,680 - 423,567,360 a layer beyond.
    sm110 = _rule((11, 0))
    assert sm110 is not None
    assert (sm110.extra_bytes + sm110.error_bytes, sm110.extra_bytes - sm110.error_bytes) == (
        LAYERS * (32 * 49_783_680 - 423_567_360), RTX4090_EXTRA)
    before = _rule((11, 0), version="0.5.9")
    assert before is not None and before.extra_bytes + before.error_bytes < LAYERS * 60_000_000


def test_where_the_rule_does_not_apply() -> None:
    assert _rule((7, 5)) is None  # SGLang's MXFP4 code needs sm80
    assert _rule((9, 0), geometry=resolve_model("llama-3.1-8b").geometry) is None
    unquantized = dataclasses.replace(GPT_OSS_20B.geometry, quantization=None)
    assert _rule((9, 0), geometry=unquantized) is None


def _plan(gpu: str, monkeypatch: pytest.MonkeyPatch | None = None) -> Plan:
    if monkeypatch is not None:
        monkeypatch.setattr(sb, "mxfp4_as_loaded", lambda *a, **k: None)
    # The engine's own pool (no --max-total-tokens cap): what these tests follow is SGLang's arithmetic.
    return make_plan(PlanRequest(model=GPT_OSS_20B, engine="sglang", gpus=hypothetical_gpus([gpu]),
                                 engine_version="0.5.23", cap_uncertain_pool=False))


@pytest.mark.parametrize(("gpu", "extra", "error"), [
    ("rtx4090", RTX4090_EXTRA, 0), ("h100", H100_EXTRA, H100_ERROR), ("b200", B200_EXTRA, 0),
])
def test_the_plan_counts_it_with_the_weights(gpu: str, extra: int, error: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights row is the checkpoint's 13,761,264,768 B + the extra; the pool shrinks by the extra
    (A alone moves: the fraction is set before the weights), the band widens by the error."""
    plan = _plan(gpu)
    weights = plan.item("weights")
    middle = extra - error // 2  # the plan counts the middle of the two layouts; the band spans both
    extra, error = middle, extra - middle
    assert weights is not None and weights.bytes == 13_761_264_768 + extra and weights.source == COMPUTED
    assert f"{extra / 2**20:+.0f} MiB beyond the checkpoint's share" in weights.detail
    assert weights.error_bytes == error
    before = _plan(gpu, monkeypatch)
    assert plan.engine_figures == before.engine_figures  # same --mem-fraction-static
    cell = plan.kv_cache_bytes / plan.kv_cache_tokens
    page = plan.block_size or 1
    assert abs((before.kv_cache_tokens - plan.kv_cache_tokens) - extra / cell) <= page + 1
    widened = ((plan.kv_cache_bytes_high - plan.kv_cache_bytes_low)
               - (before.kv_cache_bytes_high - before.kv_cache_bytes_low))
    assert abs(widened - 2 * error) <= 2 * (page + 1) * cell
