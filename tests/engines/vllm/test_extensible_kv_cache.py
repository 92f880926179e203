"""vLLM 0.34's extensible KV cache: the KV cache from the memory free after warmup and capture.

The arithmetic is checked against 0.34.0's own `measure_kv_cache_bytes` and `blocks_within`, run from
the release's source over a grid (tests/oracles/vllm_extensible_oracle.py ->
tests/data/vllm_extensible_oracle.json); the plan's rows against hand arithmetic; when it is off
(flags, a pinned size, WSL2) and what vLLM refuses around it, against config/vllm.py:3180-3263.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB, MiB, format_gib
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel, resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

ORACLE = json.loads((Path(__file__).resolve().parents[2] / "data" / "vllm_extensible_oracle.json").read_text())


def plan(version: str = "0.34.0", gpu: str = "h100", model: str = "qwen2.5-7b", args: tuple[str, ...] = (),
         **changes: object) -> Plan:
    request = PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpu]),
                          engine_version=version, engine_args=args)
    return make_plan(dataclasses.replace(request, **changes))


class TestTheEnginesOwnArithmetic:
    def test_constants_are_the_releases(self) -> None:
        constants = ORACLE["constants"]
        assert constants["KV_CACHE_MARGIN_FLOOR_BYTES"] == vb.EXTENSIBLE_MARGIN_FLOOR_BYTES == GiB
        assert constants["KV_CACHE_MARGIN_FRACTION"] == vb.EXTENSIBLE_MARGIN_FRACTION == 0.75
        assert ORACLE["header"]["vllm"] == "0.34.0"

    @pytest.mark.parametrize("case", ORACLE["measure"], ids=lambda c: f"{c['requested_memory'] >> 20}MiB")
    def test_measure_kv_cache_bytes(self, case: dict[str, int]) -> None:
        resident = case["init_free_memory"] - case["free_memory"] - case["committed_bytes"]
        ours = vb.extensible_kv(requested=case["requested_memory"], free_at_init=case["init_free_memory"],
                                resident=resident, transient=case["transient_peak_bytes"],
                                growth=case["torch_reserve_growth_bytes"])
        assert max(ours.kv_bytes, 0) == case["available"]

    def test_the_grid_reaches_both_limits_and_the_floor(self) -> None:
        """Cases where the cap binds, where the margin binds, where the floor is the margin, and none left."""
        cases = ORACLE["measure"]
        assert any(c["requested_memory"] < c["init_free_memory"] - GiB for c in cases)
        assert any(c["requested_memory"] > c["init_free_memory"] for c in cases)
        assert any(c["transient_peak_bytes"] * 0.75 < GiB for c in cases)
        assert any(c["transient_peak_bytes"] * 0.75 > GiB for c in cases)
        assert any(c["available"] == 0 for c in cases) and any(c["available"] > 50 * GiB for c in cases)

    @pytest.mark.parametrize("case", ORACLE["blocks"], ids=lambda c: f"{c['segments']}x{c['stride']}")
    def test_blocks_within_whole_granules(self, case: dict[str, int]) -> None:
        pages = vb.extensible_pages(case["bytes"], segments=case["segments"])
        assert pages // (case["segments"] * case["stride"]) == case["blocks"]

    def test_hand_example(self) -> None:
        """80 GiB requested, 78 free at init, 20 held after capture, T 2 GiB: margin max(1, 1.5) = 1.5 GiB,
        KV = min(80, 78 - 1.5) - 20 - 2 = 54.5 GiB; at T 0.8 GiB the 1 GiB floor: 78 - 1 - 20 - 0.8."""
        sized = vb.extensible_kv(requested=80 * GiB, free_at_init=78 * GiB, resident=20 * GiB, transient=2 * GiB)
        assert (sized.kv_bytes, sized.margin, sized.capped) == (int(54.5 * GiB), int(1.5 * GiB), False)
        floor = vb.extensible_kv(requested=80 * GiB, free_at_init=78 * GiB, resident=20 * GiB,
                                 transient=int(0.8 * GiB))
        assert floor.kv_bytes == 78 * GiB - GiB - 20 * GiB - int(0.8 * GiB)
        capped = vb.extensible_kv(requested=50 * GiB, free_at_init=78 * GiB, resident=20 * GiB, transient=2 * GiB)
        assert capped.capped and capped.kv_bytes == 28 * GiB
        # T 45 % higher (2.9 GiB), margin 2.175 GiB: 2.2 GiB less at the band's far end
        assert abs(sized.error_bytes - int(1.575 * GiB)) <= 2  # 54.5 - (78 - 2.175 - 20 - 2.9)


class TestMlaContextChunks:
    """MLA's context step packs the warmup's cached context into workspace-sized chunks: 0.34.0's own
    `determine_chunked_prefill_workspace_size` and `plan_mla_context_chunks`, run from its source over a grid."""

    def test_the_grid_has_both_shapes(self) -> None:
        cases = ORACLE["mla_context"]
        assert ORACLE["header"]["mla_file"].endswith("mla_attention.py") and len(cases) == 84
        assert any(len(c["chunks"]) == 1 for c in cases) and any(len(c["chunks"]) > 1 for c in cases)

    @pytest.mark.parametrize("case", ORACLE["mla_context"], ids=lambda c: "-".join(
        str(c[key]) for key in ("max_model_len", "max_num_seqs", "block", "batched_tokens")))
    def test_chunks_are_the_releases(self, case: dict[str, int]) -> None:
        assert vb.mla_context_chunks(max_model_len=case["max_model_len"], max_num_seqs=case["max_num_seqs"],
                                     block=case["block"], batched_tokens=case["batched_tokens"]) == case["chunks"]


class TestTheSizingStep:
    """0.34 sizes the cache after a full-batch step with attention and prompt logprobs (warmup.py:478-545):
    its allocated peak can raise T, and torch's reservation growth G over it is only bounded (the band)."""

    def test_qwen25_7b_phases_by_hand(self) -> None:
        """8,192 tokens, hidden 3,584, intermediate 18,944, 28 q / 4 kv heads of 128, vocabulary 152,064."""
        step = vb.sizing_step(resolve_model("qwen2.5-7b").geometry, batched_tokens=8192, tp=1)
        assert step is not None
        # the MLP's activation beside o_proj's output and the piece's inputs (attention output, residual), as vLLM's
        # compiled forward holds them (tests/engines/vllm/test_lm_forward.py)
        assert step.forward == 2 * 8192 * (3 * 18_944 + 2 * 3584 + 3584)
        assert step.logprobs == 2 * 8192 * 3584 + 2 * 1024 * 152_064  # hidden states + one 1,024-row chunk
        assert step.bytes == step.forward

    def test_tensor_parallel_gathers_the_chunk(self) -> None:
        step = vb.sizing_step(resolve_model("qwen2.5-7b").geometry, batched_tokens=8192, tp=2)
        assert step is not None
        assert step.logprobs == 2 * 8192 * 3584 + 2 * 1024 * 152_064 * 3 // 2  # shard + gathered whole
        assert step.forward == 2 * 8192 * (3 * 18_944 // 2 + 2 * 3584 + 3584 // 2)

    def test_a_short_length_asks_logprobs_on_one_prompt_of_that_length(self) -> None:
        """max_model_len 512 below the batch of 8,192: one prompt of 512 tokens carries the logprobs, 512 rows."""
        step = vb.sizing_step(resolve_model("qwen2.5-7b").geometry, batched_tokens=8192, tp=1, max_model_len=512)
        assert step is not None
        assert step.logprobs == 2 * 512 * 3584 + 2 * 512 * 152_064

    def test_a_soft_cap_holds_two_copies_at_a_time(self) -> None:
        """Gemma 2 (final_logit_softcapping 30): logits / cap, tanh, x cap each make a new tensor and free the one
        before: two chunks of 1,024 x 256,000 alive at once, also at TP 2 (shard + whole is 1.5)."""
        geometry = resolve_model("gemma-2-9b").geometry
        for tp in (1, 2):
            step = vb.sizing_step(geometry, batched_tokens=2048, tp=tp)
            assert step is not None
            assert step.logprobs == 2 * 2048 * 3584 + 2 * 1024 * 256_000 * 2

    def test_max_logprobs_0_has_no_chunk_and_minus_1_or_mla_under_dcp_is_not_derived(self) -> None:
        geometry = resolve_model("qwen2.5-7b").geometry
        step = vb.sizing_step(geometry, batched_tokens=8192, tp=1, max_logprobs=0)
        assert step is not None and step.logprobs == 0
        assert vb.sizing_step(geometry, batched_tokens=8192, tp=1, max_logprobs=-1) is None
        mla = resolve_model("deepseek-v2-lite").geometry
        assert vb.sizing_step(mla, batched_tokens=8192, tp=2, dcp=2) is None
        assert vb.sizing_step(geometry, batched_tokens=8192, tp=2, dcp=2) is not None  # DCP matters to MLA only

    def test_mla_context_step_by_hand(self) -> None:
        """DeepSeek-V2-Lite (16 heads, nope 128, v 128, rope 64) at max_model_len 8,192, 1,024 sequences, block 16:
        W = min(max(8 x 8,192, 4 x 1,024 x 16), 64k) = 65,536 rows; 9 requests of 8,189 cached tokens; the first
        chunk takes 8 whole and 16 rows of the ninth (block-aligned), 65,528 rows, the second the 8,173 left.
        At the boundary the first chunk's kv (8,192 B a row) and k (6,144 B) beside the second's kv."""
        mla = resolve_model("deepseek-v2-lite").geometry
        got = vb.mla_context_step(mla, tp=1, max_model_len=8192, max_num_seqs=1024, batched_tokens=8192, block=16,
                                  pads_v=False)
        assert got == 65_528 * (8192 + 6144) + 8173 * 8192
        # one request of the whole workspace where the length allows it: W rows, one chunk
        long = vb.mla_context_step(mla, tp=1, max_model_len=163_840, max_num_seqs=1024, batched_tokens=8192,
                                   block=64, pads_v=False)
        assert long == 65_536 * (8192 + 6144)
        # heads split by TP
        assert vb.mla_context_step(mla, tp=2, max_model_len=163_840, max_num_seqs=1024, batched_tokens=8192,
                                   block=64, pads_v=False) == long // 2
        step = vb.sizing_step(mla, batched_tokens=8192, tp=1, max_model_len=8192, block=16,
                              compute_capability=(9, 0))
        assert step is not None and step.context == got and step.bytes == got
        assert step.phase == "MLA's context up-projection"

    def test_mla_context_step_pads_v_for_flash_attention_2(self) -> None:
        """Where FlashAttention 2 runs MLA's prefill (not SM90's FA3 nor SM100/110's FA4), v is padded from 128 to
        the q/k head dim 192 inside each call: 16 x 192 x 2 = 6,144 B a row beside the chunk's kv and k. The
        first chunk of 65,528 rows then peaks above the boundary (65,528 x 20,480 > 65,528 x 14,336 + 8,173 x
        8,192); an unknown card is taken as padding."""
        mla = resolve_model("deepseek-v2-lite").geometry
        padded = vb.mla_context_step(mla, tp=1, max_model_len=8192, max_num_seqs=1024, batched_tokens=8192,
                                     block=16, pads_v=True)
        assert padded == 65_528 * (8192 + 6144 + 6144)
        assert [vb.mla_prefill_pads_v(cc) for cc in ((8, 0), (8, 9), (9, 0), (10, 0), (11, 0), (12, 0), None)] == \
            [True, True, False, False, False, True, True]
        a100 = vb.sizing_step(mla, batched_tokens=8192, tp=1, max_model_len=8192, block=16, compute_capability=(8, 0))
        assert a100 is not None and a100.context == padded
        assert a100.phase == "MLA's context up-projection, v padded for FlashAttention 2"
        # a model without MLA pads nothing, whatever the card
        dense = vb.sizing_step(resolve_model("qwen2.5-7b").geometry, batched_tokens=8192, tp=1,
                               compute_capability=(8, 0))
        assert dense is not None and not dense.padded_v and dense.context == 0

    def test_g_bounded_above_the_step_leaves_the_margin(self) -> None:
        """T 1 GiB, step 2 GiB: T becomes 2 GiB (margin 1.5); G up to 2.9 GiB costs 0.9 GiB at the far end, the
        margin unchanged (measure_kv_cache_bytes keeps max(T, G), the margin from T alone)."""
        step = vb.SizingStep(forward=2 * GiB, logprobs=0)
        sized = vb.extensible_kv(requested=80 * GiB, free_at_init=78 * GiB, resident=20 * GiB, transient=GiB,
                                 step=step)
        assert (sized.transient, sized.margin) == (2 * GiB, int(1.5 * GiB))
        assert sized.kv_bytes == 78 * GiB - int(1.5 * GiB) - 20 * GiB - 2 * GiB
        assert abs(sized.error_bytes - int(0.9 * GiB)) <= 1

    def test_graphs_in_t_cover_the_growth(self) -> None:
        """T 3 GiB (the graphs' estimate in it), step 1 GiB: G up to 1.45 GiB stays below T, no band from it;
        without the steps derived (--max-logprobs -1, MLA under DCP), T itself may grow 45 % and the margin with it."""
        derived = vb.extensible_kv(requested=80 * GiB, free_at_init=78 * GiB, resident=20 * GiB,
                                   transient=3 * GiB, step=vb.SizingStep(forward=GiB, logprobs=0))
        assert derived.error_bytes == 0
        bounded = vb.extensible_kv(requested=80 * GiB, free_at_init=78 * GiB, resident=20 * GiB, transient=3 * GiB)
        assert abs(bounded.error_bytes - int(1.35 * GiB * 1.75)) <= 2

    def test_qwen25_7b_plan_narrows_and_says_why(self) -> None:
        """On an H100 the graphs' estimate (0.83 GiB) keeps T above 1.45 x the step: the band loses the 45 %
        growth of T and its margin (+/- 3.55 GiB before this term was derived, 2.05 with the V2 forward's flat
        0.5 GiB, 1.48 with the compiled forward traced)."""
        p = plan()
        row = next(item for item in p.budget if item.key == "kept_free")
        assert "sizing warmup's steps 1.03 GiB (its forward)" in row.detail
        assert row.error_bytes == 0
        band = (p.kv_cache_bytes_high - p.kv_cache_bytes_low) / 2
        assert 1.4 * GiB < band < 1.6 * GiB

    def test_deepseek_v2_lite_plan_takes_the_context_step(self) -> None:
        """On an H100 at its 163,840-token length: one request of the 64k workspace, 16 heads, 0.88 GiB, below
        T (1.94 GiB with the graphs), so neither T nor the band moves for it; under DCP 2 the older rule."""
        p = plan(model="deepseek-v2-lite")
        row = next(item for item in p.budget if item.key == "kept_free")
        assert "steps 0.88 GiB (MLA's context up-projection)" in row.detail and row.error_bytes == 0
        dcp = plan(model="deepseek-v2-lite", args=("-tp", "2", "-dcp", "2"), gpus=hypothetical_gpus(["2xh100"]))
        assert "not derived" in next(item for item in dcp.budget if item.key == "kept_free").detail

    def test_on_an_a100_the_padded_context_step_widens_only_the_low_end(self) -> None:
        """DeepSeek-V2-Lite on an A100 40GB (FlashAttention 2): the context step with v padded, 65,536 rows x
        (8,192 + 6,144 + 6,144) B = 1.25 GiB, is just below T (1.27 GiB), so the centre does not move; 1.45 x the
        step (1.81 GiB) may be kept free instead, which lowers the low end by that row's error and leaves the
        high end alone (vLLM keeps max(T, G): G never gives memory back)."""
        p = plan(model="deepseek-v2-lite", gpu="a10040gb")
        row = next(item for item in p.budget if item.key == "kept_free")
        assert "1.25 GiB (MLA's context up-projection, v padded for FlashAttention 2)" in row.detail
        assert row.error_bytes > 0.5 * GiB
        low, high = p.kv_cache_bytes - p.kv_cache_bytes_low, p.kv_cache_bytes_high - p.kv_cache_bytes
        assert low - high == row.error_bytes
        # on an H100 (FlashAttention 3: no padding) the step is below T and the band symmetric
        h100 = plan(model="deepseek-v2-lite")
        assert h100.kv_cache_bytes - h100.kv_cache_bytes_low == h100.kv_cache_bytes_high - h100.kv_cache_bytes

    def test_a_pinned_minus_1_keeps_the_wider_band(self) -> None:
        """T's growth (1.45 T, margin following) lowers the low end by over 1 GiB; it never raises the
        high end (vLLM keeps max(T, G) free: G only ever takes more), which stays where the step's is."""
        narrow, wide = plan(), plan(args=("--max-logprobs", "-1"))
        assert wide.kv_cache_bytes == narrow.kv_cache_bytes
        assert narrow.kv_cache_bytes_low - wide.kv_cache_bytes_low > GiB
        assert wide.kv_cache_bytes_high == narrow.kv_cache_bytes_high
        row = next(item for item in wide.budget if item.key == "kept_free")
        assert "not derived" in row.detail

    def test_eager_with_few_sequences_the_chunk_raises_t(self) -> None:
        """Gemma 3 1B (vocabulary 262,208, hidden 1,152), eager, 8 sequences: the profile peaks at its forward,
        2 x 8,192 x (3 x 6,912 + 4 x 1,152) = 396 MiB, its sampler over 8 rows small; the sizing step's
        prompt-logprob chunk, 1,024 rows x 262,208 x 2 B beside 8,192 x 1,152 x 2 B of hidden states = 530 MiB,
        is then T, and the margin's floor (1 GiB) still binds."""
        config = json.loads((Path(__file__).resolve().parents[2] / "data" / "configs" / "gemma-3-1b-it.json")
                            .read_text())
        model = ResolvedModel(name="google/gemma-3-1b-it", source="local", geometry=geometry_from_config(config),
                              weight_bytes=2 * 10**9, weight_bytes_source="test", config=config)
        p = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.34.0",
                                  engine_args=("--enforce-eager", "--max-num-seqs", "8")))
        row = next(item for item in p.budget if item.key == "kept_free")
        chunk = 2 * 1024 * 262_208 + 2 * 8192 * 1152
        assert chunk > 2 * 8192 * (3 * 6912 + 4 * 1152)
        assert f"steps {format_gib(chunk)} (its prompt-logprob chunk)) = {format_gib(chunk)}" in row.detail
        assert abs(row.error_bytes - int(0.45 * chunk)) <= 1  # no graphs in T: G's bound is the band


class TestThePlan:
    def test_rows_add_up_and_the_kv_is_free_less_margin_and_t(self) -> None:
        """Qwen2.5-7B on an idle H100 at 0.34: KV = free at init - margin - everything held - T, in whole
        2 MiB granules of 28 layer segments; the table adds up to the request."""
        p = plan()
        rows = {item.key: item.bytes for item in p.budget}
        graphs, activation = rows["cudagraph"], rows["activation"]
        # held after the profile: the V2 penalty state, int32 [1024, 152,064] counts + a bit per vocab entry
        # (penalties.py:40), and the profile's fitted constant (no MoE workspace in a dense model)
        persistent = 4 * 1024 * 152_064 + 4 * 1024 * (152_064 // 32) + vb.PROFILE_CONSTANT_BYTES
        transient = activation - persistent + graphs
        margin = max(GiB, int(0.75 * transient))
        free_at_init = rows["total"] - rows["context"]  # an idle catalog card: free = its CUDA total
        # torch's segments around the weights: measured as consumed, so held too (weight_segments.py)
        held = rows["weights"] + rows["segments"] + rows["non_torch"] + persistent + graphs  # transients freed
        unit = 28 * 2 * MiB
        assert p.kv_cache_bytes == (free_at_init - margin - held - transient) // unit * unit
        assert sum(rows[k] for k in ("weights", "segments", "non_torch", "activation", "cudagraph", "kept_free",
                                     "kv")) == rows["requested"]
        assert any("extensible KV cache" in note for note in p.notes)

    def test_more_kv_than_033_on_an_h100_less_on_a_24_gib_card(self) -> None:
        """1.0 instead of 0.92 of the total, less T again and the margin: on 80 GiB the 6.3 GiB the 0.92
        kept back outweighs them, on 24 GiB (1.9 GiB kept back at 0.92) it does not."""
        assert plan().kv_cache_bytes - plan("0.33.0").kv_cache_bytes > 3 * GiB
        assert plan(gpu="rtx4090").kv_cache_bytes < plan("0.33.0", gpu="rtx4090").kv_cache_bytes

    def test_block_64_from_034(self) -> None:
        assert (plan().block_size, plan("0.33.0").block_size) == (64, 16)
        assert plan(gpu="b200", model="deepseek-v2-lite").block_size == 64  # FlashInfer-MLA: was 32
        assert plan("0.33.0", gpu="b200", model="deepseek-v2-lite").block_size == 32

    def test_no_startup_refusal_below_the_request(self) -> None:
        """A pinned utilization above the free memory: 0.33 refuses to start, 0.34 only caps at it."""
        gpu = dataclasses.replace(hypothetical_gpus(["h100"])[0], free_bytes=60 * GiB, source="nvml")
        with pytest.raises(WontFit, match="refuse to start"):
            plan("0.33.0", gpus=(gpu,), engine_args=("--gpu-memory-utilization", "0.9"))
        capped = plan(gpus=(gpu,), engine_args=("--gpu-memory-utilization", "0.9"))
        assert capped.kv_cache_bytes < 60 * GiB - 14 * GiB and not capped.may_not_fit

    def test_the_utilization_is_a_cap_at_free_less_margin(self) -> None:
        p = plan()
        assert p.engine_defaults["gpu_memory_utilization"] == 1.0
        assert p.knob.value == 0.9901 and "--gpu-memory-utilization" in p.engine_args  # (79.19-0.53-0.25)/79.19


class TestWhenItIsOff:
    @pytest.mark.parametrize("args", [("--no-enable-extensible-kv-cache",), ("--disable-extensible-kv-cache",),
                                      ("--kv-cache-memory-bytes", "40G"), ("--enable-elastic-ep",),
                                      ("--num-gpu-blocks-override", "4000")])
    def test_flags_that_turn_it_off(self, args: tuple[str, ...]) -> None:
        p = plan(args=args)
        assert not any(item.key == "kept_free" for item in p.budget)
        assert any("extensible KV cache is off" in note for note in p.notes)

    def test_off_sizes_as_before_warmup_at_092_with_block_64(self) -> None:
        off = plan(args=("--no-enable-extensible-kv-cache",))
        before = plan("0.33.0")
        assert off.engine_figures["gpu_memory_utilization"] == 0.92 == before.engine_figures["gpu_memory_utilization"]
        assert off.block_size == 64 and abs(off.kv_cache_bytes - before.kv_cache_bytes) < 4 * MiB

    def test_wsl2_has_no_virtual_memory_management(self) -> None:
        """The workers find it at start and fall back with a warning, even when it was asked for."""
        for args in ((), ("--enable-extensible-kv-cache",)):
            p = plan(vmm_unavailable="WSL2's GPU driver maps no virtual memory", args=args)
            assert p.engine_figures["gpu_memory_utilization"] == 0.92
            assert any("WSL2" in note and "off" in note for note in p.notes)

    def test_asked_for_with_a_pinned_size_is_vllms_refusal(self) -> None:
        """config/vllm.py:3262-3263: requested where a pinned size overrides it raises."""
        with pytest.raises(WontFit, match="kv_cache_memory_bytes overrides") as caught:
            plan(args=("--enable-extensible-kv-cache", "--kv-cache-memory-bytes", "40G"))
        assert caught.value.rule == "extensible-kv-cache"

    def test_asked_for_with_elastic_ep_is_vllms_refusal(self) -> None:
        with pytest.raises(WontFit, match="elastic EP scale-up skips warmup"):
            plan(args=("--enable-extensible-kv-cache", "--enable-elastic-ep"))

    def test_a_kv_connector_keeps_the_request_where_both_sizings_fit(self) -> None:
        """Whether a connector keeps the extensible KV cache depends on it: the request stays at 0.92, where
        the cache sized before warmup fits too, and the plan is the extensible one under that cap."""
        p = plan(args=("--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'))
        assert p.knob.value == 0.92 and any("--kv-transfer-config" in w for w in p.warnings)
        assert "the --gpu-memory-utilization cap binds" in p.item("kept_free").detail

    def test_older_releases_never_have_it(self) -> None:
        assert not any(item.key == "kept_free" for item in plan("0.33.0").budget)


class TestWhatStaysAllocated:
    def test_flashinfer_workspaces_on_compute_capability_10(self) -> None:
        """B200 (FlashInfer attention): max(394 MiB, 16384 x 28 heads x 128 x 16 B = 896 MiB) + TRT-LLM's
        394 MiB stay allocated after the profile run; none on an H100 (FlashAttention) or for MLA."""
        qwen = resolve_model("qwen2.5-7b").geometry
        assert vb.post_profile_workspaces(qwen, compute_capability=(10, 0), tp=1, batched_tokens=16384)[0] \
            == 16384 * 28 * 128 * 16 + 394 * MiB
        assert vb.post_profile_workspaces(qwen, compute_capability=(10, 0), tp=4, batched_tokens=2048)[0] \
            == 2 * 394 * MiB
        assert vb.post_profile_workspaces(qwen, compute_capability=(9, 0), tp=1, batched_tokens=8192)[0] == 0
        mla = resolve_model("deepseek-v2-lite").geometry
        assert vb.post_profile_workspaces(mla, compute_capability=(10, 0), tp=1, batched_tokens=16384)[0] == 0


class TestWatchingIt:
    def test_no_calibration_from_a_start_sized_after_warmup(self) -> None:
        """0.34 still prints "Available KV cache memory" (the estimate its address range is reserved for) and
        sizes the cache from the free memory at each start: no non-KV figure is kept from it, and one kept
        before (a 0.33 start) is not used; before 0.34 the estimate is the cache."""
        from launcher.engines.events import EngineEvent
        from launcher.engines.vllm.logs import RULES
        from launcher.engines.vllm.runtime import measurements_for
        from launcher.plan.types import Calibration

        p = plan()
        assert p.kv_sized_after_warmup and not plan("0.33.0").kv_sized_after_warmup
        line = ("Memory after warmup: 61.2 GiB free, 0.05 GiB committed to the KV cache, 1.9 GiB kept for transient "
                "activations (1.9 GiB allocated at peak, 0.4 GiB of torch reservation growth); 16896 KV cache blocks "
                "(57.75 GiB) fit within the requested 78.41 GiB. Torch may reserve up to 19.1 GiB.")
        (rule,) = [r for r in RULES if r.kind == "kv_measured"]
        match = rule.pattern.match(line)
        assert match is not None
        measured = EngineEvent("kv_measured", rule.convert(match))
        assert measured.values["blocks"] == 16896 and measured.values["kv_gib"] == 57.75
        watch = measurements_for(p)
        assert watch.feed(EngineEvent("available_kv", {"gib": 72.5})) is None and watch.feed(measured) is None
        old = measurements_for(plan("0.33.0")).feed(EngineEvent("available_kv", {"gib": 55.0}))
        assert old is not None and old.non_kv_bytes == plan("0.33.0").item("requested").bytes - 55 * GiB
        calibrated = plan(calibration=Calibration(non_kv_bytes=10 * GiB, key="k"))
        assert calibrated.kv_cache_bytes == p.kv_cache_bytes and calibrated.item("kept_free") is not None

    def test_after_an_oom_while_serving_the_cap_binds_below_vllms_margin(self) -> None:
        """A smaller request alone would free nothing (vLLM's margin binds first): the cap goes 1 GiB below
        the free memory less that margin, and the KV cache is 1 GiB smaller."""
        from launcher.plan.types import Calibration

        p = plan()
        after = plan(calibration=Calibration(extra_headroom_bytes=GiB, key="k"))
        assert after.knob.value < p.knob.value and after.knob.why.endswith("headroom")
        assert GiB - 58 * MiB <= p.kv_cache_bytes - after.kv_cache_bytes <= GiB + 58 * MiB  # +/- a granule per layer
        assert "the --gpu-memory-utilization cap binds" in after.item("kept_free").detail

    def test_a_driver_oom_committing_pages_is_temporary(self) -> None:
        from launcher.engines.vllm.runtime import TEMPORARY_FATAL

        assert "kv_commit_oom" in TEMPORARY_FATAL

    def test_wsl2_reaches_the_request(self) -> None:
        from launcher.plan import presets

        settings = presets.apply(None, presets.Explicit(), default_margin_bytes=0, gpu_total_bytes=24 * GiB,
                                 proc_version="Linux version 5.15.153.1-microsoft-standard-WSL2")
        assert settings.wsl2 and not presets.apply(None, presets.Explicit(), default_margin_bytes=0,
                                                   gpu_total_bytes=24 * GiB, proc_version="Linux 6.8.0").wsl2
