"""The planner: worked examples, pinned flags, refusals with computed alternatives."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.common.errors import ExitCode, UsageError, WontFit
from launcher.common.units import GiB, MiB
from launcher.engines import sglang as sg
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.gpu import GpuDevice, GpuProcess, HostMemory
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from tests.model.test_config import LLAMA_8B


def request(model: str = "llama-3.1-8b", gpu: str = "24576MiB", **changes: object) -> PlanRequest:
    """vLLM 0.33, the last release that sizes the KV cache before warmup: the worked examples are its
    arithmetic (0.34's extensible KV cache: tests/engines/vllm/test_extensible_kv_cache.py)."""
    base = PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpu]),
                       engine_version="0.33.0")
    return dataclasses.replace(base, **changes)


class TestWorkedExampleA:
    """Llama-3.1-8B bf16 on 24 GiB (24576 MiB)."""

    def test_vllm_upper_bound_before_activations(self) -> None:
        """0.92 x 24 GiB - weights (and vLLM's 32 MiB rotary table) = 7.09 GiB = 58,091 tokens of 128 KiB,
        before activations and graphs."""
        plan = make_plan(request())
        requested, weights = plan.item("requested").bytes, plan.item("weights").bytes
        upper = requested - weights
        assert round(upper / GiB, 2) == 7.09
        assert upper // (128 * 1024) == 58091
        # The plan then subtracts the allocator's segments around the weights (counted from 0.27), the activation
        # peak, non-torch memory and the graph estimate.
        assert plan.kv_cache_bytes == upper - sum(plan.item(k).bytes
                                                  for k in ("segments", "non_torch", "activation", "cudagraph"))

    def test_vllm_tokens_are_whole_blocks(self) -> None:
        """The predicted tokens are the blocks the KV bytes hold at 2 MiB per 16-token block."""
        plan = make_plan(request())
        assert plan.num_blocks == plan.kv_cache_bytes // (2 * MiB)
        assert plan.max_model_len % 16 == 0 and plan.max_concurrency >= 1.0

    def test_sglang_default_fraction_and_pool(self) -> None:
        """SGLang's default is 0.704 on 24576 MiB; f x 24 GiB - weights = 1.94 GiB = 15,879 tokens."""
        geometry = geometry_from_config(LLAMA_8B)
        derivation = sg.default_fraction(geometry, gpu_mem_mib=24576, tp=1, pp=1, pinned={},
                                         rules=sg.rules_for(None)[0])
        assert derivation.fraction == 0.704 and derivation.reserved_mib == 7280
        tokens, budget = sg.pool_tokens(pre_load_bytes=24 * GiB, after_load_bytes=24 * GiB - 16060522496,
                                        fraction_value=0.704, cell_bytes=131072, page_size=1, max_total_tokens=None)
        assert round(budget / GiB, 2) == 1.94 and tokens == 15879

    def test_sglang_chunked_2048_gives_about_5_gib(self) -> None:
        """With --chunked-prefill-size 2048 the reserve shrinks and the pool is ~4.99 GiB."""
        geometry = geometry_from_config(LLAMA_8B)
        derivation = sg.default_fraction(geometry, gpu_mem_mib=24576, tp=1, pp=1,
                                         pinned={"--chunked-prefill-size": 2048}, rules=sg.rules_for(None)[0])
        _, budget = sg.pool_tokens(pre_load_bytes=24 * GiB, after_load_bytes=24 * GiB - 16060522496,
                                   fraction_value=derivation.fraction, cell_bytes=131072, page_size=1,
                                   max_total_tokens=None)
        assert round(budget / GiB, 2) == 4.99


class TestWorkedExampleB:
    def test_qwen25_7b_hand_estimate_and_ours(self) -> None:
        """Hand: 24 x 0.9 - ~15 weights - flat 2 = 4.6 GiB = ~86,000 tokens; ours shows each difference."""
        hand = (24 * 0.9 - 15 - 2) * GiB
        assert round(hand / GiB, 1) == 4.6 and round(hand / 57344, -3) == 86000
        model = resolve_model("qwen2.5-7b")
        plan = make_plan(request("qwen2.5-7b", "24GiB", engine_args=("--gpu-memory-utilization", "0.9")))
        # Differences, each an item: real weights are 14.19 GiB, not 15; the activation peak of a
        # 2048-token profile run, non-torch memory, CUDA graphs and (from 0.27) the allocator's segments around
        # the weights replace the flat 2 GiB.
        rope = 32768 * 128 * 2  # vLLM's rotary table, built with the model (bfloat16)
        assert plan.item("weights").bytes == model.weight_bytes + rope and round(model.weight_bytes / GiB, 2) == 14.19
        itemised = sum(plan.item(k).bytes for k in ("segments", "non_torch", "activation", "cudagraph"))
        assert plan.kv_cache_bytes == plan.item("requested").bytes - model.weight_bytes - rope - itemised
        # Our figure minus the hand figure is exactly: the real weights' saving, the flat reserve
        # against our items (the sampler's peak over 256 x 152,064 logits dominates), and
        # vLLM's ceil() of the request.
        difference = plan.kv_cache_bytes - hand
        parts = (15 * GiB - model.weight_bytes - rope) + (2 * GiB - itemised) \
            + (plan.item("requested").bytes - 21.6 * GiB)
        assert abs(difference - parts) < 1
        # vLLM 0.33 (V2 runner): logits 2 B + warmup fp32 copy 4 B over 256 x 152,064, the top-k/top-p
        # buffer (132 x V x 4) and the hidden states (2048 x 3584 x 2) beat the MLP forward
        # (2048 x (3 x 18944 + 4 x 3584) x 2 = 0.27 GiB); + 0.05 GiB constant + the penalty state
        # int32 [256, V] (+ its bit mask) = 0.51 GiB.
        assert round(plan.item("activation").bytes / GiB, 2) == 0.51
        assert plan.knob.value == plan.engine_figures["gpu_memory_utilization"] == 0.9
        assert "--gpu-memory-utilization" not in plan.engine_args
        # vLLM 0.19 (V1 runner): the sampler holds 14 B per logit: 256 x 152,064 x 14 + buffer + hidden
        # + constant = 0.65 GiB (the old 9.5 fp32 copies gave 1.38).
        old = make_plan(request("qwen2.5-7b", "24GiB", engine_version="0.19.0",
                                engine_args=("--gpu-memory-utilization", "0.9")))
        assert round(old.item("activation").bytes / GiB, 2) == 0.65


class TestSglangFractionTable:
    """SGLang 0.5.23's own resolution (reference §1.6, produced by running its code)."""

    @pytest.mark.parametrize(("mib", "tp", "pinned", "expected"), [
        (15360, 1, {}, 0.735), (16384, 1, {}, 0.752), (20480, 1, {}, 0.645), (23028, 1, {}, 0.684),
        (24564, 1, {}, 0.704), (24576, 2, {}, 0.699), (24576, 4, {}, 0.679), (24576, 8, {}, 0.658),
        (40960, 1, {}, 0.823), (40960, 4, {}, 0.807), (49140, 1, {}, 0.853), (61440, 1, {}, 0.774),
        (81559, 1, {}, 0.83), (81559, 2, {}, 0.828), (81559, 4, {}, 0.819), (81559, 8, {}, 0.812),
        (143771, 1, {}, 0.903), (143771, 8, {}, 0.893), (183359, 1, {}, 0.854), (183359, 8, {}, 0.849),
        (24576, 1, {"--disable-cuda-graph": True}, 0.724), (24576, 1, {"--disable-prefill-cuda-graph": True}, 0.72),
        (24576, 1, {"--max-running-requests": 16}, 0.706), (24576, 1, {"--cuda-graph-max-bs-decode": 64}, 0.702),
        (24576, 1, {"--chunked-prefill-size": 8192}, 0.451), (24576, 1, {"--chunked-prefill-size": -1}, -0.03),
        (24576, 1, {"--max-total-tokens": 2000}, 0.707), (81920, 1, {"--chunked-prefill-size": 2048}, 0.875),
    ])
    def test_llama_fraction(self, mib: int, tp: int, pinned: dict, expected: float) -> None:
        """The default fraction for Llama-3.1-8B matches SGLang's own output."""
        geometry = geometry_from_config(LLAMA_8B)
        derivation = sg.default_fraction(geometry, gpu_mem_mib=mib, tp=tp, pp=1, pinned=pinned,
                                         rules=sg.rules_for(None)[0])
        assert derivation.fraction == expected

    def test_pp2_turns_prefill_graph_off(self) -> None:
        """--pp-size 2 disables the breakable prefill graph: 0.715 on 24576 MiB."""
        geometry = geometry_from_config(LLAMA_8B)
        assert sg.default_fraction(geometry, gpu_mem_mib=24576, tp=1, pp=2, pinned={},
                                   rules=sg.rules_for(None)[0]).fraction == 0.715

    @pytest.mark.parametrize(("mib", "expected"), [(24576, 0.658), (81920, 0.817)])
    def test_mla_flat_reserve(self, mib: int, expected: float) -> None:
        """DeepSeek-V2-Lite (MLA) reserves a flat 1.5 GiB for the prefill graph."""
        geometry = resolve_model("deepseek-v2-lite").geometry
        assert sg.default_fraction(geometry, gpu_mem_mib=mib, tp=1, pp=1, pinned={},
                                   rules=sg.rules_for(None)[0]).fraction == expected


class TestPinnedAndTenants:
    def test_pinned_length_is_kept_and_not_added(self) -> None:
        """A pinned --max-model-len is kept and the plan adds only the utilization."""
        plan = make_plan(request(engine_args=("--max-model-len", "8192")))
        assert plan.max_model_len == 8192 and plan.engine_args == ("--gpu-memory-utilization", "0.92")

    def test_other_tenants_lower_the_utilization(self) -> None:
        """With 10 GiB held by another process the utilization comes from free memory, not total."""
        busy = GpuDevice(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=81559 * MiB, free_bytes=70 * GiB,
                         cuda_total_bytes=79 * GiB + 200 * MiB, compute_capability=(9, 0),
                         processes=(GpuProcess(pid=4121, used_bytes=10 * GiB, kind="compute", name="python"),))
        plan = make_plan(request(gpus=(busy,)))
        assert plan.engine_figures["gpu_memory_utilization"] < 0.92
        assert plan.item("requested").bytes <= 70 * GiB - plan.item("context").bytes - 256 * MiB
        assert "pid 4121 python" in plan.item("other").detail

    def test_pinned_utilization_above_free_refuses(self) -> None:
        """vLLM refuses to start when free < total x utilization; we say so first (exit 78)."""
        busy = GpuDevice(index=0, name="x", total_bytes=24 * GiB, free_bytes=12 * GiB, cuda_total_bytes=24 * GiB)
        with pytest.raises(WontFit, match="refuse to start") as info:
            make_plan(request(gpus=(busy,), engine_args=("--gpu-memory-utilization", "0.9")))
        assert info.value.exit_code == ExitCode.CONFIG

    def test_max_gpu_memory_caps_the_request(self) -> None:
        """--max-gpu-memory 40GiB on an 80 GB card keeps context + requested under 40 GiB."""
        plan = make_plan(request("qwen2.5-7b", "81559MiB", max_gpu_memory_bytes=40 * GiB))
        assert plan.item("requested").bytes + plan.item("context").bytes <= 40 * GiB


class TestWontFit:
    def test_too_long_pinned_length_offers_computed_alternatives(self) -> None:
        """Llama-8B at 131072 tokens on 24 GiB will not fit; each alternative was planned."""
        with pytest.raises(WontFit) as info:
            make_plan(request(engine_args=("--max-model-len", "131072")))
        alternatives = info.value.alternatives
        assert any(a.startswith("--max-model-len ") for a in alternatives)
        assert any("--kv-cache-dtype fp8" in a for a in alternatives)
        shorter = int(alternatives[0].split()[1])
        assert 16 <= shorter < 131072
        assert make_plan(request(engine_args=("--max-model-len", str(shorter)))).max_model_len == shorter

    def test_tensor_parallel_alternative_needs_the_gpus(self) -> None:
        """Llama-70B on 2 x 96 GB: TP 2 is offered only because two GPUs are there. (On 2 x 80 GB its
        2.47 GiB of KV has a band of +/- 2.77 GiB: it no longer holds at the band's low end.)"""
        with pytest.raises(WontFit) as info:
            make_plan(request("llama-3.1-70b", "2x97871MiB"))
        assert any(a.startswith("--tensor-parallel-size 2") for a in info.value.alternatives)

    def test_more_ranks_than_gpus(self) -> None:
        """TP 4 with one visible GPU is refused with the count."""
        with pytest.raises(WontFit, match="need 4 GPUs; 1 visible"):
            make_plan(request(engine_args=("--tensor-parallel-size", "4")))


class TestCpuPlan:
    def test_env_space_is_pinned(self) -> None:
        """VLLM_CPU_KVCACHE_SPACE=1 is kept: 1 GiB of KV, nothing added to the env."""
        host = HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB)
        plan = make_plan(request("qwen2.5-7b", device="cpu", gpus=(), host=host,
                                 engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"}, engine_args=("--max-model-len", "4096")))
        assert plan.kv_cache_bytes == GiB and plan.engine_env == {} and plan.block_size == 128
        assert plan.num_blocks == GiB // (128 * 57344)

    def test_space_chosen_in_whole_gib(self) -> None:
        """Unpinned, the plan sets VLLM_CPU_KVCACHE_SPACE to the whole GiB the requests need."""
        host = HostMemory(total_bytes=24 * GiB, available_bytes=22 * GiB)
        plan = make_plan(request("qwen2.5-7b", device="cpu", gpus=(), host=host, concurrency=2,
                                 engine_args=("--max-model-len", "16384")))
        needed = 2 * 16384 * 57344
        assert plan.engine_figures["cpu_kvcache_space_gib"] == -(-(needed + 128 * 57344) // GiB)
        assert plan.engine_env == {"VLLM_CPU_KVCACHE_SPACE": str(plan.engine_figures["cpu_kvcache_space_gib"])}


def test_bad_concurrency_is_a_usage_error() -> None:
    """--concurrency 0 is refused as a usage error."""
    with pytest.raises(UsageError):
        make_plan(request(concurrency=0))


class TestCpuRefusals:
    """Combinations the real CPU engine accepted at start and then failed (tests/data/vllm_cpu_truth.json)."""

    def _request(self, model_config: dict, args: tuple[str, ...]) -> PlanRequest:
        from launcher.model.resolve import ResolvedModel

        model = ResolvedModel(name="tiny", source="local", geometry=geometry_from_config(model_config),
                              weight_bytes=2**20, weight_bytes_source="test", config=model_config)
        return PlanRequest(model=model, engine="vllm", device="cpu",
                           host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=False),
                           engine_args=("--max-model-len", "4096", *args), engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"})

    def test_mla_with_fp8_kv_is_refused(self) -> None:
        """CPU MLA without AMX with an fp8 KV cache dies at the first request: refused with exit 78."""
        config = resolve_model("deepseek-v2-lite").config
        with pytest.raises(WontFit, match="Float8_e4m3fn"):
            make_plan(self._request(config, ("--kv-cache-dtype", "fp8")))

    def test_block_16_on_full_attention_is_refused(self) -> None:
        """Block 16 on a full-attention model stops the CPU engine after sizing."""
        with pytest.raises(WontFit, match="No common block size for 16"):
            make_plan(self._request(LLAMA_8B, ("--block-size", "16")))


class TestMultiNode:
    def test_each_node_plans_its_share_of_the_ranks(self) -> None:
        """TP 8 over --nnodes 2 needs 4 GPUs on this node; the per-rank KV is the same as on 8."""
        on_node = make_plan(request("llama-3.1-70b", "4xh100", engine="sglang",
                                    engine_args=("--tp-size", "8", "--nnodes", "2")))
        single_node = make_plan(request("llama-3.1-70b", "8xh100", engine="sglang", engine_args=("--tp-size", "8")))
        assert on_node.gpu_count == 4 and single_node.gpu_count == 8
        assert on_node.kv_cache_tokens == single_node.kv_cache_tokens

    def test_uneven_split_is_a_usage_error(self) -> None:
        """6 ranks cannot be split over 4 nodes."""
        with pytest.raises(UsageError, match="do not split evenly"):
            make_plan(request("llama-3.1-70b", "2xh100", engine_args=("--tensor-parallel-size", "6",
                                                                      "--nnodes", "4")))


def test_trust_engine_plan_leaves_sizing_to_the_engine() -> None:
    """--trust-engine turns a refusal into a plan that adds no flags and predicts no tokens."""
    from launcher.plan.planner import engine_decides

    refused = request(engine_args=("--max-model-len", "131072"), trust_engine=True)
    with pytest.raises(WontFit) as info:
        make_plan(refused)
    plan = engine_decides(refused, info.value)
    assert plan.engine_args == () and plan.kv_cache_tokens == 0 and plan.max_model_len == 131072
    assert plan.block_size == 16 and "the engine decides" in plan.notes[0]


class TestFlagsThatChangeTheBudget:
    def test_no_chunked_prefill_profiles_the_whole_length(self) -> None:
        """Without chunked prefill vLLM profiles max(max_model_len, 2048) tokens: a bigger activation peak."""
        chunked = make_plan(request("qwen2.5-7b", "rtx4090", engine_args=("--max-model-len", "32768")))
        whole = make_plan(request("qwen2.5-7b", "rtx4090", engine_args=("--max-model-len", "32768",
                                                                        "--no-enable-chunked-prefill")))
        assert "32768 batched tokens" in whole.item("activation").detail
        assert whole.item("activation").bytes > 2 * chunked.item("activation").bytes
        assert whole.kv_cache_bytes < chunked.kv_cache_bytes

    def test_cpu_offload_moves_weights_off_the_gpu(self) -> None:
        """--cpu-offload-gb 4 leaves 4 GiB fewer weights on the GPU and that much more KV."""
        plain = make_plan(request("qwen2.5-7b", "rtx4090", engine_args=("--max-model-len", "8192")))
        offload = make_plan(request("qwen2.5-7b", "rtx4090", engine_args=("--max-model-len", "8192",
                                                                          "--cpu-offload-gb", "4")))
        assert plain.item("weights").bytes - offload.item("weights").bytes == 4 * GiB
        assert offload.kv_cache_bytes - plain.kv_cache_bytes == 4 * GiB

    def test_auto_length_is_held_to_the_concurrency(self) -> None:
        """vLLM's auto-fit sizes for one request; asking for 4 at that length is refused with alternatives."""
        one = make_plan(request("qwen2.5-7b", "l4", engine_args=("--max-model-len", "auto")))
        assert one.max_model_len == 32768 and "auto-fit" in one.max_model_len_source
        # Three at 32,768 (5.25 GiB) fit only at the favourable end of the error band (4.09-5.39 GiB): kept, with
        # the doubt said; four (7.00 GiB) not even there.
        three = make_plan(request("qwen2.5-7b", "l4", concurrency=3, engine_args=("--max-model-len", "auto")))
        assert three.max_model_len == 32768 and three.may_not_fit and "favourable end" in three.may_not_fit
        with pytest.raises(WontFit) as info:
            make_plan(request("qwen2.5-7b", "l4", concurrency=4, engine_args=("--max-model-len", "auto")))
        assert any(a.startswith("--max-model-len ") for a in info.value.alternatives)

    def test_packed_kv_dtypes_are_not_guessed(self) -> None:
        """fp8_ds_mla packs 656 B per token: refused rather than sized as 1 byte per element."""
        with pytest.raises(UsageError, match="fp8_ds_mla"):
            make_plan(request("deepseek-v2-lite", "h100", engine_args=("--kv-cache-dtype", "fp8_ds_mla")))


class TestCalibrationScope:
    def test_calibrated_rows_add_up(self) -> None:
        """With a calibration the table shows one measured non-KV row; requested = weights + it + KV."""
        from launcher.plan.types import Calibration

        plan = make_plan(request("qwen2.5-7b", "l40s", calibration=Calibration(non_kv_bytes=16 * GiB, key="k")))
        keys = [i.key for i in plan.budget]
        assert "activation" not in keys and "measured_non_kv" in keys
        parts = plan.item("weights").bytes + plan.item("measured_non_kv").bytes + plan.kv_cache_bytes
        assert parts == plan.item("requested").bytes

    def test_alternatives_do_not_reuse_another_setups_measurement(self) -> None:
        """A calibration of 1 x 4090 does not shrink the TP 2 or AWQ alternatives."""
        from launcher.plan.types import Calibration

        variants = tuple(resolve_model(a) for a in resolve_model("qwen2.5-7b").quantized_variants)
        args = ("--max-model-len", "32768")
        plain = request("qwen2.5-7b", "2xrtx4090", concurrency=8, engine_args=args, variants=variants)
        measured = dataclasses.replace(plain, calibration=Calibration(non_kv_bytes=int(16.5 * GiB), key="k"))
        with pytest.raises(WontFit) as without:
            make_plan(plain)
        with pytest.raises(WontFit) as with_calibration:
            make_plan(measured)
        others = [a for a in without.value.alternatives if not a.startswith("--max-model-len")]
        assert others and all(a in with_calibration.value.alternatives for a in others)


@pytest.mark.parametrize(("text", "key"), [("0.11.0rc1", (0, 11, 0)), ("v0.10.2", (0, 10, 2)),
                                           ("0.8.5.dev169+g1234abc", (0, 8, 5)), ("0.6.6.post1", (0, 6, 6))])
def test_version_key_reads_the_release(text: str, key: tuple[int, ...]) -> None:
    from launcher.engines.versions import version_key

    assert version_key(text).release == key


def test_version_key_orders_as_pip_does() -> None:
    """A release candidate comes before its release (packaging.version), a post-release after."""
    from launcher.engines.versions import version_key

    assert version_key("0.10.0rc1") < version_key("0.10.0") < version_key("0.10.0.post1") < version_key("0.10.1")
    assert version_key("0.8.5.dev169+g1234abc") < version_key("0.8.5")


class TestGivenSizeTotal:
    """`--gpu 80GB`: the total row says the operator's size is taken as the total, not a catalog figure."""

    @pytest.mark.parametrize("engine", ["vllm", "sglang"])
    def test_bare_size_is_pinned_not_catalog(self, engine: str) -> None:
        plan = make_plan(request("qwen2.5-7b", "80GB", engine=engine))
        total = plan.item("total")
        assert total.bytes == 80_000_000_000
        assert total.source == "pinned"
        assert "the --gpu size given" in total.detail and "catalog" not in total.detail

    def test_catalog_card_keeps_catalog(self) -> None:
        total = make_plan(request("qwen2.5-7b", "a100-80gb")).item("total")
        assert total.source == "catalog" and "published totals" in total.detail


class TestInvalidKvCacheDtype:
    """`-- --kv-cache-dtype int3`: the engine refuses the command line (exit 2), not a fit (78): SGLang's
    argparse, vLLM's CacheConfig from 0.33 (config/cache.py:505-510 in 0.34.0), before any model is read."""

    @pytest.mark.parametrize(("engine", "refused", "choice"), [
        ("vllm", "Invalid kv_cache_dtype: 'int3'", "fp8_e5m2"),
        ("sglang", "invalid choice: 'int3'", "'fp8_e4m3'")])
    def test_invalid_choice_is_a_usage_error_naming_the_choices(self, engine: str, refused: str, choice: str) -> None:
        with pytest.raises(UsageError) as caught:
            make_plan(request("qwen2.5-7b", "80GB", engine=engine, engine_args=("--kv-cache-dtype", "int3"),
                              engine_version=None))
        assert caught.value.exit_code == ExitCode.USAGE == 2
        message = caught.value.message
        assert refused in message and choice in message and "\n" not in message

    def test_invalid_choice_wins_over_a_setup_refusal(self) -> None:
        """Refused before the config is read: 28 heads over TP 3 still reads as the bad flag."""
        with pytest.raises(UsageError, match="Invalid kv_cache_dtype: 'int3'"):
            make_plan(request("qwen2.5-7b", "3x80GB", engine_args=("--kv-cache-dtype", "int3", "-tp", "3"),
                              engine_version=None))
        # the setup refusal it would otherwise be
        with pytest.raises(WontFit, match="must be divisible by tensor parallel size"):
            make_plan(request("qwen2.5-7b", "3x80GB", engine_args=("-tp", "3")))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_ecc_unknown_never_fits_on_ecc_off(engine: str) -> None:
    """An RTX 6000 Ada of unknown ECC state: the band reaches down to the ECC-on card's and up to the
    ECC-off card's, and the length comes from its low end (what the ECC-on card holds)."""
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    model = resolve_model("qwen2.5-7b")

    def plan(spec: str):  # type: ignore[no-untyped-def]
        # The estimate's own band: SGLang's pool uncapped (the span's band is wider than +/- 5 %).
        return make_plan(PlanRequest(model=model, engine=engine, gpus=hypothetical_gpus([spec]),
                                     cap_uncertain_pool=False))

    span, on, off = plan("rtx6000ada"), plan("rtx6000ada-ecc"), plan("rtx6000ada-noecc")
    assert on.kv_cache_bytes < span.kv_cache_bytes < off.kv_cache_bytes
    # vLLM 0.34 commits its pages in 2 MiB granules per layer segment: each plan's figure may sit up to
    # 28 of them apart from the other's (launcher/engines/vllm/budget.py extensible_pages).
    rounding = 28 * 2 * MiB if engine == "vllm" else 0
    assert span.kv_cache_bytes_low <= on.kv_cache_bytes_low + 16 * MiB + rounding
    # SGLang: the span keeps ECC on's default fraction (a fixed reserve of the smaller NVML total), so
    # its high end is a little under the ECC-off card's.
    fewer = (off.engine_figures["mem_fraction_static"] - span.engine_figures["mem_fraction_static"]
             if engine == "sglang" else 0.0)
    assert engine == "vllm" or round(fewer, 3) == 0.010  # 1 - 7248/49140 vs 1 - 7248/46068
    assert span.kv_cache_bytes_high >= off.kv_cache_bytes_high - fewer * 49140 * MiB - 16 * MiB - rounding
    assert span.kv_cache_bytes_high - span.kv_cache_bytes_low > 3 * GiB * 0.8  # ECC's 3 GiB, times the fraction
