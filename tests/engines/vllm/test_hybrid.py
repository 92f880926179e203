"""Hybrid and state-space models planned as vLLM 0.32 sizes them (launcher/engines/vllm/hybrid.py).

Two kinds of proof, both recorded as data so these tests run in a second:
- the real CPU engine (tests/data/vllm_cpu_truth.json, tiny random checkpoints from
  tests/tinymodels.py): every served family's printed tokens and concurrency equal the plan at
  two settings (prefix caching on: mamba cache mode 'align'; off: 'none'); what the engine sizes
  and then fails is refused before launch with the engine's reason;
- the engine's own classmethods (tests/data/vllm_hybrid_golden.json, built by
  tests/oracles/vllm_hybrid_oracle.py): the state each request holds, per family, TP and SSM
  dtype, for the real configs in tests/data/configs/ and the tiny ones, including the families the
  CPU engine cannot run (Qwen3.5 needs torchvision, Mamba-1 / Jamba fail their first request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UnsupportedModel, WontFit
from launcher.common.units import GiB
from launcher.engines.vllm import hybrid
from launcher.engines.vllm import kv as vk
from launcher.engines.vllm.architectures import architecture_status
from launcher.engines.vllm.rules import rules_for
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import FULL, LINEAR, NO_CACHE, geometry_from_config
from launcher.model.gpu import HostMemory
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from launcher.probe import has_avx512_bf16

DATA = Path(__file__).resolve().parents[2] / "data"
TRUTH = json.loads((DATA / "vllm_cpu_truth.json").read_text())
BY_ID = {c["id"]: c for c in TRUTH["cases"]}
GOLDEN = json.loads((DATA / "vllm_hybrid_golden.json").read_text())
CONFIGS = {f"configs/{p.name}": {k: v for k, v in json.loads(p.read_text()).items() if not k.startswith("_")}
           for p in sorted((DATA / "configs").glob("*.json"))}
FAMILY_CASES = [(family.architecture, cid) for family in hybrid.STATE_FAMILIES.values() for cid in family.cases]


def _config(name: str) -> dict[str, Any]:
    if name in GOLDEN["tiny_configs"]:  # families the CPU engine cannot build (Kimi-Linear, Qwen3.5-MoE)
        return GOLDEN["tiny_configs"][name]
    if name.startswith("tiny/"):
        return next(c["config"] for c in TRUTH["cases"] if c["kind"] == name.removeprefix("tiny/"))
    return CONFIGS[name]


def _model(config: dict[str, Any], name: str = "m") -> ResolvedModel:
    return ResolvedModel(name=name, source="local", geometry=geometry_from_config(config), weight_bytes=10 * 2**20,
                         weight_bytes_source="tiny test model", config=config)


def _plan_cpu(case: dict[str, Any]) -> Any:
    request = PlanRequest(model=_model(case["config"], case["kind"]), engine="vllm", device="cpu",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB,
                                          cpu_amx=TRUTH["meta"]["versions"]["amx"]),
                          engine_args=tuple(case["args"]), engine_env=case["env"], engine_version="0.32.0")
    return make_plan(request)


@pytest.mark.parametrize(("architecture", "case_id"), FAMILY_CASES, ids=[cid for _, cid in FAMILY_CASES])
def test_recorded_engine_runs_equal_the_plan(architecture: str, case_id: str) -> None:
    """Tokens, concurrency and blocks as the CPU engine printed them; unservable ones refused."""
    case = BY_ID[case_id]
    assert case["config"]["architectures"][0] == architecture
    assert case["tokens"] is not None, f"{case_id}: the engine printed no KV line"
    if not (case["ok"] and case["completion_ok"]):
        with pytest.raises(WontFit):
            _plan_cpu(case)
        return
    plan = _plan_cpu(case)
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}", plan.num_blocks) == (
        case["tokens"], case["concurrency_str"], case["num_blocks"])


@pytest.mark.parametrize("family", [f for f in hybrid.STATE_FAMILIES.values() if f.cases],
                         ids=lambda f: f.architecture)
def test_engine_proven_families_have_two_settings_and_serve(family: hybrid.StateFamily) -> None:
    cases = [BY_ID[cid] for cid in family.cases]
    served = [c for c in cases if c["ok"] and c["completion_ok"]]
    if family.cpu_failure is None:
        assert len({tuple(c["args"]) for c in served}) >= 2, family.architecture
    else:
        assert not served and family.golden, family.architecture  # refused on CPU, proven by the golden file


def test_page_unification_raises_the_block_as_the_engine_logged() -> None:
    """'Setting attention block size to 640 tokens' (Qwen3-Next), 256 (Granite, Falcon-H1, Nemotron-H)."""
    for cid in ("qwen3_next-base", "granitemoehybrid-base", "falcon_h1-base"):
        case = BY_ID[cid]
        logged = next(line for line in case["relevant_lines"] if "Setting attention block size to" in line)
        assert f"to {_plan_cpu(case).block_size} tokens" in logged, cid


def _golden_id(record: dict[str, Any]) -> str:
    return f"{record['name']}-tp{record['tp']}-{record['mamba_ssm_cache_dtype_flag']}"


@pytest.mark.parametrize("record", GOLDEN["records"], ids=_golden_id)
def test_state_equals_the_engines_classmethods(record: dict[str, Any]) -> None:
    geometry = geometry_from_config(_config(record["name"]))
    layers = hybrid.state_layers(geometry, tp=record["tp"])
    listed = record["layer_types"]
    parallel = geometry.architecture in ("FalconH1ForCausalLM", "Zamba2ForCausalLM")  # state beside attention
    if listed is not None and not parallel and not any(t in ("linear_attention", "mamba", "conv") for t in listed):
        assert layers is None  # Granite 4.0 micro: a hybrid class with attention layers only
        return
    assert layers is not None
    flag = record["mamba_ssm_cache_dtype_flag"]
    pinned = {} if flag == "auto" else {"--mamba-ssm-cache-dtype": flag}
    shapes = [list(layers.shape.conv)] + ([list(layers.shape.ssm)] if layers.shape.ssm else [])
    assert shapes == record["shapes"]
    if record.get("refused"):  # the engine's classmethod raises: the plan refuses before launch
        with pytest.raises(WontFit, match="supports only auto, float32, and bfloat16"):
            hybrid.refuse_pinned_state_dtype(geometry, pinned)
        return
    dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cuda", pinned=pinned)
    assert layers.shape.bytes(dtypes.conv_bytes, dtypes.ssm_bytes) == record["page_size_bytes"]
    if listed is not None and not parallel:
        assert layers.count == sum(1 for t in listed if t in ("linear_attention", "mamba", "conv"))


def test_every_golden_family_has_golden_records() -> None:
    proven = {r["architecture"] for r in GOLDEN["records"]}
    for family in hybrid.STATE_FAMILIES.values():
        if family.golden:
            assert family.architecture in proven, family.architecture
            ok, note = architecture_status(geometry_from_config(next(
                _config(r["name"]) for r in GOLDEN["records"] if r["architecture"] == family.architecture)))
            assert ok and "golden file" in note


def test_qwen3_next_counts_every_fourth_layer_as_attention() -> None:
    """full_attention_interval 4 (Qwen3NextConfig): 12 attention, 36 GDN layers of 48 (was '0 of 48')."""
    geometry = geometry_from_config(CONFIGS["configs/qwen3-next-80b-a3b-instruct.json"])
    assert geometry.layer_kinds.count(FULL) == 12 and geometry.layer_kinds.count(LINEAR) == 36
    assert hybrid.state_layer_count(geometry) == 36


def test_nemotron_h_pattern_and_ssm_dtype() -> None:
    geometry = geometry_from_config(CONFIGS["configs/nvidia-nemotron-nano-9b-v2.json"])
    assert len(geometry.layer_kinds) == 56 and geometry.layer_kinds.count(FULL) == 4
    assert geometry.layer_kinds.count(NO_CACHE) == 25 and hybrid.state_layer_count(geometry) == 27
    dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cuda", pinned={})
    assert (dtypes.conv_bytes, dtypes.ssm_bytes) == (2, 4)  # NemotronH: float32 SSM state by default


@pytest.mark.parametrize(("version", "block", "state_blocks"), [
    ("0.32.0", 272, 2),  # 16 x cdiv(274432, 16 x 1024): DEFAULT_BLOCK_SIZE 16, no GDN checkpoint yet
    ("0.33.0", 320, 3),  # FlashInfer's GDN prefill: lcm(16, 64) = 64 x cdiv(274432, 64 x 1024), + a checkpoint block
    ("0.34.0", 320, 3),  # DEFAULT_BLOCK_SIZE 64, the same
])
def test_qwen3_next_on_h100_tp4_raises_the_block_to_hold_one_state(version: str, block: int,
                                                                     state_blocks: int) -> None:
    """GPU: FlashAttention's kernel block 16; per rank 1 KV head x 256 x 2 x 2 B = 1024 B/token.
    GDN state per rank: conv (3, (2x16x128 + 32x128)/4 = 2048) bf16 = 12,288 B + (8, 128, 128) bf16
    = 262,144 B -> 274,432 B. From 0.33 on Hopper FlashInfer's GDN prefill in 'align' mode keeps a prefill
    checkpoint block per request and 64-token blocks (0.33.0 qwen_gdn_linear_attn.py:739-750,
    platforms/interface.py:1089-1104)."""
    config = CONFIGS["configs/qwen3-next-80b-a3b-instruct.json"]
    model = _model(config)
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["4x h100-80gb"]), engine_version=version,
                          engine_args=("--tensor-parallel-size", "4", "--max-model-len", "32768"))
    plan = make_plan(request)
    assert plan.block_size == block
    # 12 attention layers and 36 states of one page each: groups of 12 (36 states in 3 groups).
    assert any(f"{block} tokens" in note for note in plan.notes)
    assert any(f"{state_blocks} state block(s) per request" in note for note in plan.notes)
    # 32768 / block attention blocks + 3 groups x the state blocks (0.34: 103 + 9 = 112)
    per_request = -(-32768 // block) + 3 * state_blocks
    assert plan.num_blocks // per_request == int(plan.max_concurrency) or \
        abs(plan.num_blocks / per_request - plan.max_concurrency) < 0.01


def test_the_gdn_checkpoint_follows_the_backend_and_the_card() -> None:
    """Triton's GDN prefill (pinned, or a Blackwell GDN head other than 128) keeps no checkpoint block."""
    config = CONFIGS["configs/qwen3-next-80b-a3b-instruct.json"]
    model = _model(config)

    def plan(gpu: str, *args: str) -> object:
        return make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus([f"4x {gpu}"]),
                                     engine_version="0.34.0",
                                     engine_args=("--tensor-parallel-size", "4", "--max-model-len", "32768", *args)))

    assert any("prefill checkpoint" in note for note in plan("h100-80gb").notes)  # type: ignore[attr-defined]
    assert not any("prefill checkpoint" in note  # type: ignore[attr-defined]
                   for note in plan("h100-80gb", "--gdn-prefill-backend", "triton").notes)
    assert config.get("linear_key_head_dim") == 128
    assert any("prefill checkpoint" in note for note in plan("b200").notes)  # type: ignore[attr-defined]
    assert not any("prefill checkpoint" in note for note in plan("a100-80gb").notes)  # type: ignore[attr-defined]


KIMI_GOLDEN = [r for r in GOLDEN["records"] if r["architecture"] == "KimiLinearForCausalLM"]


@pytest.mark.parametrize("record", [r for r in KIMI_GOLDEN if not r.get("refused")], ids=_golden_id)
def test_kimi_linear_mla_page_and_kda_layer_dtypes_equal_the_engines_code(record: dict[str, Any]) -> None:
    """The MLA page the block is unified against (one latent of kv_lora_rank + qk_rope_head_dim per
    token, MLAAttentionSpec) and the dtypes the KDA layer allocates (float32 recurrent state)."""
    geometry = geometry_from_config(_config(record["name"]))
    assert record["use_mla"] and geometry.mla is not None
    assert geometry.mla.latent_dim == record["mla_head_size"]
    assert geometry.mla.latent_dim * 2 == record["attention_page_bytes_per_token"]
    assert record["layer_dtypes"] == ["bfloat16", "float32"]
    layers = hybrid.state_layers(geometry, tp=record["tp"])
    assert layers is not None and layers.shape.bytes(2, 4) == record["layer_page_size_bytes"]


@pytest.mark.parametrize("record", [r for r in KIMI_GOLDEN if r["mamba_ssm_cache_dtype_flag"] == "bfloat16"],
                         ids=_golden_id)
def test_kimi_linear_bfloat16_state_is_refused_where_it_overflows_the_padded_page(record: dict[str, Any]) -> None:
    """bfloat16: the class sizes the block for a bfloat16 state, the layer allocates float32
    (layer_page_size_bytes); where that exceeds the padded attention page, MambaSpec.page_size_bytes
    asserts at start: refused. The tiny model's float32 state fits its 128-token page; the real one's does not."""
    geometry = geometry_from_config(_config(record["name"]))
    layers = hybrid.state_layers(geometry, tp=record["tp"])
    assert layers is not None
    dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cuda",
                                 pinned={"--mamba-ssm-cache-dtype": "bfloat16"})
    assert layers.shape.bytes(dtypes.conv_bytes, dtypes.ssm_bytes) == record["page_size_bytes"]
    assert layers.shape.bytes(dtypes.conv_bytes, dtypes.layer_ssm_bytes or 0) == record["layer_page_size_bytes"]
    block = hybrid.aligned_block_size(block=16, attention_bytes_per_token=record["attention_page_bytes_per_token"],
                                      state_bytes=record["page_size_bytes"], kernel_block=16, mla=True)
    page = block * record["attention_page_bytes_per_token"]
    if record["layer_page_size_bytes"] > page:
        assert record["name"].startswith("configs/")
        with pytest.raises(WontFit, match="overflows its padded page"):
            hybrid.refuse_state_overflow(layers, dtypes, page)
    else:
        assert record["name"] == "tiny/kimi_linear"
        hybrid.refuse_state_overflow(layers, dtypes, page)


def test_kimi_linear_on_h200_tp8_raises_the_block_to_a_multiple_of_128() -> None:
    """TP 8: KDA state conv (3, 12288/8) bf16 = 9,216 B + recurrent (4, 128, 128) fp32 = 262,144 B
    -> 271,360 B; MLA page 576 x 2 = 1,152 B/token; block = 128 x cdiv(271360, 128 x 1152) = 256."""
    config = CONFIGS["configs/kimi-linear-48b-a3b-instruct.json"]
    geometry = geometry_from_config(config)
    assert geometry.layer_kinds.count(LINEAR) == 20 and hybrid.state_layer_count(geometry) == 20
    plan = make_plan(PlanRequest(model=_model(config), engine="vllm", gpus=hypothetical_gpus(["8x h200"]),
                                 engine_args=("--tensor-parallel-size", "8", "--max-model-len", "32768")))
    assert plan.block_size == 256 and plan.architecture_verified
    assert any("20 state layers (kda) of 271,360 B" in note for note in plan.notes)
    with pytest.raises(WontFit, match="float16"):
        make_plan(PlanRequest(model=_model(config), engine="vllm", gpus=hypothetical_gpus(["8x h200"]),
                              engine_args=("--tensor-parallel-size", "8", "--mamba-ssm-cache-dtype", "float16")))


@pytest.mark.parametrize("case_id", ["kimi_linear-base", "kimi_linear-noprefix"])
def test_kimi_linear_is_refused_on_cpu_where_the_engine_cannot_build_it(case_id: str) -> None:
    case = BY_ID[case_id]
    assert case["tokens"] is None and not case["ok"]  # the engine stopped before its KV line
    with pytest.raises(WontFit, match="cannot build Kimi-Linear"):
        _plan_cpu(case)


@pytest.mark.parametrize("wrapper", ["configs/qwen3.5-27b.json", "configs/qwen3.5-35b-a3b.json"])
def test_qwen3_5_vl_wrappers_read_through_to_their_golden_text_class(wrapper: str) -> None:
    geometry = geometry_from_config(CONFIGS[wrapper])
    ok, note = architecture_status(geometry)
    assert ok and "vLLM builds its language model as Qwen3_5" in note and "golden file" in note


def test_removed_linear_attention_models_are_refused_with_the_engines_reason() -> None:
    """vLLM lists the last release that served it (registry.py:883-939): MiniMax-Text-01 until 0.23.0,
    refused from 0.24.0 in vLLM's words; 0.23 still registers it (models/registry.py in 0.23.0), so no
    removal there."""
    def plan(version: str) -> object:
        return make_plan(PlanRequest(model=_model(CONFIGS["configs/minimax-text-01.json"]), engine="vllm",
                                     gpus=hypothetical_gpus(["8x h200"]), engine_args=("--tensor-parallel-size", "8"),
                                     engine_version=version))

    for version in ("0.24.0", "0.34.0"):
        with pytest.raises(WontFit, match="Model architecture MiniMaxText01ForCausalLM was supported in vLLM until "
                                          r"v0\.23\.0, and is not supported anymore") as refused:
            plan(version)
        assert refused.value.rule == "removed-architecture"
    try:
        plan("0.23.0")
    except (WontFit, UnsupportedModel) as other:
        assert getattr(other, "rule", None) != "removed-architecture" and "supported in vLLM until" not in str(other)


def test_sglang_plans_its_state_pool_and_refuses_hybrids_it_has_no_class_for() -> None:
    """SGLang sizes Qwen3-Next's GDN state itself (engines/sglang/architectures.py, golden
    tests/data/sglang_layouts.json); Jamba has no SGLang model class and stays refused."""
    plan = make_plan(PlanRequest(model=_model(CONFIGS["configs/qwen3-next-80b-a3b-instruct.json"]), engine="sglang",
                                 gpus=hypothetical_gpus(["4x h100-80gb"]), engine_args=("--tp", "4")))
    state = {item.key: item for item in plan.budget}["state"]
    assert plan.architecture_verified and state.bytes > 0
    assert "36 state layers, 5 slots per request" in state.detail
    assert plan.kv_cache_bytes_low is not None and plan.kv_cache_bytes_high is not None
    assert plan.kv_cache_bytes_high - plan.kv_cache_bytes_low < 0.05 * plan.kv_cache_bytes
    with pytest.raises(UnsupportedModel, match="linear-attention/Mamba state"):
        make_plan(PlanRequest(model=_model(CONFIGS["configs/jamba-mini-1.7.json"]), engine="sglang",
                              gpus=hypothetical_gpus(["4x h100-80gb"]), engine_args=("--tp", "4")))


def test_cpu_ssm_state_is_float32_unless_asked_for_16_bits() -> None:
    geometry = geometry_from_config(BY_ID["qwen3_next-base"]["config"])
    assert hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cpu", pinned={}).ssm_bytes == 4
    assert hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cpu",
                               pinned={"--mamba-ssm-cache-dtype": "bfloat16"}).ssm_bytes == 2
    assert hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cuda", pinned={}).ssm_bytes == 2


def test_cpu_keeps_a_pinned_bfloat16_ssm_state_of_nemotron_h_as_the_engine_did() -> None:
    """Issue #19: vllm-cpu 0.32.0 on an AVX512-BF16 host served nemotron_h-ssm-bf16 with a bfloat16 state
    (3,532,045 tokens / 862.32x, 32,768 blocks; float32 would be the base run's 3,050,402 / 744.73x) although
    platforms/cpu.py:301-320 reads as a reset to float32 outside GDN: the plan keeps the pinned dtype."""
    case = BY_ID["nemotron_h-ssm-bf16"]
    dtypes = hybrid.state_dtypes(geometry_from_config(case["config"]), model_dtype_bytes=2, device="cpu",
                                 pinned={"--mamba-ssm-cache-dtype": "bfloat16"})
    assert dtypes.ssm_bytes == 2
    plan = _plan_cpu(case)
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}", plan.num_blocks) == (3532045, "862.32", 32768)
    assert plan.kv_cache_tokens > BY_ID["nemotron_h-base"]["tokens"]


def _plan_cpu_at(kind: str, version: str, *args: str, amx: bool = False) -> Any:
    config = next(c["config"] for c in TRUTH["cases"] if c["kind"] == kind)
    return make_plan(PlanRequest(model=_model(config, kind), engine="vllm", device="cpu",
                                 host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=amx),
                                 engine_args=("--enforce-eager", "--max-model-len", "4096", *args),
                                 engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"}, engine_version=version))


def test_mamba_cache_mode_all_exists_until_031_only() -> None:
    """0.31.0 config/cache.py:62 has 'all' (a state block per block of tokens, v1/kv_cache_interface.py:
    1083-1088); 0.32's MambaCacheMode is ['align', 'none'] and the engine refuses the flag."""
    with pytest.raises(WontFit, match="no mamba cache mode 'all'"):
        _plan_cpu_at("nemotron_h", "0.32.0", "--mamba-cache-mode", "all")
    # vllm-cpu 0.31.0 nemotron_h-mode-all: 1,398,101 tokens / 341.33x, then the first request failed.
    with pytest.raises(WontFit, match="cannot be converted to Scalar"):
        _plan_cpu_at("nemotron_h", "0.31.0", "--mamba-cache-mode", "all")
    setup = vk.hybrid_layout_for(geometry_from_config(BY_ID["nemotron_h-base"]["config"]), block=128, kv_bytes=2,
                                 model_dtype_bytes=2, tp=1, device="cpu", pinned={"--mamba-cache-mode": "all"},
                                 rules=rules_for("0.31.0")[0])
    assert setup is not None and setup.block == 256
    assert f"{16384 / setup.layout.blocks_per_request(4096, 2048):.2f}" == "341.33"  # 16 attention + 2 x 16 state
    # Qwen3-Next is no SupportsMambaPrefixCaching class: 'all' falls back to 'align' (models/config.py:649-658).
    fallback = _plan_cpu_at("qwen3_next", "0.31.0", "--mamba-cache-mode", "all")
    assert fallback.kv_cache_tokens == BY_ID["qwen3_next-base"]["tokens"]


def test_before_029_the_cpu_ssm_reset_needs_amx() -> None:
    """0.27.1 / 0.28.0 platforms/cpu.py reset the SSM state to float32 on AMX hosts only; 0.29.0
    cpu.py:239-259 on AVX512-BF16 hosts (the reference host has no AMX)."""
    geometry = geometry_from_config(BY_ID["qwen3_next-base"]["config"])
    for version, amx, ssm in (("0.28.0", False, 2), ("0.28.0", True, 4), ("0.29.0", False, 4)):
        dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cpu", pinned={},
                                     rules=rules_for(version)[0], cpu_amx=amx)
        assert dtypes.ssm_bytes == ssm, (version, amx)


def test_from_029_a_host_without_avx512_bf16_keeps_the_16_bit_state() -> None:
    """0.29-0.32 platforms/cpu.py (0.32.0 :301-320) resets the SSM state to float32 only where
    `torch.cpu._is_avx512_bf16_supported()`: on an AVX2 host (an AMD EPYC without AVX-512) vllm-cpu 0.32.0
    served the tiny qwen3_next model of tests/test_engine_vllm_cpu.py at block 384 with its 16-bit state ("Padding
    mamba page size by 43.28%"): 1,315,779 tokens / 321.24x, a completion served; the float32 state's block 640
    gives 1,032,192 on an AVX512-BF16 host. An unknown host keeps the float32 state (the larger page)."""
    geometry = geometry_from_config(BY_ID["qwen3_next-base"]["config"])
    rules = rules_for("0.32.0")[0]
    for avx512_bf16, ssm in ((False, 2), (True, 4), (None, 4)):
        dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cpu", pinned={}, rules=rules,
                                     cpu_avx512_bf16=avx512_bf16)
        assert dtypes.ssm_bytes == ssm, avx512_bf16
    assert "no AVX-512 BF16" in hybrid.state_dtypes(geometry, model_dtype_bytes=2, device="cpu", pinned={},
                                                    rules=rules, cpu_avx512_bf16=False).reason
    # 0.29-0.31 prepack every conv weight on AVX512-BF16 hosts only: elsewhere a width-3 conv is not refused.
    lfm2 = geometry_from_config(BY_ID["lfm2-base"]["config"])
    assert "support only width of 4" in str(hybrid.cpu_failure(lfm2, rules_for("0.31.0")[0], False, {},
                                                               cpu_avx512_bf16=True))
    assert hybrid.cpu_failure(lfm2, rules_for("0.31.0")[0], False, {}, cpu_avx512_bf16=False) is None


@pytest.mark.parametrize(("flags", "expected"), [
    ("flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n", True), ("flags\t\t: fpu sse avx2 avx512f\n", False),
    ("", None)])
def test_the_probe_reads_avx512_bf16(flags: str, expected: bool | None) -> None:
    assert has_avx512_bf16(flags) is expected


def test_027_keeps_prefix_caching_opt_in_and_starts_it_in_mode_all_where_the_class_supports_it() -> None:
    """0.27.1 engine/arg_utils.py:2602-2605: prefix caching off by default for hybrid models (0.28.0
    :2650 on), so mamba cache mode 'none', also for `--mamba-cache-mode all` (models/config.py:650-655);
    with --enable-prefix-caching, :613-618: 'all' for SupportsMambaPrefixCaching classes, else 'align'."""
    no_prefix = _plan_cpu_at("nemotron_h", "0.28.0", "--no-enable-prefix-caching").kv_cache_tokens
    # vllm-cpu 0.27.1 nemotron_h-base and nemotron_h-mode-all: 3,728,270 tokens / 910.22x, served.
    assert _plan_cpu_at("nemotron_h", "0.27.1").kv_cache_tokens == no_prefix == 3_728_270
    assert _plan_cpu_at("nemotron_h", "0.27.1", "--mamba-cache-mode", "all").kv_cache_tokens == no_prefix
    # vllm-cpu 0.27.1 nemotron_h-prefix-on: mode 'all', 1,398,101 tokens / 341.33x, then the first request failed.
    with pytest.raises(WontFit, match="mamba cache mode 'all'"):
        _plan_cpu_at("nemotron_h", "0.27.1", "--enable-prefix-caching")
    align = _plan_cpu_at("nemotron_h", "0.28.0").kv_cache_tokens  # 0.28.0 models/config.py:603-604 'align'
    assert align == _plan_cpu_at("nemotron_h", "0.31.0").kv_cache_tokens != no_prefix
    # Qwen3-Next has no Mamba prefix caching: 'align' on 0.27 too; its 16-bit GDN state fails without AMX.
    for args in ((), ("--enable-prefix-caching",)):
        with pytest.raises(WontFit, match="initial_state dtype mismatch"):
            _plan_cpu_at("qwen3_next", "0.27.1", *args)


def test_before_032_a_conv_width_other_than_4_stops_the_cpu_engine() -> None:
    """vllm-cpu 0.31.0 lfm2-base (conv_L_cache 3): 'causal_conv1d_weight_pack: support only width of 4'
    at start; 0.32 prepacks width-4 weights only (utils.py:488-505) and serves it; before 0.29 only AMX
    hosts prepack (0.28.0 model_executor/layers/utils.py:283)."""
    with pytest.raises(WontFit, match="support only width of 4"):
        _plan_cpu_at("lfm2", "0.31.0")
    assert _plan_cpu_at("lfm2", "0.32.0").kv_cache_tokens == BY_ID["lfm2-base"]["tokens"]
    assert _plan_cpu_at("lfm2", "0.28.0").kv_cache_tokens == BY_ID["lfm2-base"]["tokens"]
    with pytest.raises(WontFit, match="support only width of 4"):
        _plan_cpu_at("lfm2", "0.28.0", amx=True)
    assert _plan_cpu_at("nemotron_h", "0.31.0").kv_cache_tokens > 0  # conv_kernel 4 serves
