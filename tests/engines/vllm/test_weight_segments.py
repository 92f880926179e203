"""Torch's segments around the weights, which vLLM's KV budget counts from 0.27 (launcher/engines/vllm/
weight_segments.py): the tensors derived against the modules vLLM 0.32 builds itself (tests/oracles/
vllm_params.py -> tests/data/vllm_params.json), tensor by tensor; the allocator's arithmetic by hand; the
row in the plan, on the releases that count it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.common.errors import WontFit
from launcher.common.units import GiB, MiB
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import weight_segments as vs
from launcher.model import allocator
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import ModelGeometry, geometry_from_config
from launcher.model.linear_tensors import MARLIN_WORKSPACE_BYTES, scheme
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Calibration, Plan, PlanRequest

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests" / "data" / "vllm_params.json").read_text())
BUILT = [record for record in GOLDEN["results"] if "error" not in record]
ELEMENT = {"bfloat16": 2, "float16": 2, "float32": 4}


def _geometry(record: dict[str, Any]) -> ModelGeometry:
    source = ROOT / record["source"]
    loaded = yaml.safe_load(source.read_text()) if source.suffix == ".yaml" else json.loads(source.read_text())
    return geometry_from_config(loaded["config"] if source.suffix == ".yaml" else loaded)


# The oracle groups tensors by their layer index; Gemma 3's wrapper has two stacks of layers (the SigLIP tower's
# `vision_tower...layers.N`, then the language model's `layers.N`), so one index holds a tower layer's 12 tensors
# ahead of a decoder layer's. Its tower (embeddings, layers, post layernorm) and projector come first
# (gemma3_mm.py: vision_tower, multi_modal_projector, then language_model), the last six entries of
# `after_layers` being the post layernorm (2), the projector (2), the normalizer and the embedding.
TOWER_LAYER_TENSORS = 12


def _sequence(record: dict[str, Any]) -> list[int]:
    """Every tensor vLLM allocates a block for, in creation order (an empty one takes none)."""
    kinds, after = record["layer_kinds"], record["after_layers"]
    tower = _geometry(record).vision_config.get("num_hidden_layers") \
        if record["architecture"] == "Gemma3ForConditionalGeneration" else None
    sizes = [tensor[3] for tensor in record["before_layers"]]
    if tower is None:
        for kind in record["layers"]:
            sizes += [tensor[3] for tensor in kinds[kind]]
        return [size for size in sizes + [tensor[3] for tensor in after] if size]
    for kind in record["layers"][:tower]:
        sizes += [tensor[3] for tensor in kinds[kind][:TOWER_LAYER_TENSORS]]
    sizes += [tensor[3] for tensor in after[:6]]
    for index, kind in enumerate(record["layers"]):
        sizes += [tensor[3] for tensor in kinds[kind][TOWER_LAYER_TENSORS if index < tower else 0:]]
    return [size for size in sizes + [tensor[3] for tensor in after[6:]] if size]


def _pools(sizes: list[int]) -> tuple[list[int], list[int]]:
    """The large pool's requests in order, the small pool's sorted (allocator.SMALL_SIZE)."""
    small = allocator.SMALL_SIZE
    return [size for size in sizes if size > small], sorted(size for size in sizes if size <= small)


def _derived(record: dict[str, Any], *, layers: int | None = None, first: bool = True,
             last: bool = True) -> list[int] | None:
    geometry = _geometry(record)
    tables = vb.rope_tables(geometry, dtype=record["dtype"], version=GOLDEN["meta"]["vllm"])
    return vs.stage_tensors(geometry, element=ELEMENT[record["dtype"]], tp=1, rope=tables.bytes if tables else 0,
                            layers=geometry.num_layers if layers is None else layers, first=first, last=last,
                            experts_tp=1)


DERIVED = [record for record in BUILT if _derived(record) is not None]


def plan(version: str = "0.28.0", gpu: str = "h100", model: str = "qwen2.5-7b",
         calibration: Calibration | None = None) -> Plan:
    return make_plan(PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpu]),
                                 engine_version=version, calibration=calibration))


def rows(p: Plan) -> dict[str, int]:
    return {item.key: item.bytes for item in p.budget}


class TestAgainstVllmsModules:
    def test_the_golden_file_is_vllms_own(self) -> None:
        assert GOLDEN["meta"]["vllm"] == "0.32.0" and len(GOLDEN["results"]) == 122
        assert all("layer_kinds" in record for record in BUILT)

    def test_derived_families(self) -> None:
        """The dense decoders, plain, AWQ and compressed-tensors FP8 (per channel and per tensor); Gemma, Gemma 2,
        Gemma 3 (text, and the wrapper with its tower on one rank) and the fused-MoE decoders (Qwen3-MoE, Mixtral,
        Qwen2-MoE with its shared expert, GLM-4.5-4.7 with dense first layers, DeepSeek-V2-Lite's MLA) plain."""
        families = {(record["architecture"], getattr(scheme(_geometry(record)), "name", "?")) for record in DERIVED}
        assert len(DERIVED) == 77
        assert families == {
            ("LlamaForCausalLM", None), ("MistralForCausalLM", None), ("Qwen2ForCausalLM", None),
            ("Qwen3ForCausalLM", None), ("Phi3ForCausalLM", None), ("GraniteForCausalLM", None),
            ("Glm4ForCausalLM", None), ("GemmaForCausalLM", None), ("Gemma2ForCausalLM", None),
            ("Gemma3ForCausalLM", None), ("Gemma3ForConditionalGeneration", None),
            ("Qwen3MoeForCausalLM", None), ("MixtralForCausalLM", None), ("Qwen2MoeForCausalLM", None),
            ("Glm4MoeForCausalLM", None), ("DeepseekV2ForCausalLM", None),
            ("LlamaForCausalLM", "awq"), ("Qwen2ForCausalLM", "awq"),
            ("Qwen3ForCausalLM", "awq"), ("LlamaForCausalLM", "fp8-tensor"), ("LlamaForCausalLM", "fp8-channel"),
            ("Qwen2ForCausalLM", "fp8-channel")}

    @pytest.mark.parametrize("record", DERIVED, ids=lambda record: record["id"])
    def test_tensor_by_tensor(self, record: dict[str, Any]) -> None:
        """The same tensors in the same order, so the same segments. Gemma 3's tower creates its position ids
        after the embeddings it registers them beside (siglip.py): the same tensors in each pool, the large
        pool's in the same order."""
        derived = _derived(record)
        assert derived is not None
        if record["architecture"] == "Gemma3ForConditionalGeneration":
            assert _pools(derived) == _pools(_sequence(record)) and derived != _sequence(record)
            assert allocator.slack_bytes(derived) == allocator.slack_bytes(_sequence(record))
        else:
            assert derived == _sequence(record)

    def test_glm4_moe_dense_layers_belong_to_the_first_stage(self) -> None:
        """GLM-4.5 (92 layers, the first 3 dense): over two stages the first holds the three dense MLPs, the second
        none; between them the model's tensors and a second rotary table (131,072 x 64 x 2 B); the router in
        float32 (160 x 5,120 x 4 B)."""
        record = next(record for record in DERIVED if record["id"] == "config:glm-4.5")
        geometry = _geometry(record)
        dense_gate_up = 2 * 12_288 * 5120 * 2
        first = vs.stage_tensors(geometry, element=2, tp=1, rope=131_072 * 64 * 2, layers=46, first=True,
                                 last=False, experts_tp=1)
        last = vs.stage_tensors(geometry, element=2, tp=1, rope=131_072 * 64 * 2, layers=46, first=False,
                                last=True, experts_tp=1, start=46)
        assert first is not None and last is not None
        assert first.count(dense_gate_up) == 3 and last.count(dense_gate_up) == 0
        assert sorted(first + last) == sorted(_sequence(record) + [131_072 * 64 * 2])
        assert 160 * 5120 * 4 in first

    def test_deepseek_v2_lite_mla_by_hand_and_a_q_lora_is_not_derived(self) -> None:
        """16 heads, kv_lora_rank 512, nope 128 + rope 64, v 128, hidden 2048: kv_a_proj_with_mqa [576, 2048]
        whole on each rank, q_proj [16 x 192, 2048] and kv_b_proj [16 x 256, 512] split by TP, o_proj [2048, 16 x
        128] too. DeepSeek-V3's q LoRA (fused q_a/kv_a projections) is not derived."""
        record = next(record for record in DERIVED if record["id"] == "deepseek-v2-lite")
        geometry = _geometry(record)
        derived = vs.stage_tensors(geometry, element=2, tp=2, rope=163_840 * 64 * 2, layers=27, first=True,
                                   last=True, experts_tp=2)
        assert derived is not None
        attention = [576 * 2048 * 2, 8 * 192 * 2048 * 2, 512 * 2, 8 * 256 * 512 * 2, 2048 * 8 * 128 * 2]
        start = derived.index(576 * 2048 * 2)
        assert derived[start:start + 5] == attention
        v3 = _geometry(next(record for record in GOLDEN["results"] if record["id"] == "config:deepseek-v3"))
        assert vs.stage_tensors(v3, element=2, tp=8, rope=0, layers=61, first=True, last=True, experts_tp=8) is None

    def test_gemma3_builds_two_rotary_tables_at_their_first_layers(self) -> None:
        """Gemma 3 4B: the local table (131,072 x 256 x 2 B) at layer 0, the first sliding layer; the full layers'
        (x 8 linear scaling) at layer 5, the first full one; the tower's 27 layers of 12 tensors first."""
        record = next(record for record in DERIVED if record["id"] == "config:gemma-3-4b-it")
        derived = _derived(record)
        assert derived is not None
        local, full = 131_072 * 256 * 2, 1_048_576 * 256 * 2
        assert derived.count(local) == 1 and derived.count(full) == 1
        assert derived.index(full) > derived.index(local)
        tower = 4 + 27 * TOWER_LAYER_TENSORS + 2 + 2
        assert derived[tower:tower + 2] == [2, 262_208 * 2560 * 2]  # the normalizer, then the embedding
        assert vs.stage_tensors(_geometry(record), element=2, tp=2, rope=local + full, layers=34, first=True,
                                last=True) is None  # the tower split over TP ranks is not derived

    def test_a_strangers_tower_of_a_billion_layers_is_bounded_not_listed(self) -> None:
        source = json.loads((ROOT / "tests" / "data" / "configs" / "gemma-3-4b-it.json").read_text())
        source["vision_config"]["num_hidden_layers"] = 10**9
        geometry = geometry_from_config(source)
        assert vs.stage_tensors(geometry, element=2, tp=1, rope=0, layers=34, first=True, last=True) is None
        segments = vs.weight_segments(geometry, element=2, tp=1, pp=1, rope=0, compute_capability=(9, 0),
                                      quantization=None)
        assert not segments.derived and segments.bytes == 34 * vs.BOUND_PER_LAYER // 2

    def test_the_figures_the_docstring_quotes(self) -> None:
        by_id = {record["id"]: allocator.slack_bytes(_sequence(record)) for record in DERIVED}
        assert round(by_id["llama-3.1-8b"] / MiB, 1) == 1.5
        assert round(by_id["qwen2.5-7b"] / MiB, 1) == 112.4  # the qkv biases, 2 MiB segments of their own size
        assert round(by_id["qwen3-14b-awq"] / MiB, 1) == 143.6
        assert round(by_id["qwen3-32b-awq"] / MiB, 1) == 256.0

    def test_pipeline_stages_split_the_layers_and_each_builds_its_rotary_table(self) -> None:
        """Two stages hold the model's tensors between them, the rotary table twice (each stage's first
        attention layer builds it), the embedding on the first and the lm_head on the last."""
        record = next(record for record in DERIVED if record["id"] == "llama-3.1-8b")
        first, last = _derived(record, layers=16, last=False), _derived(record, layers=16, first=False)
        assert first is not None and last is not None
        rope = 131_072 * 128 * 2
        assert sorted(first + last) == sorted(_sequence(record) + [rope])
        assert first[0] == last[-1] == 128_256 * 4096 * 2


class TestTheAllocator:
    def test_by_hand(self) -> None:
        """A scalar takes a 512 B block of a 2 MiB segment; 3 MiB a 20 MiB segment whose rest (17 MiB) the
        next 1-10 MiB request shares; 31.5 MiB a segment of its own rounded to 32; an empty tensor nothing."""
        assert allocator.slack_bytes([0]) == 0
        assert allocator.slack_bytes([4]) == 2 * MiB - 4
        assert allocator.slack_bytes([3 * MiB, 5 * MiB]) == 12 * MiB
        assert allocator.slack_bytes([int(31.5 * MiB)]) == MiB // 2
        assert allocator.slack_bytes([4] * 4096) == 2 * MiB - 4 * 4096  # 4096 blocks of 512 B fill one segment


class TestMarlinAndWhatIsNotDerived:
    GEOMETRY = _geometry(next(record for record in DERIVED if record["id"] == "qwen3-14b-awq"))

    def segments(self, capability: tuple[int, int] | None, quantization: str | None = None) -> vs.WeightSegments:
        return vs.weight_segments(self.GEOMETRY, element=2, tp=1, pp=1, rope=40_960 * 128 * 2,
                                  compute_capability=capability, quantization=quantization)

    def test_awq_is_replayed_through_marlins_repack_from_sm75(self) -> None:
        """Below sm75 the AWQ kernel keeps the checkpoint's tensors: 143.6 MiB around them, 76.1 of it free
        blocks (half counted, half the band). From sm75 (and on a card not known) the conversion and repack
        move 160 linear layers' tensors: 163.4 MiB, 95.9 free."""
        plain = self.segments((7, 0))
        assert (round(plain.bytes / MiB, 2), round(plain.error / MiB, 2)) == (143.6 - 38.05, 38.04)
        for capability in ((7, 5), (8, 9), None):  # T4, L4, a card not known (the safe side)
            repacked = self.segments(capability)
            assert (round(repacked.bytes / MiB, 2), round(repacked.error / MiB, 2)) == (115.47, 47.96)
            assert "Marlin repack of 160 linear layers" in repacked.rule and "95.9 MiB of them free" in repacked.rule

    def test_the_replay_by_hand(self) -> None:
        """Tensors in whole 2 MiB multiples of 10 MiB and more sit in segments of their own, and so do the
        conversion's eight-fold copies, which later requests reuse (best fit): the repacked qweight ends in the
        checkpoint qweight's 32 MiB segment, the packed zero points in the qzeros' 12, but the permuted scales
        (16 MiB) in the 32 MiB segment the converted qweight freed, 16 MiB of it left free; with the
        workspace's 2 MiB small segment less the workspace, 18 MiB less 1 KiB stay reserved beyond them, all
        of it free blocks."""
        tensors = [32 * MiB, 12 * MiB, 16 * MiB]  # qweight, qzeros, scales
        replayed = vs.awq_marlin_replay(tensors, [[0, 1, 2]])
        assert replayed.reserved - replayed.allocated == replayed.free_bytes == 18 * MiB - MARLIN_WORKSPACE_BYTES
        assert replayed.allocated == sum(tensors) + MARLIN_WORKSPACE_BYTES
        plain = vs.awq_marlin_replay(tensors, [])
        assert plain.reserved == sum(tensors) and allocator.slack_bytes(tensors) == 0

    def test_fp8_below_sm89_is_bounded(self) -> None:
        """compressed-tensors FP8 runs weight-only Marlin on an A100: its leftovers half counted, half the band
        (linear_tensors.marlin_leftovers), beside the segments around the tensors."""
        geometry = _geometry(next(record for record in DERIVED if record["id"] == "llama-3.1-8b-fp8"))
        a100, h100 = (vs.weight_segments(geometry, element=2, tp=1, pp=1, rope=131_072 * 128 * 2,
                                         compute_capability=capability, quantization=None)
                      for capability in ((8, 0), (9, 0)))
        assert "Marlin repack: 128 workspaces" in a100.rule and "Marlin" not in h100.rule
        assert a100.bytes - h100.bytes == 2 * MiB + a100.error - h100.error

    def test_a_pinned_awq_is_the_same_modules_another_method_is_not(self) -> None:
        assert self.segments((9, 0), "awq") == self.segments((9, 0))
        other = self.segments((9, 0), "fp8")
        assert not other.derived and other.bytes == other.error == 40 * 4 * allocator.ROUND_LARGE // 2

    def test_moe_experts_split_by_tensor_parallelism_not_by_expert_parallelism(self) -> None:
        """Qwen3-30B-A3B's experts split over the ranks are derived; whole experts per rank (EP) are bounded."""
        geometry = geometry_from_config(json.loads((ROOT / "tests" / "data" / "configs" / "qwen3-30b-a3b.json")
                                                   .read_text()))
        split, whole = (vs.weight_segments(geometry, element=2, tp=2, pp=1, rope=40_960 * 128 * 2,
                                           compute_capability=(9, 0), quantization=None, experts_tp=experts)
                        for experts in (2, None))
        # 110.1 MiB beyond the tensors at TP 2 (qkv_proj's 5 MiB share 20 MiB segments), 109.9 of it free blocks
        assert split.derived and "110.1 MiB of segments around 724 tensors of vLLM's Qwen3MoeForCausalLM" in split.rule
        assert (round(split.bytes / MiB, 2), round(split.error / MiB, 2)) == (55.13, 54.97)
        assert not whole.derived and whole.bytes == whole.error == 48 * 8 * MiB // 2

    def test_a_moe_model_is_bounded(self) -> None:
        geometry = resolve_model("deepseek-v2-lite").geometry
        bounded = vs.weight_segments(geometry, element=2, tp=1, pp=1, rope=0, compute_capability=(9, 0),
                                     quantization=None)
        assert not bounded.derived and bounded.bytes == bounded.error == 27 * 8 * MiB // 2


class TestThePlan:
    def test_counted_from_027(self) -> None:
        """0.26 budgets the weights as allocated; 0.27 and 0.28 what cudaMemGetInfo saw consumed, the segments
        with them: the KV is requested less every row."""
        assert "segments" not in rows(plan("0.26.0"))
        for version in ("0.27.0", "0.28.0"):
            budget = rows(plan(version))
            assert round(budget["segments"] / MiB, 1) == 84.7  # 112.4 MiB, 55.3 of it free blocks: half counted
            assert budget["kv"] == budget["requested"] - sum(
                budget[key] for key in ("weights", "segments", "non_torch", "activation", "cudagraph"))

    def test_the_l4_awq_start_replays_the_repack(self) -> None:
        """Qwen3-14B-AWQ on an L4 at 0.28: the tensors, then the AWQ conversion and Marlin repack replayed."""
        p = plan(model="qwen3-14b-awq", gpu="l4")
        row = next(item for item in p.budget if item.key == "segments")
        assert row.source == "computed" and (round(row.bytes / MiB, 2), round(row.error_bytes / MiB, 2)) == (115.47,
                                                                                                             47.96)
        assert "163.4 MiB of segments around 884 tensors of vLLM's Qwen3ForCausalLM modules, replayed" in row.detail

    def test_a_calibrated_plan_takes_the_measured_figure(self) -> None:
        calibrated = rows(plan(calibration=Calibration(non_kv_bytes=20 * GiB, key="k")))
        assert "segments" not in calibrated
        assert calibrated["kv"] == calibrated["requested"] - 20 * GiB


class TestTheLoadPeak:
    """vLLM 0.27+ converts an AWQ checkpoint for Marlin after loading, through int32 copies eight times each
    packed tensor: the weights and those copies must fit in the memory free at start."""

    def test_the_copies_of_the_largest_layer(self) -> None:
        """Qwen3-14B-AWQ: gate_up_proj's qweight is 85 MiB; at the peak its reordered copy, the shifted one
        (680 MiB each) and the repacked qweight sit beside the weights, with the segments' slack."""
        segments = TestMarlinAndWhatIsNotDerived().segments((8, 9))
        assert round(segments.load_peak_extra / GiB, 2) == 1.76
        assert TestMarlinAndWhatIsNotDerived().segments((7, 0)).load_peak_extra == 0  # no conversion below sm75

    def test_beyond_the_free_memory_the_load_is_refused(self) -> None:
        """Llama-3.1-70B-AWQ on an A100 40GB at --gpu-memory-utilization 0.95: 37.07 GiB of weights and 4.20 of
        copies, 38.94 GiB free: vLLM runs out of memory in process_weights_after_loading."""
        request = PlanRequest(model=resolve_model("llama-3.1-70b-awq"), engine="vllm",
                              gpus=hypothetical_gpus(["a10040gb"]), engine_version="0.28.0",
                              engine_args=("--gpu-memory-utilization", "0.95"))
        with pytest.raises(WontFit) as info:
            make_plan(request)
        assert info.value.rule == "load-peak" and "4.20 GiB of int32 copies" in str(info.value)
        assert "weights alone" not in str(info.value)

    def test_inside_the_free_memorys_error_a_doubt(self) -> None:
        """The same peak with as much free at start as it needs: inside the total's and context's error."""
        gpu = hypothetical_gpus(["l40s"])[0]
        probe = make_plan(PlanRequest(model=resolve_model("qwen3-32b-awq"), engine="vllm", gpus=(gpu,),
                                      engine_version="0.28.0"))
        weights = probe.item("weights").bytes
        peak = weights + vs.weight_segments(resolve_model("qwen3-32b-awq").geometry, element=2, tp=1, pp=1,
                                            rope=40_960 * 128 * 2, compute_capability=gpu.compute_capability,
                                            quantization=None).load_peak_extra
        context = probe.item("context").bytes
        tight = dataclasses.replace(gpu, free_bytes=peak + context)
        p = make_plan(PlanRequest(model=resolve_model("qwen3-32b-awq"), engine="vllm", gpus=(tight,),
                                  engine_version="0.28.0", engine_args=("--gpu-memory-utilization", "0.46")))
        assert p.may_not_fit and "the load may run out of memory" in p.may_not_fit


def test_kept_per_shape_not_per_config_dict() -> None:
    """The replay is kept per geometry, whose config dicts are outside its hash: a config that differs only in
    them (qkv biases, the AWQ group) is replayed on its own."""
    base = json.loads((ROOT / "tests" / "data" / "configs" / "llama-3.1-8b.json").read_text())
    plain, biased = (geometry_from_config({**base, "attention_bias": bias}) for bias in (False, True))
    assert plain == biased  # the dataclass compares neither
    segments = [vs.weight_segments(geometry, element=2, tp=1, pp=1, rope=131_072 * 128 * 2,
                                   compute_capability=(9, 0), quantization=None) for geometry in (plain, biased)]
    assert "around 388 tensors" in segments[0].rule and "around 420 tensors" in segments[1].rule


def test_a_doubt_on_the_request_does_not_hide_the_load() -> None:
    """A request just above the free memory (within the context's error: a doubt) and a load beyond it: the load
    still refuses, after the request's own check, as vLLM meets them."""
    gpu = hypothetical_gpus(["a10040gb"])[0]
    request = PlanRequest(model=resolve_model("llama-3.1-70b-awq"), engine="vllm", gpus=(gpu,), engine_version="0.28.0",
                          engine_args=("--gpu-memory-utilization", "0.95"))
    probe_free = make_plan(PlanRequest(model=resolve_model("llama-3.1-8b"), engine="vllm", gpus=(gpu,),
                                       engine_version="0.28.0")).item("context").bytes
    requested = -(-int(gpu.usable_total_bytes * 0.95) // 1)
    tight = dataclasses.replace(gpu, free_bytes=requested + probe_free - 64 * MiB)  # 64 MiB short: a doubt
    with pytest.raises(WontFit) as info:
        make_plan(dataclasses.replace(request, gpus=(tight,)))
    assert info.value.rule == "load-peak"
