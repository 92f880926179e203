"""A pinned `--moe-backend` (vLLM 0.19+) or VLLM_MXFP4_USE_MARLIN (0.10-0.23) decides gpt-oss's MXFP4
expert layout: the plan counts that backend's layout with no band for the others, refuses a backend whose
kernel does not run on the card with vLLM's own message, and keeps the largest derived layout (band down to
the checkpoint's) for a backend whose layout is not derived here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.common.errors import WontFit
from launcher.engines.checks_common import CheckInput
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import rules as vr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import COMPUTED, PlanRequest

MODELS = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "models"

# gpt-oss-20b: H = I = 2880, 32 experts x 24 layers = 768, TP 1. Per expert and layer, beyond the
# checkpoint's 13,236,480 bytes (values 12,441,600 + scales 777,600 + bf16 biases 17,280):
# Marlin (hidden to 256 = 3072, intermediate to 128 = 2944; 4-bit values, e8m0 scales, bf16 biases):
#   5888*1536 + 3072*1472 = 13,565,952; 5888*96 + 3072*92 = 847,872; (5888 + 3072)*2 = 17,920
#   -> 14,431,744: +1,195,264 (x 768 = 917,962,752 bytes, 0.85 GiB)
# TRT-LLM from 0.27 (hidden to 256, intermediate to 128, fp32 biases): 13,565,952 + 847,872 + 8960*4 = 35,840
#   -> 14,449,664: +1,213,184
# Triton on Hopper from 0.26 (0.33): values mT then packs of 16 x 32: [2880/16.., ] 5760 x 1440 and
#   2880 x 1440 keep their size (1440 % 16 = 0, 5760 % 32 = 0, 2880 % 32 = 0): 12,441,600; scales: the 90
#   groups padded to 92 (a multiple of 4 on sm90 from 0.26), rows padded to 256: 5888*92 + 3072*92 = 824,320;
#   fp32 biases 8640*4 = 34,560 -> 13,300,480: +64,000
MARLIN, TRTLLM_128, TRITON_HOPPER = 1_195_264, 1_213_184, 64_000
EXPERT_LAYERS = 768
ROPE = 4096 * 32 * 64 * 2  # vLLM's rotary table: YaRN, 4096 x 32 positions x 64, bfloat16 (vllm/budget.py rope_tables)


def _geometry():  # type: ignore[no-untyped-def]
    return geometry_from_config(json.loads((MODELS / "gpt-oss-20b" / "config.json").read_text()))


def _plan(gpu: str, version: str, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    model = resolve_model(str(MODELS / "gpt-oss-20b"))
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus([gpu]), engine_version=version,
                          engine_args=("--max-model-len", "8192", *args), engine_env=env or {})
    return model, make_plan(request)


def test_the_default_triton_layout_on_hopper() -> None:
    loaded = vb.mxfp4_as_loaded(_geometry(), version="0.33.0", tp=1, pp=1, compute_capability=(9, 0))
    assert (loaded.backend, loaded.extra, loaded.error) == ("TRITON", TRITON_HOPPER * EXPERT_LAYERS, 0)


def test_moe_backend_marlin_on_h100_counts_marlin() -> None:
    model, plan = _plan("h100", "0.33.0", "--moe-backend", "marlin")
    weights = next(i for i in plan.budget if i.key == "weights")
    assert weights.bytes == model.weight_bytes + MARLIN * EXPERT_LAYERS + ROPE  # + 917,962,752 (0.85 GiB)
    assert weights.error_bytes == 0 and weights.source == COMPUTED
    assert "--moe-backend marlin" in weights.detail and "Marlin" in weights.detail
    _, default = _plan("h100", "0.33.0")
    # 768 x (1,195,264 - 64,000) = 868,810,752 bytes fewer for the KV cache than the default Triton layout.
    assert default.kv_cache_bytes - plan.kv_cache_bytes == pytest.approx((MARLIN - TRITON_HOPPER) * 768, abs=64 << 20)


def test_moe_backend_spellings() -> None:
    """vLLM lower-cases and turns '-' into '_' (engine/arg_utils.py:1806)."""
    loaded = vb.mxfp4_as_loaded(_geometry(), version="0.33.0", tp=1, pp=1, compute_capability=(9, 0),
                                moe_backend="Flashinfer-TRTLLM")
    assert loaded.backend == vb.MXFP4_TRTLLM
    assert vb.normalized_moe_backend("auto") is None


def test_moe_backend_triton_on_rtx4090_is_refused() -> None:
    """The OAI Triton kernels run on 9.0 <= cc < 13.0 (0.32+): SM89 fails `_supports_current_device`, and
    `_return_or_raise` raises (oracle/mxfp4.py:611 in 0.33.0, :260 in 0.19.0)."""
    with pytest.raises(WontFit) as caught:
        _plan("rtx4090", "0.33.0", "--moe-backend", "triton")
    assert ("Mxfp4 MoE backend 'TRITON' does not support the deployment configuration since kernel does not "
            "support current device cuda.") in caught.value.message
    assert "oracle/mxfp4.py:611 (vLLM 0.33.0)" in caught.value.message
    assert caught.value.exit_code == 78
    refusal = vb.mxfp4_backend_refusal(_geometry(), version="0.19.0", moe_backend="triton", compute_capability=(8, 9))
    assert refusal is not None and refusal[1].endswith("oracle/mxfp4.py:260 (vLLM 0.19.0)")


def test_moe_backend_triton_on_rtx5090_by_version() -> None:
    """SM120: refused before 0.32 (cc < 11.0), Blackwell Triton layout from 0.32 (+904,704 an expert)."""
    geometry = _geometry()
    assert vb.mxfp4_backend_refusal(geometry, version="0.31.0", moe_backend="triton", compute_capability=(12, 0))
    assert vb.mxfp4_backend_refusal(geometry, version="0.32.0", moe_backend="triton",
                                    compute_capability=(12, 0)) is None
    loaded = vb.mxfp4_as_loaded(geometry, version="0.32.0", tp=1, pp=1, compute_capability=(12, 0),
                                moe_backend="triton")
    assert (loaded.backend, loaded.extra, loaded.error) == ("TRITON", 904_704 * EXPERT_LAYERS, 0)


def test_flashinfer_trtllm_only_on_sm100() -> None:
    geometry = _geometry()
    refusal = vb.mxfp4_backend_refusal(geometry, version="0.33.0", moe_backend="flashinfer_trtllm",
                                       compute_capability=(9, 0))
    assert refusal is not None and "'FLASHINFER_TRTLLM_MXFP4_BF16' does not support" in refusal[0]
    # B200, 0.33: TRT-LLM pinned: no Triton fallback in the band (it runs TRT-LLM or refuses to start).
    loaded = vb.mxfp4_as_loaded(geometry, version="0.33.0", tp=1, pp=1, compute_capability=(10, 0),
                                moe_backend="flashinfer_trtllm")
    assert (loaded.extra, loaded.error) == (TRTLLM_128 * EXPERT_LAYERS, 0)


def test_a_name_vllm_does_not_map_for_mxfp4_is_refused() -> None:
    """`cutlass` is a MoEBackend (config/kernel.py) but not in map_mxfp4_backend (oracle/mxfp4.py:397)."""
    refusal = vb.mxfp4_backend_refusal(_geometry(), version="0.33.0", moe_backend="cutlass",
                                       compute_capability=(9, 0))
    assert refusal is not None
    assert refusal[0].startswith("moe_backend='cutlass' is not supported for MXFP4 MoE. Expected one of ['b12x', ")
    assert refusal[1] == "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py:397 (vLLM 0.33.0)"


def test_an_underived_backend_keeps_the_largest_layout_with_a_wide_band() -> None:
    """flashinfer_cutlass on an H100: layout not derived; Marlin (+1,195,264) and Triton (+64,000) run on
    9.0, Marlin is the larger: the band spans Marlin's layout down to the checkpoint's."""
    loaded = vb.mxfp4_as_loaded(_geometry(), version="0.33.0", tp=1, pp=1, compute_capability=(9, 0),
                                moe_backend="flashinfer_cutlass")
    assert (loaded.backend, loaded.extra + loaded.error, loaded.extra - loaded.error) == ("MARLIN", MARLIN * 768, 0)
    assert "not derived" in loaded.rule


def test_before_0_19_the_flag_is_not_read_for_mxfp4() -> None:
    """0.18.1 quantization/mxfp4.py get_mxfp4_backend does not read moe_backend."""
    geometry = _geometry()
    pinned = vb.mxfp4_as_loaded(geometry, version="0.18.0", tp=1, pp=1, compute_capability=(9, 0),
                                moe_backend="marlin")
    assert pinned == vb.mxfp4_as_loaded(geometry, version="0.18.0", tp=1, pp=1, compute_capability=(9, 0))
    assert vb.mxfp4_backend_refusal(geometry, version="0.18.0", moe_backend="triton", compute_capability=(8, 9)) is None


def test_vllm_mxfp4_use_marlin_env() -> None:
    """VLLM_MXFP4_USE_MARLIN=1 (0.10-0.23): Marlin on an H100 (0.19: oracle/mxfp4.py:335-343); gone in 0.24."""
    assert vb.marlin_env_set({"VLLM_MXFP4_USE_MARLIN": "1"}, "0.19.0")
    assert not vb.marlin_env_set({"VLLM_MXFP4_USE_MARLIN": "0"}, "0.19.0")
    assert not vb.marlin_env_set({"VLLM_MXFP4_USE_MARLIN": "1"}, "0.24.0")
    model, plan = _plan("h100", "0.19.0", env={"VLLM_MXFP4_USE_MARLIN": "1"})
    weights = next(i for i in plan.budget if i.key == "weights")
    assert weights.bytes == model.weight_bytes + MARLIN * 768 + ROPE and weights.error_bytes == 0
    # B200 before 0.19: FlashInfer is picked before the variable where installed: TRT-LLM (256) or Marlin.
    b200 = vb.mxfp4_as_loaded(_geometry(), version="0.12.0", tp=1, pp=1, compute_capability=(10, 0), marlin_env=True)
    assert (b200.extra + b200.error, b200.extra - b200.error) == (1_840_896 * 768, MARLIN * 768)


def test_the_flag_is_a_calibration_key_and_read_once() -> None:
    assert "--moe-backend" in vr.CALIBRATION_KEY_FLAGS
    assert "VLLM_MXFP4_USE_MARLIN" in vr.ENV_KEYS
    assert vr.pinned_flags(("--moe-backend", "marlin"))["--moe-backend"] == "marlin"


def test_lora_takes_marlin_before_the_pin_on_0_19_and_0_20() -> None:
    """0.19-0.20 return Marlin for MXFP4 LoRA before reading --moe-backend (0.19.0 oracle/mxfp4.py:209-223):
    `--moe-backend triton` on an RTX 4090 starts there (no refusal), and an H100 holds Marlin's layout, not
    Triton's. 0.21 has no such branch: the pin is read (and refused on the 4090)."""
    _, plan = _plan("rtx4090", "0.19.0", "--enable-lora", "--moe-backend", "triton")
    assert plan.kv_cache_bytes > 0
    model, h100 = _plan("h100", "0.20.0", "--enable-lora")
    weights = next(i for i in h100.budget if i.key == "weights")
    assert weights.bytes == model.weight_bytes + MARLIN * EXPERT_LAYERS + ROPE and weights.error_bytes == 0
    with pytest.raises(WontFit, match="TRITON"):
        _plan("rtx4090", "0.21.0", "--enable-lora", "--moe-backend", "triton")


def _plan_exit(argv: list[str]) -> tuple[int, str]:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "launcher", "plan", *argv], capture_output=True, text=True, timeout=60)
    return run.returncode, run.stderr


@pytest.mark.parametrize(("version", "name", "offered"), [
    ("0.33.0", "aiter_triton_mxfp4_mxfp4", True),  # new in 0.33 (config/kernel.py:122)
    ("0.32.0", "aiter_triton_mxfp4_mxfp4", False),
    ("0.32.0", "flashinfer_moe_ep_mega_cutedsl", False),  # 0.29-0.31 only
    ("0.30.0", "flashinfer_moe_ep_mega_cutedsl", True),
    ("0.19.0", "emulation", False),  # from 0.20
    ("0.20.0", "Deep-GEMM-Mega-MoE", True),  # lower-cased, '-' as '_' (arg_utils.py:1806)
    ("0.17.1", "marlin", True),
])
def test_the_release_argparse_choices(version: str, name: str, offered: bool) -> None:
    from launcher.engines.vllm.checks import _moe_backend_rules

    rules = _moe_backend_rules(CheckInput(
        geometry=_geometry(), device="cuda", compute_capability=(9, 0), gpu_count=1, tp=1, pp=1, dtype="bfloat16",
        kv_cache_dtype=None, block_size=None, max_model_len=None, model_max_len=131072, engine_version=version,
        moe_backend=name))
    assert (not rules) == offered
    if rules:
        assert rules[0].bad_argument and "invalid choice" in rules[0].message


@pytest.mark.parametrize(("argv", "text"), [
    (["--", "--moe-backend", "x" * 100_000], "argument --moe-backend: invalid choice: 'xxxx"),
    (["--engine-version", "0.19.0", "--", "--moe-backend", "emulation"], "invalid choice: 'emulation'"),
    (["--engine-version", "0.16.0", "--", "--moe-backend", "marlin"], "unrecognized arguments: --moe-backend"),
])
def test_names_the_release_does_not_offer_are_usage_errors(argv: list[str], text: str) -> None:
    """vLLM's argparse refuses them before reading a config: exit 2 on one line, for any model."""
    code, err = _plan_exit(["qwen2.5-7b", "--gpu", "h100", *argv])
    assert code == 2 and text in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2 and len(err) < 2000


def test_034_keeps_a_pinned_triton_on_sm110_and_refuses_it_on_hopper_from_the_shared_oracle() -> None:
    """0.34 picks Marlin first on SM110 but still runs a pinned Triton there; the refusal on a card Triton
    cannot run (an RTX 4090) comes from the shared MoE oracle (fused_moe/oracle/base.py:236)."""
    geometry = _geometry()
    assert vb.mxfp4_backend_refusal(geometry, version="0.34.0", moe_backend="triton", compute_capability=(11, 0)) \
        is None
    refusal = vb.mxfp4_backend_refusal(geometry, version="0.34.0", moe_backend="triton", compute_capability=(8, 9))
    assert refusal is not None and refusal[1] == "vllm/model_executor/layers/fused_moe/oracle/base.py:236 (vLLM 0.34.0)"
    assert vb.mxfp4_backend_refusal(geometry, version="0.33.0", moe_backend="triton", compute_capability=(8, 9))[1] \
        == "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py:611 (vLLM 0.33.0)"
