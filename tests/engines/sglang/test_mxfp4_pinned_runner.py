"""A pinned --moe-runner-backend or --quantization on gpt-oss's MXFP4 checkpoint in SGLang: the layout the
pinned runner holds (launcher/engines/sglang/budget.py `mxfp4_as_loaded`), SGLang's own refusals
(`mxfp4_runner_refusal`), and the card's default layout with a band of as much where the runner's layout is
not derived.

gpt-oss-20b: E = 32, H = I = 2880, 24 layers. The checkpoint per expert and layer: values 5760 x 1440 +
2880 x 1440 = 12,441,600, scales 5760 x 90 + 2880 x 90 = 777,600, bf16 biases (5760 + 2880) x 2 = 17,280:
13,236,480. Upcast to bf16 (I padded to 64: 2880 stays): 2 x (5760 x 2880 + 2880 x 2880) = 49,766,400 plus
bf16 biases 17,280 = 49,783,680 (3.76x): +36,547,200 an expert, x 768 = 28,068,249,600 B (26.14 GiB).
"""

from __future__ import annotations

import pytest

from launcher.common.errors import WontFit
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import rules as sr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

GPT_OSS_20B = resolve_model("gpt-oss-20b")
DEQUANTIZED_EXTRA = 36_547_200 * 768  # 28,068,249,600
# The defaults (tests/engines/sglang/test_mxfp4_weights.py): sm89 triton_kernel, sm90 swizzled triton_kernel.
RTX4090_EXTRA = 24 * (32 * (5760 + 2880) * 2 + 16_588_800 + 8_294_400)  # 610,467,840
H100_EXTRA = 24 * (5_898_240 + 2_949_120 + 17_334_272 + 9_043_968 + 552_960)  # 858,685,440


def _rule(cc: tuple[int, int], runner: str | None = None, quantization: str | None = None,
          version: str = "0.5.23") -> sb.Mxfp4AsLoaded:
    loaded = sb.mxfp4_as_loaded(GPT_OSS_20B.geometry, version=version, tp=1, pp=1, compute_capability=cc,
                                moe_runner_backend=runner, quantization=quantization)
    assert loaded is not None
    return loaded


@pytest.mark.parametrize("cc", [(8, 9), (9, 0)])
def test_triton_upcasts_the_experts_to_bf16(cc: tuple[int, int]) -> None:
    loaded = _rule(cc, "triton")
    assert (loaded.extra_bytes, loaded.error_bytes) == (DEQUANTIZED_EXTRA, 0)
    assert "upcast to bf16" in loaded.rule


def test_triton_kernel_pinned_is_the_default() -> None:
    assert _rule((8, 9), "triton_kernel").extra_bytes == RTX4090_EXTRA
    assert _rule((9, 0), "triton_kernel") == _rule((9, 0))


def test_marlin_on_sm89_is_refused_and_on_sm90_not_derived() -> None:
    refusal = sb.mxfp4_runner_refusal(GPT_OSS_20B.geometry, version="0.5.23", moe_runner_backend="marlin",
                                      compute_capability=(8, 9))
    assert refusal == ("MXFP4 Marlin requires SM90+.", "sglang/srt/layers/quantization/mxfp4.py:655 (SGLang 0.5.23)")
    assert sb.mxfp4_runner_refusal(GPT_OSS_20B.geometry, version="0.5.23", moe_runner_backend="marlin",
                                   compute_capability=(9, 0)) is None
    hopper = _rule((9, 0), "marlin")  # the default layout, +/- as much
    assert (hopper.extra_bytes, hopper.error_bytes) == (H100_EXTRA, H100_EXTRA) and "not derived" in hopper.rule


def test_flashinfer_mxfp4_on_sm89_is_refused() -> None:
    refusal = sb.mxfp4_runner_refusal(GPT_OSS_20B.geometry, version="0.5.23", moe_runner_backend="flashinfer_mxfp4",
                                      compute_capability=(8, 9))
    assert refusal == ("moe_runner_backend=flashinfer_mxfp4 requires SM90, SM100, or SM120.",
                       "sglang/srt/layers/quantization/mxfp4.py:439 (SGLang 0.5.23)")


def test_the_plan_refuses_marlin_on_an_rtx4090() -> None:
    with pytest.raises(WontFit) as caught:
        make_plan(PlanRequest(model=GPT_OSS_20B, engine="sglang", gpus=hypothetical_gpus(["rtx4090"]),
                              engine_version="0.5.23", engine_args=("--moe-runner-backend", "marlin")))
    assert "SGLang refuses this at start: MXFP4 Marlin requires SM90+." in caught.value.message
    assert caught.value.exit_code == 78


def test_pinned_quantization_dequantizes_on_sm80_to_sm90_from_0_5_9() -> None:
    """`cfg.quantization is None` keeps triton_kernel (gpt_oss.py:104; server_args.py:1393 in 0.5.9)."""
    assert _rule((9, 0), quantization="mxfp4").extra_bytes == DEQUANTIZED_EXTRA
    assert _rule((8, 9), quantization="mxfp4").extra_bytes == DEQUANTIZED_EXTRA
    assert _rule((9, 0), quantization="mxfp4", version="0.5.8") == _rule((9, 0), version="0.5.8")
    assert _rule((10, 0), quantization="mxfp4") == _rule((10, 0))  # sm100: flashinfer_mxfp4 first
    assert _rule((9, 0), "triton_kernel", quantization="mxfp4") == _rule((9, 0))  # a pinned runner stays


def test_the_plan_on_an_h100_with_quantization_pinned() -> None:
    plan = make_plan(PlanRequest(model=GPT_OSS_20B, engine="sglang", gpus=hypothetical_gpus(["h100"]),
                                 engine_version="0.5.23", engine_args=("--quantization", "mxfp4")))
    weights = plan.item("weights")
    assert weights is not None and weights.bytes == 13_761_264_768 + DEQUANTIZED_EXTRA
    assert "--quantization pinned" in weights.detail


def test_the_flag_is_a_calibration_key() -> None:
    assert "--moe-runner-backend" in sr.CALIBRATION_KEY_FLAGS
    assert sr.pinned_flags(("--moe-runner-backend", "triton"))["--moe-runner-backend"] == "triton"


def test_the_runner_refusals_by_release_and_major() -> None:
    """is_sm90/100/120_supported test the major exactly (0.5.13 utils/common.py:282-296): Marlin runs on sm90
    only in 0.5.12-0.5.13 ("requires Hopper/SM90 or above", mxfp4.py:564), sm90/sm120 in 0.5.14-0.5.16
    (:521), sm90/100/120 from 0.5.17 (:560); flashinfer_mxfp4 on sm90/sm100 until 0.5.16 (:413, :359), plus
    sm120 from 0.5.17 (:370)."""
    geometry = resolve_model("gpt-oss-20b").geometry

    def refused(runner: str, cc: tuple[int, int], version: str) -> bool:
        return sb.mxfp4_runner_refusal(geometry, version=version, moe_runner_backend=runner,
                                       compute_capability=cc) is not None

    assert not refused("marlin", (10, 0), "0.5.11")  # no such check yet
    assert refused("marlin", (10, 0), "0.5.12") and refused("marlin", (12, 0), "0.5.13")
    assert not refused("marlin", (12, 0), "0.5.14") and refused("marlin", (10, 0), "0.5.16")
    assert not refused("marlin", (10, 0), "0.5.17") and refused("marlin", (11, 0), "0.5.23")
    assert refused("flashinfer_mxfp4", (12, 0), "0.5.16") and not refused("flashinfer_mxfp4", (12, 0), "0.5.17")
    assert refused("flashinfer_mxfp4", (8, 9), "0.5.12") and not refused("flashinfer_mxfp4", (10, 0), "0.5.12")
