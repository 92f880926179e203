"""The published startup logs planned as a user would plan them (bench/startup_logs.py), scored
leave-one-out (no log is scored by a constant fitted on it, nor by a CUDA total read from it):
every case that started is planned within its band, none is refused, none is on the unsafe side
outside its band."""

from __future__ import annotations

import statistics
from pathlib import Path
from types import ModuleType

import pytest

from launcher.model.catalog import load_catalog
from tests import bench_scripts

H100 = "NVIDIA H100 80GB HBM3"  # the card all but one of the fitted logs ran on (the other: an L40S)
BENCH = Path(__file__).resolve().parent.parent / "bench" / "startup_logs.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_scripts.load("startup_logs")


@pytest.fixture(scope="module")
def scored(bench: ModuleType) -> tuple[list, list, object]:
    return bench.rows()  # type: ignore[no-any-return]


def test_started_cases_are_planned_within_their_band(bench: ModuleType, scored: tuple) -> None:
    rows, _, _ = scored
    started = [r for r in rows if not r.engine_failed]
    assert len(started) >= 8
    assert all(r.predicted is not None for r in started), "a false refusal"
    assert not [r.case for r in started if not r.in_band]
    assert not [r.case for r in started if r.unsafe_outside]
    errors = [abs(r.error) for r in started]
    # Targets of the GPU-truth issue: median |error| <= 1.5 %, p90 <= 4 %, leave-one-out.
    assert statistics.median(errors) <= 0.015 and bench.percentile(errors, 0.9) <= 0.04


def test_bands_are_budget_terms_not_a_third_of_the_kv(scored: tuple) -> None:
    """vLLM's KV bytes do not depend on the layout: an unverified architecture widens its tokens, not
    the bytes band. Every started case planned to fit has a band within +/- 5 % of its plan, or, where the
    cache is small beside the model (the budget terms' errors, a few hundred MiB, are more than 5 % of it: a
    70B at TP 2 with 3 GiB of KV), its length still fits at the band's low end; one that says MAY NOT FIT names
    the figure at risk instead (Qwen3-32B's 4.45 GiB beside 61 GiB of weights on one H100). That holds on the
    H100, whose terms are fitted on its own logs; on a card no fitted log ran on, the terms keep their bands in
    GiB (test_a_card_without_fitted_logs_keeps_its_terms_bands)."""
    rows, _, _ = scored
    assert any(row.may_not_fit and not row.engine_failed for row in rows)
    small = []
    for row in rows:
        if row.predicted is not None and row.engine == "vllm" and not row.engine_failed and not row.may_not_fit:
            if row.high - row.predicted <= 0.05 * row.predicted or row.gpu != H100:
                continue
            small.append(row.case)
            assert row.high - row.predicted <= 1.0, row.case  # GiB: the terms' errors, not a share of the KV
            assert row.predicted < 8.0, row.case  # only beside a cache this small
    assert len(small) <= 4, small


def test_a_card_without_fitted_logs_keeps_its_terms_bands(bench: ModuleType, scored: tuple) -> None:
    """The L4 write-up (vLLM 0.28, Qwen3-14B-AWQ, defaults): one card, TP 2 and PP 2 from the author's table,
    scored as three starts of one source, on the L4's published 22.16 GiB CUDA total. No fitted term was
    measured on an L4 or on 0.28: the non-torch memory, peak and graph estimate keep their bands in GiB (+/- 0.6-0.8
    beside a 9-14 GiB cache, more than 5 % of the smaller), every logged figure inside them, and the model's
    40,960 tokens hold at the low end. The single card and PP 2 within 2.5 % (the allocator's segments around
    the weights, counted from 0.27, bring them from +3.4 and +2.3 %); TP 2 5.0 % under the log, on the safe side.
    Every other card's rows keep their bands under 1 GiB too."""
    rows, _, _ = scored
    l4 = {r.case.split("/")[-1]: r for r in rows if r.case.startswith("vllm-l4-qwen3-14b-awq")}
    assert sorted(l4) == ["pp2", "tp2", "vllm-l4-qwen3-14b-awq-single-and-tp2"]  # the replicas' row is no case
    for row in l4.values():
        assert row.in_band and row.version == "0.28.0" and row.gpu == "NVIDIA L4"
    assert abs(l4["vllm-l4-qwen3-14b-awq-single-and-tp2"].error) < 0.025 and abs(l4["pp2"].error) < 0.025
    assert -0.06 < l4["tp2"].error < 0
    single = l4["vllm-l4-qwen3-14b-awq-single-and-tp2"]
    assert single.high - single.predicted > 0.05 * single.predicted  # over 5 %, within 1 GiB
    for row in rows:
        if row.predicted is not None and row.engine == "vllm" and not row.engine_failed and row.gpu != H100:
            assert row.high - row.predicted <= 1.0, row.case
    for case in (c for c in bench.load_cases() if c["id"].startswith("vllm-l4-qwen3-14b-awq")):
        _, plan, _ = bench.plan_case(case, load_catalog())
        per_token = plan.kv_cache_bytes / plan.kv_cache_tokens
        assert plan.max_model_len == 40960 and plan.kv_cache_bytes_low / per_token >= 40960
        assert (plan.tp, plan.pp) == (
            int(case["flags"].get("tensor_parallel_size") or 1), int(case["flags"].get("pipeline_parallel_size") or 1))


def test_a_small_cache_with_a_wide_band_still_fits_at_its_low_end(bench: ModuleType) -> None:
    """Kimi-Dev-72B at TP 2 on H100s (vLLM 0.19, 0.95, 8,192 tokens): 3.02 GiB of KV logged, +/- 0.4 GiB of
    budget terms around a 3.06 GiB plan; the low end still holds 8,192 tokens, so the plan fits, and says the
    tokens' band."""
    case = next(c for c in bench.load_cases() if c["id"] == "vllm-llmdplanner-run-h100-kimi-dev-72b-tp2-mml8192")
    _, plan, _ = bench.plan_case(case, load_catalog())
    per_token = plan.kv_cache_bytes / plan.kv_cache_tokens
    assert plan.may_not_fit is None and plan.max_model_len == 8192
    assert plan.kv_cache_bytes_low / per_token >= plan.max_model_len
    assert abs(plan.kv_cache_bytes / 2**30 - 3.02) < 0.1


def test_sglang_logs_with_a_pool_are_scored(scored: tuple) -> None:
    """The SGLang starts with a pool figure and a config: the RTX 4090 TP 4 one (newest rules assumed from
    its date) and the WSL2 RTX 3090 one (0.5.1's table, the free memory the log shows) are within 1 %;
    the 4 x L4 one (0.4.3.post4, the fraction it printed, the L4's CUDA total NVML less the typical
    reserve) is under, on the safe side, inside its band."""
    rows, _, _ = scored
    sglang = {r.case: r for r in rows if r.engine == "sglang"}
    assert set(sglang) == {"sglang-qwen3-14b-4x4090-tp4-mf080", "sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2",
                           "sglang-llmsinclouds-4xl4-qwq-32b-tp4"}
    assert all(r.in_band for r in sglang.values())
    assert all(abs(r.error) < 0.01 for r in sglang.values() if "l4" not in r.case)
    l4 = sglang["sglang-llmsinclouds-4xl4-qwq-32b-tp4"]
    assert l4.predicted is not None and l4.error is not None and -0.08 < l4.error < 0


def test_real_configs_stand_in_for_missing_model_configs(scored: tuple) -> None:
    """Logs whose config was not copied beside them take the repo's real config with the log's weights:
    Mixtral-8x7B at TP 2 on vLLM 0.19 (28.44 GiB logged) is planned within 0.5 %."""
    rows, _, _ = scored
    mixtral = next(r for r in rows if r.case == "vllm-llmdplanner-2xh100-mixtral-8x7b-tp2-mml8192")
    assert mixtral.error is not None and mixtral.in_band and abs(mixtral.error) < 0.005
    assert "config mixtral-8x7b-instruct-v0.1.json" in mixtral.note


def test_context_readings_held_out_are_inside_the_band(bench: ModuleType, scored: tuple) -> None:
    """The CUDA context (and NVLS) constants are the median of the logs' first free-memory readings;
    each source's reading, the others' median taken without it, misses by less than the plan's band."""
    _, _, scoring = scored
    for attribute, sources in (("CUDA_CONTEXT_BYTES", 4), ("NVLS_NCCL_BYTES", 3)):
        fit = next(f for f in bench.FITS if f.attribute == attribute)
        by_source = scoring.residuals[fit]
        assert len(by_source) == sources
        assert abs(statistics.median(by_source.values()) - getattr(fit.module, attribute)) < 2**20
        band = getattr(fit.module, fit.band)
        for source, value in by_source.items():
            others = [v for s, v in by_source.items() if s != source]
            assert abs(value - statistics.median(others)) <= band, source


def test_fitted_constants_are_refitted_without_the_scored_log(bench: ModuleType, scored: tuple) -> None:
    _, _, scoring = scored
    fit = next(f for f in bench.FITS if f.attribute == "NON_TORCH_BYTES_TP1_V019")
    by_source = scoring.residuals[fit]
    assert len(by_source) >= 5
    source = next(iter(by_source))
    case = next(c for c in scoring.cases if bench._source(c) == source)
    refit = scoring.refit(case)[fit]
    assert refit == statistics.median(v for s, v in by_source.items() if s != source)
    # The CUDA total of the H100 when scoring a sweep log comes from the other sources only.
    card = next(c for c in scoring.catalog(source) if c.name == "NVIDIA H100 80GB HBM3")
    assert card.cuda_total_bytes is not None and card.cuda_total_error_bytes > 0


def test_flags_are_taken_as_typed_not_as_the_logs_defaults(bench: ModuleType) -> None:
    case = {"engine": "vllm", "flags": {"max_model_len": 8192, "gpu_memory_utilization": "0.9 (default)",
                                        "tensor_parallel_size": 2, "enforce_eager": "false (from config line)"}}
    assert bench.engine_args(case) == ("--max-model-len", "8192", "--tensor-parallel-size", "2")


def test_readme_quotes_the_bench(bench: ModuleType, scored: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's accuracy table is the bench's own output, line for line."""
    rows, _, _ = scored
    bench.print_summary(rows)
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    readme = (BENCH.parent.parent / "README.md").read_text()
    start = readme.index("    engine  version  GPU class")
    quoted = [line[4:].rstrip() for line in readme[start:].split("\n\n")[0].splitlines()]
    assert quoted and all(line in printed for line in quoted), [q for q in quoted if q not in printed]


def test_each_fitted_terms_band_covers_its_held_out_residuals(bench: ModuleType, scored: tuple) -> None:
    """A band from errors on data not fitted: every log's residual against the constant refitted
    without it lies inside the band the plan states for that term."""
    _, _, scoring = scored
    for fit, by_source in scoring.residuals.items():
        band = getattr(fit.module, fit.band) if fit.band else 0  # no band: one source, nothing held out
        for source, value in by_source.items():
            others = [r for s, r in by_source.items() if s != source]
            if others:
                assert abs(value - statistics.median(others)) <= band, (fit.name, source)


def test_vllms_own_graph_estimates_are_scored(bench: ModuleType, scored: tuple,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """llm-d-planner's 0.19 run JSONs carry vLLM's "Estimated CUDA graph memory" (what 0.21+ subtract). The plan's
    graphs (fitted on what capture took, which the estimate mostly undershoots) are at or above it but for two
    starts whose second PIECEWISE capture sampled 26 MiB instead of 4-6 (vLLM's own estimate spiking by ~1 GiB:
    Granite-3.1-2B, Llama-3.1-8B at TP 2); the pipeline stages (PP 2 and 4) are inside their band."""
    _, _, scoring = scored
    found = bench.print_graph_estimates(scoring)
    assert capsys.readouterr().out.strip().startswith(f"vLLM's own CUDA-graph estimate (what 0.21+ subtract; "
                                                      f"0.19 prints it): {len(found)} starts")
    assert len(found) == 68
    under = sorted(case for case, diff, band in found if diff < -band)
    assert under == ["vllm-llmdplanner-run-h100-granite-3.1-2b-instruct-mml8192",
                     "vllm-llmdplanner-run-h100-llama-3.1-8b-instruct-tp2-mml8192"]
    inside = [case for case, diff, band in found if abs(diff) <= band]
    assert len(inside) >= 63
    assert {"vllm-llmdplanner-run-h100-llama-3.1-8b-instruct-pp2-mml8192",
            "vllm-llmdplanner-run-h100-llama-3.1-8b-instruct-pp4-mml8192"} <= set(inside)
