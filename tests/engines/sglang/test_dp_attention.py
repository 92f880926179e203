"""SGLang's data-parallel attention, sized from 0.5.22 (launcher/engines/sglang/planner.py `_attention_dp_unsized`,
budget.default_fraction's DP reserve, parameters.attention_dp_extra), against SGLang's own resolution and pool
code (tests/data/sglang_dp_attention_oracle.json: 528 cases on 0.5.23 and on 0.5.22, made by
tests/oracles/sglang_dp_attention_cases.py) and against hand arithmetic from the configs for a rank's weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UnsupportedModel, WontFit
from launcher.common.units import GiB
from launcher.engines import sglang as sg
from launcher.engines.sglang import architectures as layouts
from launcher.engines.sglang import parameters
from launcher.engines.sglang import rules as sr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import Quantization, geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE = json.loads((DATA / "sglang_dp_attention_oracle.json").read_text())
VERSIONS = sorted(ORACLE["runs"])


def geometry(name: str) -> Any:
    raw = json.loads((DATA / "configs" / f"{name}.json").read_text())
    return geometry_from_config({k: v for k, v in raw.items() if not k.startswith("_")})


CARDS = {24564: "rtx4090", 81559: "h100", 143771: "h200", 183359: "b200"}  # the grid's cards by NVML MiB


def card(record: dict[str, Any]) -> Any:
    return hypothetical_gpus([CARDS[int(record["id"].split("|")[1])]])[0]


def records(version: str, *, errors: bool = False) -> list[dict[str, Any]]:
    return [r for r in ORACLE["runs"][version] if ("error" in r) == errors]


def setup_of(record: dict[str, Any]) -> tuple[Any, dict[str, Any], int, int]:
    pinned = sg.pinned_flags(record["flags"])
    tp = pinned["--tp-size"]
    return geometry(record["id"].split("|")[0]), pinned, tp, sr.data_parallel(pinned)[1]


def test_the_grid_covers_both_releases_and_spellings() -> None:
    assert VERSIONS == ["0.5.22", "0.5.23"]
    for version in VERSIONS:
        assert len(records(version)) == 484 and len(records(version, errors=True)) == 49
        assert any("--enable-dp-attention" in r["flags"] for r in records(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_fraction_and_chunk_equal_sglang(version: str) -> None:
    """The default fraction with its max_bs x D x 3 (+1.5 above 300) reserve, and the chunk divided by D."""
    rules, _ = sr.rules_for(version)
    mismatches = []
    for record in records(version):
        model, pinned, tp, dp = setup_of(record)
        derivation = sg.default_fraction(model, gpu_mem_mib=int(record["id"].split("|")[1]), tp=tp, pp=1,
                                         pinned=pinned, rules=rules, attn_dp=dp,
                                         compute_capability=card(record).compute_capability)
        if (derivation.fraction, derivation.chunked_prefill_size) != (record["mem_fraction_static"],
                                                                      record["chunked_prefill_size"]):
            mismatches.append((record["id"], derivation.fraction, record["mem_fraction_static"]))
    assert mismatches == []


@pytest.mark.parametrize("version", VERSIONS)
def test_cell_pool_and_requests_equal_sglang(version: str) -> None:
    """The pool holds the KV heads of T / D ranks; tokens from P, A and the fraction; --max-running-requests // D."""
    rules, _ = sr.rules_for(version)
    checked, mismatches = 0, []
    for record in records(version):
        kv = record.get("kv", {})
        if "max_total_num_tokens" not in kv:
            continue
        model, pinned, tp, dp = setup_of(record)
        lay = layouts.layout(model, rules)
        kv_bytes = sg.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), "bfloat16", model)[0]
        cell = layouts.cell_size_bytes(lay, kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1, tp=tp // dp, pp=1,
                                       pinned=pinned, rules=rules)
        tokens, _ = sg.pool_tokens(pre_load_bytes=kv["pre_model_load_gib"] * GiB,
                                   after_load_bytes=kv["available_gib"] * GiB,
                                   fraction_value=record["mem_fraction_static"], cell_bytes=cell,
                                   page_size=record["page_size"], max_total_tokens=None)
        mrr = pinned.get("--max-running-requests")
        if mrr is not None and mrr < dp and version == "0.5.22":
            assert kv["max_running_requests"] == 0  # SGLang's own figure; the plan refuses it (below)
            continue
        requests = layouts.running_requests(tokens, record["context_len"], None if mrr is None else max(1, mrr // dp),
                                            rules)
        checked += 1
        if (cell, tokens, requests) != (kv["cell_size"], kv["max_total_num_tokens"], kv["max_running_requests"]):
            mismatches.append((record["id"], cell, kv["cell_size"], tokens, kv["max_total_num_tokens"], requests,
                               kv["max_running_requests"]))
    assert mismatches == []
    assert checked > 350


@pytest.mark.parametrize("version", VERSIONS)
def test_page_size_equals_sglang(version: str) -> None:
    """The page the plan floors the pool to and checks the chunk against: SGLang's, with trtllm_mla's 64 for
    DeepSeek-V3 / Kimi K2 on Blackwell and FlashMLA's 64 when pinned."""
    from launcher.engines.sglang.planner import _page_size

    rules, _ = sr.rules_for(version)
    mismatches = [(r["id"], page, r["page_size"]) for r in records(version)
                  if (page := _page_size(setup_of(r)[0], card(r), setup_of(r)[1], rules)[0]) != r["page_size"]]
    assert mismatches == []
    assert sum(1 for r in records(version) if r["page_size"] == 64) > 40


def plan(name: str, argv: list[str], *, weight_bytes: int, gpus: str = "8x h200", version: str = "0.5.23",
         model_geometry: Any = None) -> Plan:
    model = ResolvedModel(name=name, source="local", geometry=model_geometry or geometry(name),
                          weight_bytes=weight_bytes, weight_bytes_source="model.safetensors.index.json total_size",
                          config={})
    return make_plan(PlanRequest(model=model, engine="sglang", gpus=hypothetical_gpus([gpus]),
                                 engine_args=tuple(argv), engine_version=version))


def weights(p: Plan) -> int:
    return next(item.bytes for item in p.budget if item.key == "weights")


DSV3 = 688_586_727_753


class TestWeights:
    def test_deepseek_v3_attention_and_embedding_over_one_rank(self) -> None:
        """At T = D = 8 each rank holds the whole q_b_proj (128 x 192 x 1536), kv_b_proj (128 x 256 x 512) and
        o_proj (7168 x 16384) of 61 layers at fp8 with their 128 x 128 fp32 block scales, and the whole bf16
        embedding (129,280 rows), where T = 8 holds an eighth: + 8.55 and + 1.51 GiB."""
        per_layer = (128 * 192 * 1536 + 12 * 192 * 4) + (128 * 256 * 512 + 256 * 4 * 4) + (7168 * 16384 + 56 * 128 * 4)
        embed = 129_280 * 7168 * 2
        extra = parameters.attention_dp_extra(geometry("deepseek-v3"), tp=8, attn_tp=1, dtype_element=2)
        assert extra is not None
        assert extra[0] == (per_layer - per_layer // 8) * 61 + embed - embed // 8
        assert round(extra[0] / GiB, 2) == 10.06

    def test_qwen3_moe_gqa_heads_copied_past_the_kv_heads(self) -> None:
        """Qwen3-30B-A3B at T = 8, D = 4 (2 attention ranks): q/o 4096 x 2048 split 2 ways, not 8; K and V 2 of 4 heads
        a rank, not 1 (copied); the 151,936-row embedding over 2 ranks."""
        model = geometry("qwen3-30b-a3b")
        q_o = 2 * 4096 * 2048 * 2
        kv = 2 * 128 * 2048 * 2  # one head of K and V
        embed = (151_936 // 2 - 151_936 // 8) * 2048 * 2
        extra = parameters.attention_dp_extra(model, tp=8, attn_tp=2, dtype_element=2)
        assert extra is not None and extra[0] == (q_o // 2 - q_o // 8 + 2 * kv - kv) * 48 + embed

    def test_the_plan_adds_them_to_the_ranks_share(self) -> None:
        plain = plan("deepseek-v3", ["--tp", "8"], weight_bytes=DSV3)
        dp = plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8"], weight_bytes=DSV3)
        extra = parameters.attention_dp_extra(geometry("deepseek-v3"), tp=8, attn_tp=1, dtype_element=2)
        assert extra is not None and weights(dp) - weights(plain) == extra[0]
        assert dp.engine_figures["mem_fraction_static"] == 0.758  # SGLang's own, the oracle's 0.758
        assert plain.engine_figures["mem_fraction_static"] == 0.886
        assert dp.kv_cache_bytes < plain.kv_cache_bytes
        assert any("data-parallel attention: 8 groups of 1 attention ranks" in note for note in dp.notes)

    def test_the_old_spelling_is_the_same_plan(self) -> None:
        new = plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8"], weight_bytes=DSV3)
        old = plan("deepseek-v3", ["--tp", "8", "--dp-size", "8", "--enable-dp-attention"], weight_bytes=DSV3)
        assert (new.kv_cache_tokens, weights(new)) == (old.kv_cache_tokens, weights(old))
        assert new.gpu_count == old.gpu_count == 8  # the groups split the TP group: no more GPUs


class TestRefusedOrNotSized:
    def test_the_chunk_over_d_on_blackwells_pages(self) -> None:
        """8 x B200: trtllm_mla's pages of 64; --chunked-prefill-size 4000 // 8 = 500 is not a multiple of them
        (arg_groups/validation_hook.py:242-246)."""
        with pytest.raises(WontFit) as caught:
            plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8", "--chunked-prefill-size", "4000"],
                 weight_bytes=DSV3, gpus="8x b200")
        assert "chunked_prefill_size must be divisible by page_size" in str(caught.value)

    def test_0_5_22_divides_the_request_limit_to_zero(self) -> None:
        argv = ["--tp", "8", "--attn-dp-size", "8", "--max-running-requests", "4"]
        with pytest.raises(WontFit) as caught:
            plan("deepseek-v3", argv, weight_bytes=DSV3, version="0.5.22")
        assert "max_running_request is zero" in str(caught.value)
        assert plan("deepseek-v3", argv, weight_bytes=DSV3).kv_cache_tokens > 0  # 0.5.23 keeps one a rank

    def test_both_spellings_at_once(self) -> None:
        with pytest.raises(WontFit) as caught:
            plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "4", "--dp-size", "2", "--enable-dp-attention"],
                 weight_bytes=DSV3, gpus="16x h200")
        assert "data-parallel replicas combined with attention data parallelism are not supported" in str(caught.value)

    def test_heads_split_over_the_attention_group(self) -> None:
        """Qwen3-30B-A3B's 32 heads do not split over 6 ranks, but over T / D = 2 they do (qwen3_moe.py:502-517)."""
        assert plan("qwen3-30b-a3b", ["--tp", "6", "--attn-dp-size", "3"], weight_bytes=57 * GiB,
                    gpus="6x h100").kv_cache_tokens > 0

    def test_moe_dense_tp_size_as_sglang_takes_it(self) -> None:
        assert plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8", "--moe-dense-tp-size", "8"],
                    weight_bytes=DSV3).kv_cache_tokens > 0  # the default's T split
        with pytest.raises(WontFit) as caught:
            plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8", "--moe-dense-tp-size", "2"], weight_bytes=DSV3)
        assert "moe_dense_tp_size only supports None, 1, or tp_size currently" in str(caught.value)

    def test_concurrency_spreads_over_the_groups(self) -> None:
        """Each group has its own pool and SGLang deals requests round robin: 8 requests of 131,072 tokens over
        8 pools of ~184k tokens each fit; one pool never held them all."""
        model = ResolvedModel(name="deepseek-v3", source="local", geometry=geometry("deepseek-v3"),
                              weight_bytes=DSV3, weight_bytes_source="index", config={})
        dp = make_plan(PlanRequest(model=model, engine="sglang", gpus=hypothetical_gpus(["8x h200"]), concurrency=8,
                                   engine_args=("--tp", "8", "--attn-dp-size", "8", "--context-length", "131072")))
        assert dp.max_model_len == 131072 and dp.max_concurrency >= 8

    def test_the_checkpoints_own_method_named_is_not_quantizing_on_load(self) -> None:
        """--quantization fp8 on DeepSeek-V3's fp8 checkpoint is its own method: sized."""
        assert plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8", "--quantization", "fp8"],
                    weight_bytes=DSV3).kv_cache_tokens > 0

    def test_d_must_divide_t(self) -> None:
        with pytest.raises(WontFit) as caught:
            plan("deepseek-v3", ["--tp", "8", "--attn-dp-size", "3"], weight_bytes=DSV3)
        assert "assert tp_size % attn_dp_size == 0" in str(caught.value)

    @pytest.mark.parametrize(("name", "argv", "version", "quantization", "why"), [
        ("deepseek-v3", ["--tp", "8", "--dp-size", "8", "--enable-dp-attention"], "0.5.21", None,
         "in releases before 0.5.22"),
        ("llama-3.1-70b-instruct", ["--tp", "8", "--attn-dp-size", "2"], "0.5.23", None,
         "for LlamaForCausalLM"),
        ("deepseek-v3", ["--tp", "8", "--attn-dp-size", "8", "--enable-dp-lm-head"], "0.5.23", None,
         "with --enable-dp-lm-head"),
        ("qwen3-30b-a3b", ["--tp", "8", "--attn-dp-size", "2"], "0.5.23", Quantization("awq", 4),
         "for a awq checkpoint"),
        ("qwen3-30b-a3b", ["--tp", "8", "--attn-dp-size", "2", "--quantization", "fp8"], "0.5.23", None,
         "with --quantization"),  # quantized while loading: the 16-bit peak and the fp8 split not derived
        ("qwen3-30b-a3b", ["--tp", "8", "--attn-dp-size", "2", "--attn-cp-size", "2"], "0.5.23", None,
         "attention context parallelism"),
    ])
    def test_what_is_not_sized_says_so(self, name: str, argv: list[str], version: str,
                                       quantization: Quantization | None, why: str) -> None:
        import dataclasses

        model = geometry(name)
        if quantization is not None:
            model = dataclasses.replace(model, quantization=quantization)
        with pytest.raises(UnsupportedModel) as caught:
            plan(name, argv, weight_bytes=100 * GiB, version=version, model_geometry=model)
        assert "not sized by safe-serve yet" in str(caught.value) and why in str(caught.value)
