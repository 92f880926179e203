"""SGLang's loader leftovers (P - A beyond the weights) derived from its modules and PyTorch's
caching allocator, checked against the published starts in tests/data/startup-logs/, and the KV
band they leave."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from launcher.common.units import GiB, MiB
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import parameters
from launcher.model import allocator
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

LOGS = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "startup-logs.yaml"
# QwQ-32B as that start ran it: its log reports context_len=131072 (max_position_embeddings, no scaling).
QWQ_32B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120,
           "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
           "vocab_size": 152064, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


class TestAllocatorSlack:
    """torch's get_allocation_size: own segment rounded to 2 MiB from 10 MiB, 20 MiB segments from 1 MiB."""

    @pytest.mark.parametrize(("tensors", "slack"), [
        ([int(31.5 * MiB)], MiB // 2),  # Qwen2.5-7B qkv_proj: a 32 MiB segment
        ([int(24.5 * MiB)], int(1.5 * MiB)),  # o_proj: 26 MiB, the 1.5 MiB tail split off and left free
        ([int(24.5 * MiB), int(1.25 * MiB)], MiB // 4),  # the next 1.25 MiB tensor takes that tail
        ([3 * MiB, 3 * MiB], 14 * MiB),  # two 3 MiB tensors share one 20 MiB segment
        ([1024], 2 * MiB - 1024),  # a small tensor opens a 2 MiB segment
        ([100 * MiB], 0),
    ])
    def test_segments_beyond_the_tensors(self, tensors: list[int], slack: int) -> None:
        assert allocator.slack_bytes(tensors) == slack

    def test_qwen2_5_7b_parameters(self) -> None:
        """199 tensors whose bytes are the checkpoint's, and the rope cache; 3.5 MiB of rounding per layer."""
        model = resolve_model("qwen2.5-7b")
        loader = parameters.loader_tensors(model.geometry, element=2, tp=1)
        assert loader is not None and loader.engine_only_bytes == 32768 * 128 * 4
        assert (len(loader.tensors), sum(loader.tensors)) == (200, model.weight_bytes + loader.engine_only_bytes)
        assert allocator.slack_bytes(loader.tensors) == 105_239_552  # 100.4 MiB


def test_rope_cache_is_float32_max_position_by_rotary_dim() -> None:
    assert parameters.rope_cache_bytes(resolve_model("llama-3.1-8b").geometry) == 131072 * 128 * 4  # llama3
    yarn = geometry_from_config({**QWQ_32B, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                              "original_max_position_embeddings": 32768}})
    assert parameters.rope_cache_bytes(yarn) == 32768 * 4 * 128 * 4  # YaRN: the original length x the factor
    dynamic = geometry_from_config({**QWQ_32B, "rope_scaling": {"type": "dynamic", "factor": 4.0}})
    assert parameters.rope_cache_bytes(dynamic) is None  # not derived


@pytest.fixture(scope="module")
def logged() -> dict[str, dict]:
    if not LOGS.is_file():
        pytest.skip(f"{LOGS} not present")
    return {case["id"]: case["observed"] for case in yaml.safe_load(LOGS.read_text())}


@pytest.mark.parametrize(("case_id", "model", "tp", "observed_mib", "derived_mib"), [
    ("sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2", "deepseek-r1-distill-qwen-7b", 1, 210, 188),
    ("sglang-qwen3-14b-4x4090-tp4-mf080", "qwen3-14b", 4, 208, 227),
    ("sglang-llmsinclouds-4xl4-qwq-32b-tp4", None, 4, 290, 314),
])
def test_derived_leftovers_cover_published_starts(logged: dict, case_id: str, model: str | None, tp: int,
                                                  observed_mib: int, derived_mib: int) -> None:
    """Load begin/end avail mem (or mem usage) less the checkpoint's share: within the residual's error."""
    log = logged[case_id]["log"]
    geometry = resolve_model(model).geometry if model else geometry_from_config(QWQ_32B)
    loader = parameters.loader_tensors(geometry, element=2, tp=1)
    assert loader is not None
    weights = resolve_model(model).weight_bytes if model else sum(loader.tensors) - loader.engine_only_bytes
    usage = re.search(r"mem usage=([\d.]+) GB", log)
    begin = re.search(r"Load weight begin\. avail mem=([\d.]+)", log)
    end = re.search(r"Load weight end\..*?avail mem=([\d.]+)", log)
    used = float(usage.group(1)) if usage else float(begin.group(1)) - float(end.group(1))
    observed = used * GiB - weights // tp
    derived = sb.load_overhead(geometry, dtype="bfloat16", tp=tp, pp=1)
    assert (round(observed / MiB), round(derived.bytes / MiB)) == (observed_mib, derived_mib)
    assert abs(derived.bytes - observed) <= derived.error_bytes == sb.LOAD_RESIDUAL_ERROR_BYTES


def test_awq_leftovers_are_derived_with_the_marlin_repack_bounded() -> None:
    """Qwen2.5-7B-AWQ: its 424 tensors derived (165 MiB of rounding, the 16 MiB rope cache); on sm80+
    awq_marlin replaces 12 tensor sizes a layer and adds 112 workspaces: 2 MiB + 56 +/- 56 MiB more."""
    geometry = resolve_model("qwen2.5-7b-awq").geometry
    turing = sb.load_overhead(geometry, dtype="float16", tp=1, pp=1, compute_capability=(7, 5))
    ada = sb.load_overhead(geometry, dtype="float16", tp=1, pp=1, compute_capability=(8, 9))
    unknown = sb.load_overhead(geometry, dtype="float16", tp=1, pp=1)
    assert (turing.bytes, turing.error_bytes) == (215_294_976, 32 * MiB)
    assert (ada.bytes - turing.bytes, ada.error_bytes) == (58 * MiB, 88 * MiB)
    assert unknown == ada  # a card not known: the repack counted
    assert turing.detail.startswith("derived: 424 tensors") and "Marlin repack" in ada.detail


def test_fp8_below_sm89_runs_marlin_and_unknown_models_stay_bounded() -> None:
    """compressed-tensors FP8 below sm89 runs the W8A16 Marlin scheme: the same tensors (the oracle's sm86
    build), repacked: 3 small scale sizes (2 MiB each), the temporaries' 20 MiB and 4 B per output row
    (49,664 rows x 28 layers) bound what it leaves, half counted. gpt-oss's MXFP4 experts are not derived:
    bounded by the layer count."""
    fp8 = resolve_model("qwen2.5-7b-fp8").geometry
    ampere = sb.load_overhead(fp8, dtype="bfloat16", tp=1, pp=1, compute_capability=(8, 6))
    ada = sb.load_overhead(fp8, dtype="bfloat16", tp=1, pp=1, compute_capability=(8, 9))
    bound = 20 * MiB + 3 * 2 * MiB + 49_664 * 4 * 28
    assert ada.error_bytes == 32 * MiB and ada.detail.startswith("derived: 312 tensors")
    assert (ampere.bytes - ada.bytes, ampere.error_bytes) == (2 * MiB + bound // 2, 32 * MiB + bound // 2)
    assert "Marlin repack: 112 workspaces" in ampere.detail
    oss = sb.load_overhead(resolve_model("gpt-oss-20b").geometry, dtype="bfloat16", tp=1, pp=1,
                           compute_capability=(9, 0))
    assert (oss.bytes, oss.error_bytes) == (248 * MiB, 224 * MiB)


def _plan(model: str, gpu: str, cap: bool = False) -> object:
    """The plan; without `cap`, the estimate's own pool and band (the --max-total-tokens a band over
    +/- 5 % gets is TestPoolCap's)."""
    return make_plan(PlanRequest(model=resolve_model(model), engine="sglang", gpus=hypothetical_gpus([gpu]),
                                 cap_uncertain_pool=cap))


class TestBand:
    def test_small_pool_names_the_terms_at_risk(self) -> None:
        """Qwen2.5-7B on an RTX 4090: a 1.95 GiB pool, +/- 7.2 %; the CUDA context dominates."""
        plan = _plan("qwen2.5-7b", "rtx4090")
        assert plan.kv_cache_tokens == 36598
        assert (plan.kv_cache_bytes_low, plan.kv_cache_bytes, plan.kv_cache_bytes_high) == (
            1_948_491_776, 2_098_675_712, 2_248_802_304)  # +/- 2619 tokens: 0.704 x (117 + 41) + 32 MiB
        assert plan.item("load_overhead").error_bytes == 32 * MiB
        note = next(n for n in plan.notes if n.startswith("KV band"))
        assert "+/- 7.2%" in note and "CUDA context (+ NCCL) before SGLang's baseline +/- 82 MiB" in note

    def test_large_pool_stays_within_five_percent(self) -> None:
        plan = _plan("qwen3-32b", "h100")
        band = (plan.kv_cache_bytes_high - plan.kv_cache_bytes) / plan.kv_cache_bytes
        assert 0.03 < band <= 0.05
        assert not any(n.startswith("KV band") for n in plan.notes)

    def test_measured_leftovers_leave_only_the_context(self) -> None:
        from launcher.plan.types import Calibration
        plain = _plan("qwen2.5-7b", "rtx4090")
        request = PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang", gpus=hypothetical_gpus(["rtx4090"]),
                              cap_uncertain_pool=False)
        measured = make_plan(dataclasses.replace(request, calibration=Calibration(load_overhead_bytes=200 * MiB,
                                                                                  key="k")))
        assert measured.item("load_overhead").error_bytes == 0
        assert measured.item("load_overhead").source == "calibrated"
        assert measured.kv_cache_bytes_high - measured.kv_cache_bytes < plain.kv_cache_bytes_high - plain.kv_cache_bytes


class TestSafeSide:
    """Issue 20: the context length comes from the band's unfavourable end, or the plan says it is at risk."""

    def _request(self, *engine_args: str) -> PlanRequest:
        return PlanRequest(model=resolve_model("qwen3-8b"), engine="sglang", gpus=hypothetical_gpus(["rtx4090"]),
                           engine_args=engine_args, cap_uncertain_pool=False)

    def test_pool_limited_length_from_the_low_end(self) -> None:
        """Qwen3-8B on an RTX 4090: 7093 tokens at the central estimate, 6074 at the low end: 6074."""
        plan = make_plan(self._request())
        assert (plan.kv_cache_tokens, plan.max_model_len) == (7093, 6074)
        assert plan.kv_cache_bytes_low == 6074 * 147456
        assert plan.may_not_fit is None
        assert "at the band's low end (6074 tokens; 7093 at the central estimate" in plan.max_model_len_source
        assert (plan.max_model_len_low_end, plan.max_model_len_central, plan.at_risk) == (6074, 7093, ())

    def test_lengths_at_both_ends_divide_the_pool_by_the_concurrency(self) -> None:
        plan = make_plan(self._request("--context-length", "1000", "--max-running-requests", "4"))
        both = make_plan(PlanRequest(model=resolve_model("qwen3-8b"), engine="sglang",
                                     gpus=hypothetical_gpus(["rtx4090"]), concurrency=2, cap_uncertain_pool=False))
        assert (both.max_model_len_low_end, both.max_model_len_central) == (6074 // 2, 7093 // 2)
        assert plan.at_risk == () and plan.max_model_len == 1000

    def test_pinned_length_above_the_low_end_is_at_risk(self) -> None:
        plan = make_plan(self._request("--context-length", "6500"))
        assert plan.max_model_len == 6500
        assert plan.may_not_fit is not None and "6074 at the band's low end" in plan.may_not_fit
        assert plan.at_risk == ("max_model_len",)

    def test_pinned_length_within_the_low_end_fits(self) -> None:
        assert make_plan(self._request("--context-length", "6074")).may_not_fit is None


class TestPoolCap:
    """A pool whose band is over +/- 5 % is capped with --max-total-tokens at the low end / 0.95: SGLang keeps
    the smaller of the cap and what it profiles, so the pool is the cap, or no less than the low end."""

    def test_a_small_pool_is_capped_where_its_band_is_five_percent(self) -> None:
        """Qwen2.5-7B on an RTX 4090: 33,979-39,216 tokens (+/- 7.2 %), capped at 33,979 / 0.95 = 35,767."""
        capped, estimate = _plan("qwen2.5-7b", "rtx4090", cap=True), _plan("qwen2.5-7b", "rtx4090")
        assert estimate.kv_cache_bytes_low == 33_979 * 57_344 and estimate.kv_cache_tokens == 36_598
        assert capped.kv_cache_tokens == 35_767 == int(33_979 / 0.95)
        assert capped.engine_args[-2:] == ("--max-total-tokens", "35767")
        assert capped.engine_figures["max_total_tokens"] == 35_767
        assert (capped.kv_cache_bytes_low, capped.kv_cache_bytes, capped.kv_cache_bytes_high) == (
            33_979 * 57_344, 35_767 * 57_344, 35_767 * 57_344)
        assert (capped.kv_cache_bytes - capped.kv_cache_bytes_low) / capped.kv_cache_bytes <= 0.05
        # The length still comes from the low end; the table's pool is the cap; no "over 5 %" note.
        assert capped.max_model_len == estimate.max_model_len == 32_768
        assert capped.item("kv").bytes == 35_767 * 57_344
        assert not any(n.startswith("KV band") for n in capped.notes)
        note = next(n for n in capped.notes if n.startswith("KV pool capped"))
        assert "spans 33979-39216 tokens" in note
        assert "CUDA context (+ NCCL) before SGLang's baseline +/- 82 MiB" in note

    def test_the_cap_is_sglangs_minimum_at_the_central_estimate(self) -> None:
        """The operator pinning the same cap gets the same pool: the planner's model of SGLang's min()."""
        pinned = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang",
                                       gpus=hypothetical_gpus(["rtx4090"]),
                                       engine_args=("--max-total-tokens", "35767")))
        assert pinned.kv_cache_tokens == 35_767
        assert "--max-total-tokens" not in pinned.engine_args  # pinned: passed through, not added again
        assert not any(n.startswith("KV pool capped") for n in pinned.notes)

    def test_an_operators_cap_is_kept_and_the_band_named(self) -> None:
        """A cap above the pool is the operator's way to SGLang's whole pool: planned uncapped, band named."""
        plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang",
                                     gpus=hypothetical_gpus(["rtx4090"]),
                                     engine_args=("--max-total-tokens", "10000000")))
        assert plan.kv_cache_tokens == 36_598
        assert "--max-total-tokens" not in plan.engine_args
        assert any(n.startswith("KV band +/- 7.2%") for n in plan.notes)

    def test_a_narrow_band_is_not_capped(self) -> None:
        plan = _plan("qwen3-32b", "h100", cap=True)
        assert "--max-total-tokens" not in plan.engine_args and "max_total_tokens" not in plan.engine_figures

    def test_a_pinned_length_the_cap_would_not_carry_keeps_the_pool(self) -> None:
        """Qwen3-8B on an RTX 4090: 6074-8111 tokens, cap 6393. A pinned 6500 needs more: no cap, at risk;
        a pinned 6074 fits under it: capped."""
        def plan(*args: str) -> object:
            return make_plan(PlanRequest(model=resolve_model("qwen3-8b"), engine="sglang",
                                         gpus=hypothetical_gpus(["rtx4090"]), engine_args=args))
        above, within = plan("--context-length", "6500"), plan("--context-length", "6074")
        assert above.kv_cache_tokens == 7093 and "--max-total-tokens" not in above.engine_args
        assert above.at_risk == ("max_model_len",)
        assert within.kv_cache_tokens == 6393 == int(6074 / 0.95)
        assert within.engine_args[-2:] == ("--max-total-tokens", "6393") and within.may_not_fit is None

    def test_a_pool_the_plan_does_not_count_is_not_capped(self) -> None:
        """A speculative draft's pool or LoRA buffers come out of the same budget, uncounted: the low end is no
        floor, so no cap promises one (the plan warns instead)."""
        for flags in (("--speculative-algorithm", "EAGLE"), ("--enable-lora",)):
            plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang",
                                         gpus=hypothetical_gpus(["rtx4090"]), engine_args=flags))
            assert "--max-total-tokens" not in plan.engine_args, flags
            assert plan.warnings, flags

    def test_the_length_reason_tells_of_the_capped_pool(self) -> None:
        """Qwen3-8B on an RTX 4090: the length is the low end's (6,074 tokens) either way; the reason quotes the
        capped 6,393, not the uncapped 7,093."""
        capped = _plan("qwen3-8b", "rtx4090", cap=True)
        assert capped.kv_cache_tokens == 6393 and capped.max_model_len == 6074
        assert "6393 under the --max-total-tokens cap" in capped.max_model_len_source
        assert "7093" not in capped.max_model_len_source

    @staticmethod
    def _gpt_oss(version: str, cap: bool = True) -> Plan:
        return make_plan(PlanRequest(model=resolve_model("gpt-oss-20b"), engine="sglang",
                                     gpus=hypothetical_gpus(["rtx4090"]), engine_version=version,
                                     cap_uncertain_pool=cap))

    def test_a_hybrid_sliding_window_pool_is_capped_on_its_full_pool(self) -> None:
        """gpt-oss-20b on an RTX 4090, 0.5.23: 56,374-72,265 full-pool tokens (+/- 12.4 %, the loader's
        leftovers not derived for it). From 0.5.11 the cap bounds the full pool and the sliding pool follows
        at the ratio: --max-total-tokens 59,341 = int(56,374 / 0.95)."""
        estimate, capped = self._gpt_oss("0.5.23", cap=False), self._gpt_oss("0.5.23")
        assert (estimate.kv_cache_tokens, estimate.kv_cache_bytes_low) == (64_320, 2_493_805_363)
        assert any(n.startswith("KV band +/- 12.4%") for n in estimate.notes)
        assert capped.kv_cache_tokens == 59_341 == int(56_374 / 0.95)
        assert capped.engine_args[-2:] == ("--max-total-tokens", "59341")
        assert capped.max_model_len == estimate.max_model_len == 56_374  # the low end's either way
        assert (capped.kv_cache_bytes - capped.kv_cache_bytes_low) / capped.kv_cache_bytes <= 0.05 + 1e-6
        assert not any(n.startswith("KV band") for n in capped.notes)
        assert "capped by --max-total-tokens" in capped.item("kv").detail

    def test_before_0_5_11_the_flag_is_scaled_back_by_the_split(self) -> None:
        """0.5.9-0.5.10 cap the tokens profiled over full + sliding layers, then split them (full = T x (F + S)
        / (F + 0.8 S)): the flag is the full pool wanted scaled back, and the pool planned is the split of it."""
        capped = self._gpt_oss("0.5.9")
        flag = int(capped.engine_args[-1])
        assert capped.engine_args[-2] == "--max-total-tokens"
        # gpt-oss-20b: 12 full + 12 sliding layers of the same cell, so full = T x 2 / 1.8.
        assert capped.kv_cache_tokens == int(flag * 2 / 1.8) == 157_460
        low = capped.kv_cache_bytes_low / capped.kv_cache_bytes * capped.kv_cache_tokens
        assert round(low) == 149_588 and capped.kv_cache_tokens <= int(149_588 / 0.95)
        assert flag < capped.kv_cache_tokens

    def test_a_measured_start_narrows_the_band_and_lifts_the_cap(self) -> None:
        """After a start measured the CUDA context and the loader's leftovers, only the card's total is
        unknown (the catalog 4090's spread of published totals, +/- 41 MiB): +/- 1.8 %, no cap."""
        from launcher.plan.types import Calibration
        plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang",
                                     gpus=hypothetical_gpus(["rtx4090"]),
                                     calibration=Calibration(context_bytes=540 * MiB, load_overhead_bytes=150 * MiB,
                                                             key="k")))
        assert "--max-total-tokens" not in plan.engine_args
        assert round((plan.kv_cache_bytes_high - plan.kv_cache_bytes) / plan.kv_cache_bytes, 3) == 0.018


class TestContext:
    """What a rank holds below the CUDA total at SGLang's baseline, by board class (budget.py)."""

    def test_one_rank_holds_the_cuda_context_only(self) -> None:
        assert sb.parallel_bytes("NVIDIA GeForce RTX 4090", (8, 9), 1) == (0, 0)
        assert sb.parallel_bytes("NVIDIA H100 80GB HBM3", (9, 0), 1) == (0, 0)

    def test_nvswitch_hopper_holds_nvls_buffers(self) -> None:
        assert sb.parallel_bytes("NVIDIA H100 80GB HBM3", (9, 0), 8) == (1045 * MiB, 255 * MiB)
        assert sb.parallel_bytes("NVIDIA B200", (10, 0), 2) == (1045 * MiB, 255 * MiB)

    def test_pcie_and_consumer_cards_hold_little_beyond_the_context(self) -> None:
        for name, cc in (("NVIDIA GeForce RTX 4090", (8, 9)), ("NVIDIA H100 PCIe", (9, 0)),
                         ("NVIDIA H100 NVL", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0)),
                         ("NVIDIA GeForce RTX 5090", (12, 0))):
            assert sb.parallel_bytes(name, cc, 4) == (26 * MiB, 45 * MiB), name

    def test_the_plan_carries_the_class_and_its_band(self) -> None:
        request = PlanRequest(model=resolve_model("qwen3-32b"), engine="sglang", gpus=hypothetical_gpus(["2xh100"]),
                              engine_args=("--tp-size", "2"))
        context = make_plan(request).item("context")
        assert (context.bytes, context.error_bytes) == ((532 + 1045) * MiB, (117 + 255) * MiB)
        small = make_plan(dataclasses.replace(request, model=resolve_model("qwen2.5-7b"),
                                              gpus=hypothetical_gpus(["rtx4090"]), engine_args=()))
        assert (small.item("context").bytes, small.item("context").error_bytes) == (532 * MiB, 117 * MiB)


class TestMeasuredContext:
    """After a start, the context is what the plan's free memory and SGLang's "Load weight begin" differ by."""

    def _request(self, model: str, calibration: object = None) -> PlanRequest:
        return PlanRequest(model=resolve_model(model), engine="sglang", gpus=hypothetical_gpus(["rtx4090"]),
                           calibration=calibration)  # type: ignore[arg-type]

    def test_the_start_measures_the_context(self) -> None:
        from launcher.engines.events import EngineEvent
        from launcher.engines.sglang.runtime import SglangMeasurements
        plan = make_plan(self._request("qwen2.5-7b"))
        free = plan.item("pre_load").bytes + plan.item("context").bytes  # 23.645 GiB on the catalog 4090
        measured = SglangMeasurements(plan).feed(EngineEvent("pre_load", {"gib": 23.10}))
        assert measured is not None and measured.context_bytes == free - int(23.10 * GiB)
        assert SglangMeasurements(plan).feed(EngineEvent("pre_load", {"gib": 24.0})) is None  # more free than planned

    def test_measured_context_and_leftovers_bring_small_pools_within_five_percent(self) -> None:
        from launcher.plan.types import Calibration
        for model in ("qwen2.5-7b", "qwen3-8b", "llama-3.1-8b"):
            plan = make_plan(self._request(model, Calibration(context_bytes=600 * MiB, load_overhead_bytes=300 * MiB,
                                                              key="k")))
            context = plan.item("context")
            assert (context.bytes, context.error_bytes, context.source) == (600 * MiB, 10 * MiB, "calibrated")
            band = (plan.kv_cache_bytes_high - plan.kv_cache_bytes) / plan.kv_cache_bytes
            assert band <= 0.05, (model, band)  # 0.704 x (10 + 36 MiB of the catalog total's spread)
            assert not any(n.startswith("KV band") for n in plan.notes)


class TestHopperQwen3Vl:
    """0.5.20+ (arg_groups/model_overrides/qwen3_vl.py:34-62): Qwen3-VL on an H100 captures decode graphs up
    to a pinned --max-running-requests <= 512; the reserve grows 2 MiB per batch size."""

    def _fraction(self, gpu: str, *args: str, version: str = "0.5.23") -> sb.FractionDerivation:
        import json

        from launcher.engines.sglang.rules import pinned_flags, rules_for
        config = json.loads((Path(__file__).resolve().parents[2] / "data" / "configs" /
                             "qwen3-vl-8b-instruct.json").read_text())
        geometry = geometry_from_config({k: v for k, v in config.items() if not k.startswith("_")})
        card = hypothetical_gpus([gpu])[0]
        return sb.default_fraction(geometry, gpu_mem_mib=card.total_bytes / MiB, tp=1, pp=1,
                                   pinned=pinned_flags(args), rules=rules_for(version)[0],
                                   compute_capability=card.compute_capability)

    def test_hopper_raises_the_decode_bs_to_the_running_limit(self) -> None:
        assert self._fraction("h100").decode_max_bs == 256
        assert self._fraction("h100", "--max-running-requests", "400").decode_max_bs == 400
        assert self._fraction("h100", "--max-running-requests", "600").decode_max_bs == 256  # over 512

    def test_not_on_other_cards_versions_or_a_pinned_bs(self) -> None:
        assert self._fraction("a100-80gb", "--max-running-requests", "400").decode_max_bs == 256
        assert self._fraction("h100", "--max-running-requests", "400", version="0.5.19").decode_max_bs == 256
        assert self._fraction("h100", "--max-running-requests", "400",
                              "--cuda-graph-max-bs-decode", "128").decode_max_bs == 128


def test_llama_2_paths_cap_the_prefill_graph_at_4096_tokens() -> None:
    """0.5.20+ memory_hook.py:258-263: a model path naming llama-2 captures prefill buckets up to 4096
    tokens, not the 8192 chunk of an 80 GB card: 8 buckets (64 MiB of reserve) fewer."""
    from launcher.engines.sglang.rules import rules_for
    geometry = resolve_model("llama-3.1-8b").geometry
    kwargs = dict(gpu_mem_mib=81559, tp=1, pp=1, pinned={}, rules=rules_for("0.5.23")[0])
    plain = sb.default_fraction(geometry, **kwargs)  # type: ignore[arg-type]
    llama2 = sb.default_fraction(geometry, model_path="meta-llama/Llama-2-7b-hf", **kwargs)  # type: ignore[arg-type]
    assert (plain.prefill_buckets, llama2.prefill_buckets) == (58, 50)
    assert plain.graph_mib - llama2.graph_mib == 64
