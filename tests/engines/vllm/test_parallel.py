"""vLLM's data and expert parallelism (launcher/engines/vllm/parallel.py): the GPUs the ranks take, the experts a
rank holds, EPLB's redundant experts and buffers, the MoE profile under DP, and what vLLM refuses about them,
against hand arithmetic from the model configs and vLLM 0.34.0's rules."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UsageError, WontFit
from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import parallel as vp
from launcher.engines.vllm import rules as vr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import Quantization, geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
DSV3_BYTES = 688_586_727_753  # DeepSeek-V3's model.safetensors.index.json total_size


def geometry(name: str) -> Any:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return geometry_from_config({k: v for k, v in raw.items() if not k.startswith("_")})


def plan_for(name: str, weight_bytes: int, argv: list[str], *, gpus: str = "8x h200",
             version: str = "0.34.0", devices: Any = None) -> Plan:
    model = ResolvedModel(name=name, source="local", geometry=geometry(name), weight_bytes=weight_bytes,
                          weight_bytes_source="model.safetensors.index.json total_size",
                          config={})
    request = PlanRequest(model=model, engine="vllm", gpus=devices or hypothetical_gpus([gpus]),
                          engine_args=tuple(argv), engine_version=version)
    return make_plan(request)


def layout(argv: list[str], name: str = "deepseek-v3", *, version: str = "0.34.0") -> vp.Parallelism:
    pinned = vr.pinned_flags(argv)
    tp, pp = vr.ranks(pinned)
    return vp.parallelism(pinned, geometry(name), tp=tp, pp=pp, version=version)


class TestTheExperts:
    @pytest.mark.parametrize(("name", "layers"), [
        ("deepseek-v3", 58),  # 61 layers, the first 3 dense (first_k_dense_replace)
        ("kimi-k2-instruct", 60),  # first_k_dense_replace 1
        ("glm-4.5", 89),  # 92 - 3
        ("qwen3-30b-a3b", 48),  # decoder_sparse_step 1, no mlp_only_layers
        ("llama-4-maverick-17b-128e-instruct", 24),  # every second layer (interleave_moe_layer_step 2)
        ("llama-4-scout-17b-16e-instruct", 48),
        ("mixtral-8x7b-instruct-v0.1", 32), ("gpt-oss-120b", 36), ("minimax-m2", 62),
    ])
    def test_the_moe_layers_each_architecture_builds(self, name: str, layers: int) -> None:
        assert vp.moe_layer_count(geometry(name)) == layers

    def test_the_routed_experts_bytes_from_the_config(self) -> None:
        """DeepSeek-V3: 58 layers x 256 experts x (gate, up, down) 3 x 7168 x 2048 at fp8's 8 bits; its one
        shared expert a layer 58 x 3 x 7168 x 2048; Mixtral: 32 x 8 x 3 x 4096 x 14336 x 2 B."""
        dsv3 = vp.routed_experts(geometry("deepseek-v3"))
        assert dsv3 is not None and dsv3.checkpoint_bytes == 58 * 256 * 3 * 7168 * 2048
        assert dsv3.shared_bytes == 58 * 3 * 7168 * 2048
        mixtral = vp.routed_experts(geometry("mixtral-8x7b-instruct-v0.1"))
        assert mixtral is not None and mixtral.checkpoint_bytes == 32 * 8 * 3 * 4096 * 14336 * 2
        assert mixtral.shared_bytes == 0
        gpt_oss = vp.routed_experts(geometry("gpt-oss-120b"))  # MXFP4: 4 bits, scales left out (the safe side)
        assert gpt_oss is not None and gpt_oss.checkpoint_bytes == 36 * 128 * 3 * 2880 * 2880 // 2
        qwen = geometry("qwen3-30b-a3b")
        for method, bits, expected in (("gptq", 8, 8), ("gptq", None, 4), ("awq", 4, 4), ("fp8", None, 8)):
            quantized = vp.routed_experts(dataclasses.replace(qwen, quantization=Quantization(method, bits)))
            assert quantized is not None and quantized.bits == expected, method
        assert vp.routed_experts(dataclasses.replace(qwen, quantization=Quantization("compressed-tensors"))) is None

    def test_ernies_moe_num_experts_is_an_expert_count_as_vllm_reads_it(self) -> None:
        """transformers_utils/config.py:65-70 reads moe_num_experts too: EP on ERNIE 4.5 is not refused; its
        VL configs' per-modality list is not a count here."""
        base = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 2560,
                "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4, "vocab_size": 103424,
                "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536}
        assert geometry_from_config(base).num_experts == 64
        assert geometry_from_config({**base, "moe_num_experts": [64, 64]}).num_experts is None
        assert vp.refusals({"--tensor-parallel-size": 2, "--enable-expert-parallel": True}, geometry_from_config(base),
                           tp=2, pp=1, version="0.34.0", gpu_count=2) == []

    def test_an_architecture_whose_moe_layers_are_not_known_keeps_the_plain_share(self) -> None:
        for name in ("jamba-mini-1.7", "granite-4.0-h-small", "qwen3.5-397b-a17b", "llama-3.1-8b-instruct"):
            assert vp.routed_experts(geometry(name)) is None
        plain = vp.Parallelism(tp=1, pp=1, dp=8, dp_local=8, expert_parallel=True)
        assert vp.rank_weights(80 * GiB, plain, None) == (80 * GiB, "")


ORACLE = json.loads((CONFIGS.parent / "vllm_parallel_oracle.json").read_text())


@pytest.mark.parametrize("record", ORACLE["records"], ids=[
    f"E{r['experts']}-tp{r['tp']}-dp{r['dp']}{'-ep' if r['ep'] else ''}{'-eplb' if r['eplb'] else ''}"
    f"{'-R' + str(r['redundant_written']) if r['redundant_written'] is not None else ''}-{r['all2all']}"
    for r in ORACLE["records"]])
def test_the_split_is_vllms_own(record: dict[str, Any]) -> None:
    """tests/data/vllm_parallel_oracle.json: vLLM 0.34.0's FusedMoEParallelConfig.make, determine_expert_map,
    compute_eplb_num_redundant_experts and use_sequence_parallel_moe over a grid (tests/oracles/)."""
    pinned: dict[str, Any] = {"--tensor-parallel-size": record["tp"], "--data-parallel-size": record["dp"],
                              "--enable-expert-parallel": record["ep"], "--enable-eplb": record["eplb"],
                              "--all2all-backend": record["all2all"]}
    if record["redundant_written"] is not None:
        pinned["--eplb-config"] = json.dumps({"num_redundant_experts": record["redundant_written"]})
    g = dataclasses.replace(geometry("mixtral-8x7b-instruct-v0.1"), num_experts=record["experts"])
    split = vp.parallelism(pinned, g, tp=record["tp"], pp=1, version=ORACLE["vllm"])
    assert split.expert_parallel == record["use_ep"]
    assert (1 if split.expert_parallel else split.moe_ranks) == record["moe_tp"]
    assert (split.moe_ranks if split.expert_parallel else 1) == record["ep_size"]
    if split.expert_parallel:
        assert split.redundant_experts == (record["redundant"] if record["eplb"] else 0)
        assert vp.experts_on_rank(split, record["experts"]) == (record["local_experts"], record["experts"])
    else:
        assert record["local_experts"] == record["experts"]  # every expert, its intermediate size split
    assert split.sequence_parallel_moe == record["sequence_parallel_moe"]


def test_the_oracle_grid_has_remainders_redundancy_and_sequence_parallel_cases() -> None:
    records = ORACLE["records"]
    assert ORACLE["vllm"] == "0.34.0" and len(records) == 276
    assert any(r["use_ep"] and r["experts"] % r["ep_size"] for r in records)
    assert any(r["redundant"] and r["redundant_written"] is None for r in records)
    assert any(r["sequence_parallel_moe"] for r in records) and any(
        r["use_ep"] and r["tp"] > 1 and r["dp"] > 1 and not r["sequence_parallel_moe"] for r in records)


class TestWhatARankHolds:
    def test_dp_8_with_expert_parallelism_splits_the_experts_and_keeps_the_rest_whole(self) -> None:
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert routed is not None
        weights, how = vp.rank_weights(DSV3_BYTES, layout(["-dp", "8", "-ep"]), routed)
        assert weights == DSV3_BYTES - routed.checkpoint_bytes + routed.checkpoint_bytes * 32 // 256
        assert "32/256 a rank, the rest by tensor parallel 1" in how

    def test_without_expert_parallelism_the_experts_split_over_dp_x_tp_all_the_same(self) -> None:
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert routed is not None
        with_ep = vp.rank_weights(DSV3_BYTES, layout(["-dp", "8", "-ep"]), routed)[0]
        without = vp.rank_weights(DSV3_BYTES, layout(["-dp", "8"]), routed)
        assert without[0] == with_ep and "1/8 a rank" in without[1]

    def test_tp_alone_is_the_plain_share(self) -> None:
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert vp.rank_weights(DSV3_BYTES, layout(["-tp", "8"]), routed) == (DSV3_BYTES // 8, "")
        assert vp.rank_weights(DSV3_BYTES, layout(["-tp", "8", "-ep"]), routed)[0] == DSV3_BYTES // 8

    def test_ep_over_tp_alone_puts_the_remainder_on_the_first_ranks(self) -> None:
        """GLM-4.5's 160 experts over TP 12 with EP: the first rank holds 14, not 160 / 12."""
        g = geometry("glm-4.5")
        routed = vp.routed_experts(g)
        assert routed is not None
        total = 2 * routed.checkpoint_bytes
        split = vp.parallelism({"--tensor-parallel-size": 12, "--enable-expert-parallel": True}, g, tp=12, pp=1,
                               version="0.34.0")
        assert vp.rank_weights(total, split, routed)[0] == (total - routed.checkpoint_bytes) // 12 \
            + routed.checkpoint_bytes * 14 // 160

    def test_the_first_ranks_take_the_remainder(self) -> None:
        """GLM-4.5's 160 experts over 12 EP ranks: 13 each, the first 4 ranks 14 (expert_map_manager.py:67-69)."""
        assert vp.experts_on_rank(layout(["-dp", "12", "-ep"], "glm-4.5"), 160) == (14, 160)
        assert vp.experts_on_rank(layout(["-dp", "12"], "glm-4.5"), 160) == (1, 12)

    def test_shared_experts_are_whole_on_every_rank_under_sequence_parallel_moe(self) -> None:
        """EP, TP 4 and DP 2 with the default all2all: DeepSeek's shared experts are not split by TP."""
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert routed is not None
        sp = layout(["-dp", "2", "-tp", "4", "-ep"])
        assert sp.sequence_parallel_moe
        rest = DSV3_BYTES - routed.checkpoint_bytes
        expected = (rest - routed.shared_bytes) // 4 + routed.shared_bytes + routed.checkpoint_bytes * 32 // 256
        assert vp.rank_weights(DSV3_BYTES, sp, routed)[0] == expected
        other = layout(["-dp", "2", "-tp", "4", "-ep", "--all2all-backend", "flashinfer_nvlink_two_sided"])
        assert not other.sequence_parallel_moe

    def test_pipeline_stages_split_everything_again(self) -> None:
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert routed is not None
        staged = vp.rank_weights(DSV3_BYTES, layout(["-dp", "4", "-pp", "2", "-ep"]), routed)[0]
        single = vp.rank_weights(DSV3_BYTES, layout(["-dp", "4", "-ep"]), routed)[0]
        assert abs(staged - single // 2) <= 1


class TestEplb:
    def test_redundant_experts_as_written_or_vllms_default(self) -> None:
        """0.34 picks the least count that splits the experts evenly (config/parallel.py:652-684): GLM-4.5's 160
        over 12 ranks takes 8; 0.33 keeps 0."""
        assert layout(["-dp", "12", "-ep", "--enable-eplb"], "glm-4.5").redundant_experts == 8
        assert layout(["-dp", "12", "-ep", "--enable-eplb"], "glm-4.5", version="0.33.0").redundant_experts == 0
        assert layout(["-dp", "8", "-ep", "--enable-eplb", "--eplb-config.num_redundant_experts", "32"]) \
            .redundant_experts == 32
        assert layout(["-dp", "8", "-ep", "--enable-eplb", "--eplb-config", '{"num_redundant_experts": 16}']) \
            .redundant_experts == 16

    def test_the_dotted_key_replaces_an_explicit_json_as_flexible_argument_parser_merges_it(self) -> None:
        pinned = vr.pinned_flags(["--eplb-config.num_redundant_experts=8", "--eplb-config",
                                  '{"num_redundant_experts": 16, "window_size": 10}'])
        assert json.loads(pinned["--eplb-config"]) == {"num_redundant_experts": 8}
        assert vr.pinned_flags(["--eplb_config", '{"window_size": 10}'])["--eplb-config"] == '{"window_size": 10}'

    def test_redundant_experts_and_the_rearrangement_buffer_on_each_rank(self) -> None:
        """32 redundant experts over 8 ranks: 36 a rank; EPLB keeps one MoE layer of them (w13 and w2) and its
        maps: 0.34's logical_to_physical_map has R + 1 slots an expert, 0.33's 1024."""
        routed = vp.routed_experts(geometry("deepseek-v3"))
        assert routed is not None
        eplb = layout(["-dp", "8", "-ep", "--enable-eplb", "--eplb-config.num_redundant_experts", "32"])
        assert vp.rank_weights(DSV3_BYTES, eplb, routed)[0] == \
            DSV3_BYTES - routed.checkpoint_bytes + routed.checkpoint_bytes * 36 // 256
        buffer = routed.checkpoint_bytes // 58 * 36 // 256
        maps_034 = 58 * (288 * 8 + 256 * 33 * 8 + 256 * 16 + 288 * 4)
        maps_033 = 58 * (288 * 8 + 256 * 1024 * 8 + 256 * 16 + 288 * 4)
        g = geometry("deepseek-v3")
        assert vp.eplb_bytes(eplb, routed, version="0.34.0", checkpoint_bytes=DSV3_BYTES, geometry=g)[0] == \
            buffer + maps_034 + 1000 * 58 * 288 * 4
        assert vp.eplb_bytes(eplb, routed, version="0.33.0", checkpoint_bytes=DSV3_BYTES, geometry=g)[0] == \
            buffer + maps_033 + 1000 * 58 * 288 * 4
        assert vp.eplb_bytes(layout(["-dp", "8", "-ep"]), routed, version="0.34.0", checkpoint_bytes=DSV3_BYTES,
                             geometry=g) == (0, "")

    def test_a_pinned_load_window_is_the_window_held(self) -> None:
        routed = vp.routed_experts(geometry("deepseek-v3"))
        wide = layout(["-dp", "8", "-ep", "--enable-eplb", "--eplb-config.window_size", "100000"])
        default = layout(["-dp", "8", "-ep", "--enable-eplb"])
        g = geometry("deepseek-v3")
        grow = [vp.eplb_bytes(x, routed, version="0.34.0", checkpoint_bytes=DSV3_BYTES, geometry=g)[0]
                for x in (wide, default)]
        assert grow[0] - grow[1] == (100_000 - 1000) * 58 * 256 * 4

    def test_eplb_on_moe_layers_not_known_counts_a_whole_layer_a_rank(self) -> None:
        g = geometry("qwen3.5-397b-a17b")
        split = vp.parallelism({"--tensor-parallel-size": 8, "--enable-expert-parallel": True, "--enable-eplb": True},
                               g, tp=8, pp=1, version="0.34.0")
        held = vp.eplb_bytes(split, None, version="0.34.0", checkpoint_bytes=800 * GiB, geometry=g)[0]
        assert held >= 800 * GiB // g.num_layers // 8


def refused(argv: list[str], name: str = "deepseek-v3", *, gpus: int | None = 8, version: str = "0.34.0") -> list[str]:
    pinned = vr.pinned_flags(argv)
    tp, pp = vr.ranks(pinned)
    return [r.message for r in vp.refusals(pinned, geometry(name), tp=tp, pp=pp, version=version, gpu_count=gpus)]


class TestWhatVllmRefuses:
    def test_each_refusal_in_vllms_words(self) -> None:
        assert refused(["-dp", "8", "-ep"]) == []
        assert refused(["-tp", "2", "-ep"], "llama-3.1-8b-instruct") == [
            "Number of experts in the model must be greater than 0 when expert parallelism is enabled."]
        assert refused(["-dp", "8", "--enable-eplb"]) == ["enable_expert_parallel must be True to use EPLB."]
        assert refused(["-ep", "--enable-eplb"]) == [
            "EPLB requires tensor, prefill-context, or data parallelism, but got TP=1, PCP=1, DP=1."]
        assert refused(["-dp", "8", "-ep", "--eplb-config.num_redundant_experts", "8"]) == [
            "num_redundant_experts is set to 8 but EPLB is not enabled. Either enable EPLB or unset "
            "num_redundant_experts."]
        assert refused(["-dp", "8", "-ep", "--enable-eplb", "--eplb-config.num_redundant_experts", "4"]) == [
            "EPLB currently only supports even distribution of experts across ranks. Got 260 experts and 8 EP ranks."]
        assert refused(["-dp", "4", "-dpl", "8"]) == ["data_parallel_size_local (8) must be <= data_parallel_size (4)"]

    def test_0_33_has_no_automatic_redundancy_so_an_uneven_split_is_refused(self) -> None:
        argv = ["-dp", "12", "-ep", "--enable-eplb"]
        assert refused(argv, "glm-4.5", gpus=12) == []
        assert refused(argv, "glm-4.5", gpus=12, version="0.33.0") == [
            "EPLB currently only supports even distribution of experts across ranks. Got 160 experts and 12 EP ranks."]

    def test_too_few_gpus_for_the_dp_ranks_fails_in_the_worker(self) -> None:
        """DP rank r takes GPUs [r x P x T, (r + 1) x P x T): the first index past the node's GPUs fails."""
        assert refused(["-dp", "16", "-ep"]) == ["DP adjusted local rank 8 is out of bounds for 8 devices."]
        assert refused(["-dp", "2", "-tp", "4", "-ep"], gpus=6) == [
            "DP adjusted local rank 6 is out of bounds for 6 devices."]
        assert refused(["-dp", "16", "-ep", "--nnodes", "2"]) == []  # eight on each node
        assert refused(["-dp", "16", "-ep", "-dpl", "8"]) == []

    def test_moe_intermediate_size_must_split_over_dp_x_tp_without_expert_parallelism(self) -> None:
        """gpt-oss's experts (2880) over 16 ranks: 2880 % 16 == 0; over 7: not (fused_moe/config.py:1397)."""
        assert refused(["-dp", "16"], "gpt-oss-120b", gpus=16) == []
        assert refused(["-dp", "7"], "gpt-oss-120b", gpus=7)[0].startswith("assert intermediate_size % tp_size == 0")
        assert refused(["-dp", "7", "-ep"], "mixtral-8x7b-instruct-v0.1", gpus=7) == []

    def test_gpt_oss_splits_its_intermediate_size_over_the_whole_world_even_with_ep(self) -> None:
        """gpt_oss.py:389 asserts intermediate_size % world_size == 0, the world spanning every DP rank."""
        assert refused(["-dp", "7", "-ep"], "gpt-oss-120b", gpus=7) == [
            "assert config.intermediate_size % self.world_size == 0: gpt-oss's intermediate size 2880 over a world "
            "of 7 x 1 x 1 ranks"]
        assert refused(["-dp", "8", "-ep"], "gpt-oss-120b") == []

    def test_external_load_balancing_and_ray_run_one_dp_rank_here(self) -> None:
        """--data-parallel-rank / --data-parallel-external-lb: data_parallel_size_local is 1 (arg_utils.py:2481-2518);
        under Ray the ranks are placed by Ray: not refused for want of this node's GPUs."""
        for argv in (["-dp", "8", "-dpn", "3", "-ep"], ["-dp", "8", "-dpe", "--data-parallel-rank", "3", "-ep"],
                     ["-dp", "8", "-ep", "-dpb", "ray"]):
            assert refused(argv, gpus=1) == []
            assert vr.gpus_on_node(vr.pinned_flags(argv)) == 1
        assert layout(["-dp", "8", "-dpn", "3", "-ep"]).dp_local == 1

    def test_a_bad_eplb_config_is_a_usage_error(self) -> None:
        for argv in (["--eplb-config", "{"], ["--eplb-config", "[1]"], ["--eplb-config.num_redundant_experts", "-1"],
                     ["--eplb-config.num_redundant_experts", "many"], ["--eplb-config", "[" * 100_000],
                     ["--eplb-config.window_size", "0"]):
            with pytest.raises(UsageError, match="--eplb-config"):
                refused(argv)


class TestThePlan:
    def test_deepseek_v3_over_8_h200_with_dp_8_and_ep_is_planned_not_refused(self) -> None:
        """Was: 643 GiB of weights a rank, refused. Now the experts split over the 8 ranks, the rest whole. On 0.34
        each DP rank holds all 128 heads, and the sizing warmup up-projects a 64k-row workspace of cached context
        through them (0.34.0 v1/worker/gpu/warmup.py:531-545): T is that, 7 GiB and more, and the KV is at risk."""
        plan = plan_for("deepseek-v3", DSV3_BYTES, ["-dp", "8", "-ep"])
        tp8 = plan_for("deepseek-v3", DSV3_BYTES, ["-tp", "8"])
        weights = plan.item("weights")
        assert tp8.item("weights").bytes < weights.bytes < 120 * GiB and plan.max_model_len > 0
        assert "32/256 a rank" in weights.detail and plan.gpu_count == 8
        assert "MLA's context up-projection" in plan.item("kept_free").detail
        assert plan.item("kept_free").bytes > 7 * GiB

    def test_the_moe_profile_takes_every_dp_ranks_tokens(self) -> None:
        """DeepSeek-V3 at DP 8 with EP: the fused-MoE workspace for 8 x 8192 tokens x top-8 with whole experts
        (N = 2 x 2048 < H = 7168): 2 B x 65,536 x 8 x (7168 + 7168); the other 7 ranks' rows gathered and
        the experts' output before the reduce-scatter: 2 x 2 B x 7 x 8192 x 7168. Without EP the experts are
        split over the 8 ranks, the width still H."""
        g = geometry("deepseek-v3")
        rules = vr.rules_for("0.34.0")[0]
        peak = dict(vb.profile_peak(g, rules=rules, batched_tokens=8192, num_seqs=1024, tp=1, dp=8,
                                    expert_parallel=True).terms)
        assert peak["MoE workspace"] == 2 * 65_536 * 8 * (7168 + 7168) == 15_032_385_536
        assert peak["DP-gathered MoE rows"] == 2 * 2 * 7 * 8192 * 7168
        one = dict(vb.profile_peak(g, rules=rules, batched_tokens=8192, num_seqs=1024, tp=8).terms)
        assert one["MoE workspace"] == 2 * 8192 * 8 * (7168 + 7168) and one["DP-gathered MoE rows"] == 0
        dense = vb.profile_peak(geometry("llama-3.1-8b-instruct"), rules=vr.rules_for("0.34.0")[0],
                                batched_tokens=8192, num_seqs=1024, tp=1, dp=8)
        assert dict(dense.terms)["DP-gathered MoE rows"] == 0

    def test_a_dense_model_plans_each_dp_rank_like_one_server_on_the_tightest_gpu(self) -> None:
        gpus = hypothetical_gpus(["4x h100"])
        busy = dataclasses.replace(gpus[3], free_bytes=(gpus[3].free_bytes or 0) - 10 * GiB)
        alone = plan_for("llama-3.1-8b-instruct", 16 * GiB, [], devices=gpus)
        four = plan_for("llama-3.1-8b-instruct", 16 * GiB, ["-dp", "4"], devices=gpus)
        assert (four.kv_cache_bytes, four.item("weights").bytes) == (alone.kv_cache_bytes, alone.item("weights").bytes)
        assert four.gpu_count == 4
        tight = plan_for("llama-3.1-8b-instruct", 16 * GiB, ["-dp", "4"], devices=(*gpus[:3], busy))
        assert tight.kv_cache_bytes < four.kv_cache_bytes  # GPU 3 holds a DP rank too

    def test_online_fp8_under_dp_splits_its_saving_like_the_weights(self) -> None:
        """Mixtral, DP 8 with EP, --quantization fp8: the experts' saving (half their bytes) by 1/8, the rest's
        by T 1; was the whole model's saving on each rank (negative weights, more KV than the card)."""
        mixtral = 93_405_585_408
        plan = plan_for("mixtral-8x7b-instruct-v0.1", mixtral, ["-dp", "8", "-ep", "--quantization", "fp8"],
                        gpus="8x h100")
        plain = plan_for("mixtral-8x7b-instruct-v0.1", mixtral, ["-dp", "8", "-ep"], gpus="8x h100")
        routed = vp.routed_experts(geometry("mixtral-8x7b-instruct-v0.1"))
        assert routed is not None
        experts_saving = routed.checkpoint_bytes // 2 // 8
        saved = plain.item("weights").bytes - plan.item("weights").bytes
        assert experts_saving < saved < experts_saving + (mixtral - routed.checkpoint_bytes) // 2
        assert 0 < plan.item("weights").bytes and plan.kv_cache_bytes < 80 * GiB

    def test_gpt_oss_mxfp4_experts_hold_the_gathered_tokens_workspace_under_dp(self) -> None:
        """OAITritonExperts: (M x topk, N/2) + (M, K) + the kernel's (M x topk, K), bf16, M = 8 x 8192 here,
        beyond one rank's 8192 (what the one-rank logs hold): 57,344 x 2 x (4 x (2880 + 2880) + 2880)."""
        peak = dict(vb.profile_peak(geometry("gpt-oss-120b"), rules=vr.rules_for("0.34.0")[0], batched_tokens=8192,
                                    num_seqs=1024, tp=1, dp=8, expert_parallel=True).terms)
        assert peak["MoE workspace"] == 57_344 * 2 * (4 * (2880 + 2880) + 2880)

    def test_before_0_19_dp_with_ep_profiles_a_whole_moe_chunk(self) -> None:
        """0.12's modular kernel allocates a 16,384-token chunk in the profile under DP and EP."""
        g = geometry("deepseek-v3")
        legacy = dict(vb.profile_peak(g, rules=vr.rules_for("0.12.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                                      dp=8, expert_parallel=True).terms)
        assert legacy["MoE workspace"] == 2 * 16_384 * 8 * (7168 + 7168)
        assert legacy["DP-gathered MoE rows"] == 2 * 2 * 7 * 8192 * 7168

    def test_a_moe_models_dp_and_ep_groups_count_like_more_tensor_parallel_ranks(self) -> None:
        """NCCL's context and buffers for the DP and EP groups: DP 8 with TP 1 plans the parallel ranks'
        non-torch share, not one rank's; a dense model's DP ranks run alone."""
        moe = plan_for("deepseek-v3", DSV3_BYTES, ["-dp", "8", "-ep"]).item("non_torch")
        tp8 = plan_for("deepseek-v3", DSV3_BYTES, ["-tp", "8"]).item("non_torch")
        assert moe.bytes == tp8.bytes == vb.NON_TORCH_BYTES_TP_V019
        dense = plan_for("llama-3.1-8b-instruct", 16 * GiB, ["-dp", "4"], gpus="4x h100").item("non_torch")
        assert dense.bytes == vb.NON_TORCH_BYTES_TP1_V019

    def test_the_removed_all2all_backends_run_as_the_default(self) -> None:
        """0.19+ falls back from naive/pplx to allgather_reducescatter: the shared experts stay whole, no warning."""
        naive = layout(["-dp", "2", "-tp", "4", "-ep", "--all2all-backend", "naive"])
        assert naive.all2all == "allgather_reducescatter" and naive.sequence_parallel_moe
        assert vp.warnings(naive) == []

    def test_what_vllm_refuses_is_a_refusal_with_its_message(self) -> None:
        with pytest.raises(WontFit, match="DP adjusted local rank 8 is out of bounds for 8 devices") as caught:
            plan_for("deepseek-v3", DSV3_BYTES, ["-dp", "16", "-ep"])
        assert caught.value.rule == "dp-devices"
        with pytest.raises(WontFit, match="must be greater than 0 when expert parallelism is enabled"):
            plan_for("llama-3.1-8b-instruct", 16 * GiB, ["-tp", "2", "-ep"])

    def test_another_parallel_layout_is_another_calibration_setup(self) -> None:
        for flag in ("--data-parallel-size", "--enable-expert-parallel", "--enable-eplb", "--eplb-config"):
            assert flag in vr.CALIBRATION_KEY_FLAGS


def test_the_start_lock_covers_every_dp_ranks_gpus_on_the_node() -> None:
    """P x T GPUs for each DP rank on this node: the lock taken before free memory is read covers them all."""
    from launcher.engines import adapter

    vllm = adapter("vllm")
    assert vllm.gpus_on_node(vr.pinned_flags(["-dp", "4", "-tp", "2"])) == 8
    assert vllm.gpus_on_node(vr.pinned_flags(["-dp", "4", "-tp", "2", "--nnodes", "2"])) == 4
    assert vllm.gpus_on_node(vr.pinned_flags(["-dp", "4", "-dpl", "1", "-tp", "2"])) == 2
    assert vllm.gpus_on_node(vr.pinned_flags(["-tp", "2", "-pp", "2"])) == 4
    assert adapter("sglang").gpus_on_node({"--tp-size": 2}) == 2


def test_an_all2all_backend_with_buffers_of_its_own_is_said_not_counted() -> None:
    plan = plan_for("deepseek-v3", DSV3_BYTES, ["-dp", "8", "-ep", "--all2all-backend", "deepep_high_throughput"])
    assert any("--all2all-backend deepep_high_throughput" in w and "does not count" in w for w in plan.warnings)
    plain = plan_for("deepseek-v3", DSV3_BYTES, ["-dp", "8", "-ep", "--all2all-backend", "allgather_reducescatter"])
    assert not any("--all2all-backend" in w for w in plain.warnings)


def test_counts_in_the_eplb_config_are_read_as_pydantic_reads_them() -> None:
    """vLLM 0.34's EPLBConfig (pydantic, lax) takes "8", 8.0 and true as 8, 8 and 1 (run on its parser)."""
    for written, count in (('"8"', 8), ("8.0", 8), ("true", 1)):
        argv = ["-dp", "8", "-ep", "--enable-eplb", "--eplb-config", f'{{"num_redundant_experts": {written}}}']
        assert vp.eplb_config(vr.pinned_flags(argv))["num_redundant_experts"] == count
    with pytest.raises(UsageError, match="num_redundant_experts 8.5 is not a count"):
        vp.eplb_config(vr.pinned_flags(["--eplb-config", '{"num_redundant_experts": 8.5}']))
