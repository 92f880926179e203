"""vLLM's decode context parallelism (DCP) sized and prefill context parallelism (PCP) refused or not sized
(launcher/engines/vllm/context_parallel.py), and the printed KV tokens by release (kv.py `kv_capacity`).

The capacity figures are vLLM 0.34.0's own: its `MLAAttentionSpec` / `FullAttentionSpec`,
`_get_kv_cache_bytes_per_block` and `get_kv_cache_capacity`, run from the 0.34.0 wheel's Python tree in the
0.32 CPU venv with a real `ParallelConfig` (as tests/oracles/README.md runs its other 0.34 classes):
DeepSeek-V3 at -tp 8 -dcp 8 with 40 GiB of KV a rank prints 4,889,088 tokens and 29.84x, Llama-3.1-70B at
-tp 16 -dcp 2 with 40 GiB prints 2,097,152 and 16.00x."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UnsupportedModel, UsageError, WontFit
from launcher.common.units import GiB
from launcher.engines.vllm import context_parallel as vcp
from launcher.engines.vllm import kv as vk
from launcher.engines.vllm import rules as vr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import FULL, MLA, geometry_from_config
from launcher.model.gpu import HostMemory
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def geometry(name: str) -> Any:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return geometry_from_config({k: v for k, v in raw.items() if not k.startswith("_")})


def layout(name: str, *, block: int, tp: int, dcp: int) -> vk.KvLayout:
    return dataclasses.replace(vk.layout_for(geometry(name), block=block, kv_bytes=2, tp=tp, pp=1, pinned={}),
                               context_shards=dcp)


ORACLE = json.loads((Path(__file__).resolve().parents[2] / "data" / "vllm_dcp_oracle.json").read_text())


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: f"{c['spec']}-d{c['dcp']}-L{c['max_model_len']}-"
                                                              f"n{c['num_blocks']}")
def test_printed_tokens_equal_vllm_0_34s_own(case: dict[str, Any]) -> None:
    """tests/oracles/vllm_dcp_oracle.py ran vLLM 0.34.0's specs and `get_kv_cache_capacity` over 750 cases: an MLA
    and two GQA pages, DCP 1-16, lengths that the shards and blocks divide and do not, 1 to 65,536 blocks."""
    group = vk.KvGroup(kind=MLA if case["mla"] else FULL, num_layers=1)
    layout = vk.KvLayout(block_size=case["block"], page_bytes=case["page_size_bytes"], group_size=1, groups=(group,),
                         kv_dtype_bytes=2, context_shards=case["dcp"])
    cap = vk.kv_capacity(layout, case["num_blocks"] * case["page_size_bytes"], max_model_len=case["max_model_len"],
                         in_flight_tokens=0)
    assert (cap.num_blocks, cap.blocks_per_request) == (case["num_blocks"], case["request_pages"])
    assert (cap.tokens, cap.concurrency_printed) == (case["tokens"], case["concurrency"])


class TestCapacity:
    @pytest.mark.parametrize(("dcp", "tokens", "concurrency"), [(1, 611_136, "3.73"), (8, 4_889_088, "29.84")])
    def test_deepseek_v3_as_vllm_0_34_prints_it(self, dcp: int, tokens: int, concurrency: str) -> None:
        """61 MLA layers x 64 x 1152 B = 4,497,408 B a block; 40 GiB hold 9,549 blocks; a request of 163,840 tokens
        claims ceil(ceil(163840/d)/64) of them: 2,560 without DCP, 320 with -dcp 8."""
        cap = vk.kv_capacity(layout("deepseek-v3", block=64, tp=8, dcp=dcp), 40 * GiB, max_model_len=163_840,
                             in_flight_tokens=0)
        assert (cap.num_blocks, cap.blocks_per_request) == (9_549, 2_560 // dcp)
        assert (cap.tokens, cap.concurrency_printed) == (tokens, concurrency)

    def test_a_length_the_shards_do_not_divide(self) -> None:
        """L = 100,000 at -dcp 8: ceil(12,500 / 64) = 196 blocks a request, int(9,549 / 196 x 100,000)."""
        cap = vk.kv_capacity(layout("deepseek-v3", block=64, tp=8, dcp=8), 40 * GiB, max_model_len=100_000,
                             in_flight_tokens=0)
        assert (cap.blocks_per_request, cap.tokens) == (196, 4_871_938)

    @pytest.mark.parametrize(("dcp", "tokens", "concurrency"), [(1, 1_048_576, "8.00"), (2, 2_097_152, "16.00")])
    def test_llama_70b_gqa_over_16_ranks(self, dcp: int, tokens: int, concurrency: str) -> None:
        """One KV head a rank at -tp 16 (8 heads copied twice): 80 layers x 16 x 512 B; -dcp 2 stores the copies'
        tokens apart instead."""
        cap = vk.kv_capacity(layout("llama-3.1-70b-instruct", block=16, tp=16, dcp=dcp), 40 * GiB,
                             max_model_len=131_072, in_flight_tokens=0)
        assert cap.num_blocks == 65_536
        assert (cap.tokens, cap.concurrency_printed) == (tokens, concurrency)

    def test_before_0_20_1_the_blocks_are_printed(self) -> None:
        """0.19.0 kv_cache_utils.py:1297-1316: num_blocks // groups x block x dcp, whatever the length."""
        cap = vk.kv_capacity(layout("deepseek-v3", block=64, tp=8, dcp=8), 40 * GiB, max_model_len=100_000,
                             in_flight_tokens=0, tokens_from_concurrency=False)
        assert cap.tokens == 9_549 * 64 * 8
        assert cap.concurrency_printed == "48.72"  # 9,549 / 196, on its own line then

    def test_the_one_request_check_divides_the_length(self) -> None:
        """kv_cache_planning.py:1297-1329: a 163,840-token request needs 320 blocks a rank at -dcp 8, not 2,560."""
        small = 400 * 4_497_408  # 400 blocks: one request fits with DCP, not without
        assert vk.kv_capacity(layout("deepseek-v3", block=64, tp=8, dcp=8), small, max_model_len=163_840,
                              in_flight_tokens=0).fits_one_request
        assert not vk.kv_capacity(layout("deepseek-v3", block=64, tp=8, dcp=1), small, max_model_len=163_840,
                                  in_flight_tokens=0).fits_one_request

    def test_releases_before_0_20_1_print_blocks(self) -> None:
        assert not vr.rules_for("0.10.1")[0].tokens_from_concurrency
        assert not vr.rules_for("0.20.0")[0].tokens_from_concurrency
        assert vr.rules_for("0.20.1")[0].tokens_from_concurrency and vr.rules_for("0.34.0")[0].tokens_from_concurrency


def plan(name: str, argv: list[str], *, gpus: str = "8x h200", version: str = "0.34.0", device: str = "cuda",
         weight_bytes: int = 80 * GiB) -> Plan:
    model = ResolvedModel(name=name, source="local", geometry=geometry(name), weight_bytes=weight_bytes,
                          weight_bytes_source="model.safetensors.index.json total_size", config={})
    host = HostMemory(total_bytes=512 * GiB, available_bytes=400 * GiB) if device == "cpu" else None
    return make_plan(PlanRequest(model=model, engine="vllm", device=device, host=host,
                                 gpus=hypothetical_gpus([gpus]) if device == "cuda" else (),
                                 engine_args=tuple(argv), engine_version=version))


def refusal(name: str, argv: list[str], **kwargs: Any) -> str:
    with pytest.raises(WontFit) as caught:
        plan(name, argv, **kwargs)
    return str(caught.value)


class TestPlans:
    def test_deepseek_v3_dcp_8_prints_eight_times_the_tokens(self) -> None:
        base = plan("deepseek-v3", ["-tp", "8"], weight_bytes=688_586_727_753)
        dcp = plan("deepseek-v3", ["-tp", "8", "-dcp", "8"], weight_bytes=688_586_727_753)
        assert dcp.num_blocks == base.num_blocks  # the same memory, the same blocks
        assert dcp.kv_cache_tokens == dcp.num_blocks * 64 * 8 and base.kv_cache_tokens == base.num_blocks * 64
        assert any("decode context parallelism 8" in note for note in dcp.notes)
        assert dcp.pinned.get("--decode-context-parallel-size") == 8

    def test_its_workspaces_widen_the_band_only(self) -> None:
        """At most 9 MiB (workspace / 8) + 144 MiB (1024 x 128 heads x 576 x 2 B) + 144 MiB (2 x 65,536 x 576 x 2 B)."""
        base = plan("deepseek-v3", ["-tp", "8"], weight_bytes=688_586_727_753)
        dcp = plan("deepseek-v3", ["-tp", "8", "-dcp", "8"], weight_bytes=688_586_727_753)
        bound = 65_536 // 8 * 576 * 2 + 1024 * 128 * 576 * 2 + 2 * 65_536 * 576 * 2
        assert vcp.workspace_bound(geometry("deepseek-v3"), dcp=8, tp=8, batched_tokens=8192, version="0.34.0",
                                   dtype_bytes=2)[0] == bound
        assert dcp.kv_cache_bytes == base.kv_cache_bytes
        assert dcp.kv_cache_bytes_low is not None and base.kv_cache_bytes_low is not None
        assert base.kv_cache_bytes_low - dcp.kv_cache_bytes_low >= bound - 64 * 4_497_408  # whole blocks

    def test_qwen3_moe_gqa_dcp_2_over_8(self) -> None:
        """32 query and 4 KV heads: -tp 8 holds each head twice, -dcp 2 (the most: 8 // 4) splits the copies."""
        base = plan("qwen3-30b-a3b", ["-tp", "8"], weight_bytes=61 * GiB)
        dcp = plan("qwen3-30b-a3b", ["-tp", "8", "-dcp", "2"], weight_bytes=61 * GiB)
        assert dcp.num_blocks == base.num_blocks and dcp.kv_cache_tokens == 2 * base.kv_cache_tokens

    def test_0_20_prints_blocks_times_dcp(self) -> None:
        p = plan("qwen3-30b-a3b", ["-tp", "8", "-dcp", "2"], gpus="8x h100", version="0.20.0", weight_bytes=61 * GiB)
        assert p.kv_cache_tokens == p.num_blocks * 16 * 2


class TestRefusals:
    @pytest.mark.parametrize(("version", "message"), [
        ("0.34.0", "tp_size=8 must be divisible by dcp_size=3."),
        ("0.26.0", "tp_size=8 must be divisible by dcp_size=3."),
        ("0.25.0", "tp_size=8 must be divisible bydcp_size=3."),  # as 0.19-0.25 print it
    ])
    def test_dcp_divides_tp(self, version: str, message: str) -> None:
        assert message in refusal("deepseek-v3", ["-tp", "8", "-dcp", "3"], version=version,
                                  weight_bytes=688_586_727_753)

    @pytest.mark.parametrize(("argv", "version", "message"), [
        (["-tp", "8", "-dcp", "2"], "0.34.0", "Decode context parallelism for GQA/MQA requires "
         "`--tensor-parallel-size` (8) to be greater than the model's total number of KV heads (8)."),
        (["-tp", "8", "-dcp", "2"], "0.26.0", "tensor parallel size 8 must be greater than total num kv heads 8 when "
         "enable decode context parallel for GQA/MQA"),
        (["-tp", "8", "-dcp", "2"], "0.11.0", "DCP requires attention impls to return the softmax lse for decode"),
    ])
    def test_gqa_needs_more_ranks_than_kv_heads(self, argv: list[str], version: str, message: str) -> None:
        assert message in refusal("llama-3.1-70b-instruct", argv, version=version)

    def test_gqa_at_most_tp_over_kv_heads(self) -> None:
        assert ("`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for "
                "`--tensor-parallel-size` (8) and 4 model KV heads.") in refusal(
            "qwen3-30b-a3b", ["-tp", "8", "-dcp", "4"], weight_bytes=61 * GiB)
        assert "decode context parallel size must less than or equal to (tensor parallel size 8 // total num kv " \
               "heads 4) = 2, but got 4" in refusal("qwen3-30b-a3b", ["-tp", "8", "-dcp", "4"], version="0.23.0",
                                                    weight_bytes=61 * GiB)

    def test_pcp_before_vllm_ran_it(self) -> None:
        assert "Prefill context parallelism is not fully supported." in refusal(
            "deepseek-v3", ["-tp", "8", "-pcp", "2"], gpus="16x h200", version="0.12.0", weight_bytes=688_586_727_753)
        assert "PCP requires attention impls' support" in refusal(
            "deepseek-v3", ["-tp", "8", "-pcp", "2"], gpus="16x h200", version="0.23.0", weight_bytes=688_586_727_753)


class TestNotSized:
    @pytest.mark.parametrize(("name", "argv", "kwargs", "why"), [
        ("deepseek-v3", ["-tp", "8", "-pcp", "2"], {"gpus": "16x h200"}, "prefill context parallelism"),
        ("gpt-oss-20b", ["-tp", "16", "-dcp", "2"], {"gpus": "16x h200", "weight_bytes": 13 * GiB},
         "sliding-window, chunked or state layers"),
        ("deepseek-v3", ["-tp", "8", "-dcp", "8"], {"device": "cpu"}, "on the cpu backend"),
    ])
    def test_what_the_plain_split_would_get_wrong(self, name: str, argv: list[str], kwargs: dict[str, Any],
                                                  why: str) -> None:
        with pytest.raises(UnsupportedModel) as caught:
            plan(name, argv, **{"weight_bytes": 688_586_727_753, **kwargs})
        assert "not sized by safe-serve yet" in str(caught.value) and why in str(caught.value)
        assert caught.value.exit_code == 78


class TestReviewed:
    """What a review against vLLM's code found: vLLM's own MLA list, the LSE its DCP needs, flags a release lacks."""

    def test_minicpm3_runs_as_attention_so_the_gqa_rules_apply(self) -> None:
        """MiniCPM3 has kv_lora_rank but vLLM serves it as plain attention (its use_mla is False): 40 KV heads."""
        minicpm3 = {"architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_size": 2560,
                    "num_hidden_layers": 62, "num_attention_heads": 40, "num_key_value_heads": 40,
                    "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                    "v_head_dim": 64, "vocab_size": 73448, "max_position_embeddings": 32768,
                    "torch_dtype": "bfloat16", "intermediate_size": 6400}
        model = ResolvedModel(name="minicpm3", source="local", geometry=geometry_from_config(minicpm3),
                              weight_bytes=8 * GiB, weight_bytes_source="index", config={})
        with pytest.raises(WontFit) as caught:
            make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["2x h100"]),
                                  engine_args=("-tp", "2", "-dcp", "2")))
        assert "greater than the model's total number of KV heads (40)" in str(caught.value)

    @pytest.mark.parametrize(("name", "gpus", "version", "impl"), [
        ("deepseek-v3", "8x b200", "0.19.0", "the impl FlashInferMLAImpl does not return the softmax lse"),
        ("deepseek-v3", "8x b200", "0.24.0", "but FlashInferMLAImpl does not. Try a different backend"),
        ("deepseek-v3.2-exp", "8x h200", "0.28.0", "but FlashMLASparseImpl does not."),
    ])
    def test_the_default_mla_backend_without_the_lse_dcp_needs(self, name: str, gpus: str, version: str,
                                                                impl: str) -> None:
        assert impl in refusal(name, ["-tp", "8", "-dcp", "8"], gpus=gpus, version=version,
                               weight_bytes=688_586_727_753)

    @pytest.mark.parametrize(("name", "gpus", "version"), [("deepseek-v3", "8x b200", "0.25.0"),
                                                           ("deepseek-v3", "8x h200", "0.19.0"),
                                                           ("deepseek-v3.2-exp", "8x h200", "0.29.0")])
    def test_where_the_backend_returns_it(self, name: str, gpus: str, version: str) -> None:
        p = plan(name, ["-tp", "8", "-dcp", "8"], gpus=gpus, version=version, weight_bytes=688_586_727_753)
        assert p.kv_cache_tokens > 0

    def test_a_pinned_backend_is_vllms_choice_to_check(self) -> None:
        p = plan("deepseek-v3", ["-tp", "8", "-dcp", "8", "--attention-backend", "CUTLASS_MLA"], gpus="8x b200",
                 version="0.19.0", weight_bytes=688_586_727_753)
        assert p.kv_cache_tokens > 0

    @pytest.mark.parametrize(("argv", "version"), [(["-tp", "8", "-dcp", "8"], "0.10.1"),
                                                   (["-tp", "8", "-pcp", "2"], "0.11.0")])
    def test_a_flag_the_release_does_not_have(self, argv: list[str], version: str) -> None:
        with pytest.raises(UsageError) as caught:
            plan("deepseek-v3", argv, gpus="16x h200", version=version, weight_bytes=688_586_727_753)
        assert "unrecognized arguments" in str(caught.value) and caught.value.exit_code == 2

    def test_before_0_20_1_a_none_mode_state_group_has_blocks_of_the_length(self) -> None:
        """0.19.0 models/config.py:474-480: without prefix caching the Mamba group's block is max_model_len, and the
        KV line multiplies num_blocks // groups by the smallest group block: 64 at --max-model-len 64."""
        from launcher.model.resolve import ResolvedModel as Model

        model = Model(name="granite", source="local", geometry=geometry("granite-4.0-h-tiny"), weight_bytes=14 * GiB,
                      weight_bytes_source="index", config={})
        short = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]),
                                      engine_args=("--max-model-len", "64"), engine_version="0.19.0"))
        groups = 10  # 4 attention layers padded against 36 Mamba-2 layers, grouped by vLLM (kv.py)
        assert short.kv_cache_tokens == short.num_blocks // groups * 64
        long = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]),
                                     engine_args=("--max-model-len", "4096"), engine_version="0.19.0"))
        assert long.kv_cache_tokens == long.num_blocks // groups * long.block_size
