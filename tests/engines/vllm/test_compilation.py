"""The CUDA graphs the pinned flags leave: `-O`, `--compilation-config` / `-cc` (JSON and dotted),
`--cudagraph-capture-sizes`, `--max-cudagraph-capture-size`, `--enforce-eager`, read as vLLM reads them
(tests/data/vllm_graphs_oracle.json: vLLM 0.32's own parser and `_set_cudagraph_sizes`), and what the
plan then counts. From 0.34 the five split keys and what the V2 runner captures from them
(tests/data/vllm_graphs_oracle_0.34.json: 0.34.0's parser, `_set_cudagraph_sizes`,
`_split_cudagraph_capture_sizes`, gpt-oss's hook and `decode_cudagraph_capture_shapes`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UsageError, WontFit
from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import rules as vr
from launcher.engines.vllm.compilation import GraphPins, graph_mode
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.calibration import calibration_key
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "data" / "vllm_graphs_oracle.json"
RECORDS = json.loads(GOLDEN.read_text())["records"]
GOLDEN_0_34 = json.loads((ROOT / "tests" / "data" / "vllm_graphs_oracle_0.34.json").read_text())
RECORDS_0_34 = GOLDEN_0_34["records"]


def _resolve(argv: list[str], *, version: str = "0.32.0", seqs: int = 256, batched: int = 8192,
             family: int = 90) -> tuple[str, tuple[int, ...]]:
    pinned = vr.pinned_flags(argv)
    mode = graph_mode(GraphPins.from_pinned(pinned), enforce_eager=bool(pinned.get("--enforce-eager")),
                      version=version)
    if mode.mode == "NONE":
        return mode.mode, ()
    return mode.mode, vb.capture_sizes(max_num_seqs=seqs, max_num_batched_tokens=batched, version=version,
                                       compute_capability=(family // 10, family % 10),
                                       interactivity=pinned.get("--performance-mode") == "interactivity",
                                       explicit=mode.capture_sizes, max_capture_size=mode.max_capture_size)


@pytest.mark.parametrize("record", RECORDS, ids=[" ".join(r["argv"]) or "defaults" for r in RECORDS])
def test_the_engine_resolves_the_same_mode_and_sizes(record: dict[str, Any]) -> None:
    kwargs = {"seqs": record["seqs"], "batched": record["batched"], "family": record["family"]}
    if record["outcome"] == "refuse":
        with pytest.raises(UsageError, match="mutually exclusive"):
            _resolve(record["argv"], **kwargs)
        return
    mode, sizes = _resolve(record["argv"], **kwargs)
    assert (mode, list(sizes)) == (record["mode"], record["sizes"])


def _captured_0_34(record: dict[str, Any]) -> tuple[str, list[int], list[int]]:
    """(mode, prefill token sizes, decode request counts) the V2 runner captures, as the plan counts them."""
    pinned = vr.pinned_flags(record["argv"])
    mode = graph_mode(GraphPins.from_pinned(pinned), enforce_eager=bool(pinned.get("--enforce-eager")),
                      version="0.34.0")
    if mode.mode == "NONE":
        return "NONE", [], []
    prefill, decode = vb.graph_sizes(
        max_num_seqs=record["seqs"], max_num_batched_tokens=record["batched"], version="0.34.0",
        compute_capability=(record["family"] // 10, record["family"] % 10),
        interactivity=pinned.get("--performance-mode") == "interactivity", explicit=mode.capture_sizes,
        max_capture_size=mode.max_capture_size, gpt_oss=bool(record.get("gpt_oss")), split=mode.split)
    if not prefill and not decode:  # nothing left to capture: vLLM sets NONE (config/vllm.py:2733-2737)
        return "NONE", [], []
    uses_prefill = mode.mode in ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE")
    uses_decode = mode.mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    return mode.mode, list(prefill) if uses_prefill else [], list(decode) if uses_decode else []


@pytest.mark.parametrize("record", RECORDS_0_34, ids=[
    f"{' '.join(r['argv']) or 'defaults'} seqs={r['seqs']} batched={r['batched']} sm{r['family']}"
    + (" gpt-oss" if r.get("gpt_oss") else "") for r in RECORDS_0_34])
def test_0_34_captures_the_same_graphs_as_its_own_code(record: dict[str, Any]) -> None:
    """Each record: the same mode, prefill sizes and decode counts; what vLLM's parser refuses is a usage
    error (exit 2), what its config refuses a refusal with vLLM's message (exit 78, below)."""
    if record["outcome"] == "refuse" and record["stage"] == "_set_cudagraph_sizes":
        with pytest.raises(vb.CaptureSizesRefused) as refused:
            _captured_0_34(record)
        assert refused.value.message == record["message"].removeprefix("ValueError: ")
        return
    if record["outcome"] == "refuse":
        with pytest.raises(UsageError):
            _captured_0_34(record)
        return
    assert _captured_0_34(record) == (record["mode"], record["prefill"], record["decode"])


def test_the_0_34_golden_file_covers_each_split_key_and_every_refusal_kind() -> None:
    assert GOLDEN_0_34["vllm"] == "0.34.0"
    written = " ".join(w for r in RECORDS_0_34 for w in r["argv"])
    for key in ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
                "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests",
                "max_decode_cudagraph_capture_tokens"):
        assert key in written
    stages = [r.get("stage") for r in RECORDS_0_34 if r["outcome"] == "refuse"]
    assert sorted(stages) == ["_set_cudagraph_sizes"] * 3 + ["argparse"] + ["create_engine_config"] * 2
    assert sum(bool(r.get("gpt_oss")) for r in RECORDS_0_34) == 7
    assert {r["family"] for r in RECORDS_0_34} == {90, 100}


def test_the_golden_file_covers_every_spelling_and_both_refusals() -> None:
    spellings = {w.split("=")[0].split(".")[0] for r in RECORDS for w in r["argv"] if w.startswith("-")}
    assert {"-O0", "-O", "--optimization-level", "-cc", "--compilation-config", "--compilation_config",
            "--cudagraph-capture-sizes", "--max-cudagraph-capture-size", "--enforce-eager"} <= spellings
    assert sum(r["outcome"] == "refuse" for r in RECORDS) == 2
    assert {r["mode"] for r in RECORDS if r["outcome"] == "accept"} == {
        "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}


@pytest.mark.slow
def test_the_oracle_still_says_so(tmp_path: Path) -> None:
    """vLLM's code, run now, gives the golden file (the real parser: a spelling it reads otherwise shows)."""
    python = os.environ.get("SAFE_SERVE_VLLM_PYTHON")
    if not python:
        pytest.skip("SAFE_SERVE_VLLM_PYTHON not set (.ci/run builds the vLLM CPU venv)")
    out = tmp_path / "graphs.json"
    subprocess.run([python, str(ROOT / "tests" / "oracles" / "vllm_graphs_oracle.py"), "--output", str(out)],
                   check=True, capture_output=True, timeout=300)
    assert json.loads(out.read_text())["records"] == RECORDS


class TestVersions:
    def test_0_11_reads_a_digit_after_o_as_the_compilation_level(self) -> None:
        """0.11: `-O` is `--compilation-config`; a level other than 3 with no named mode: no graphs
        (0.11.0 config/__init__.py:359-376)."""
        assert _resolve(["-O0"], version="0.11.0")[0] == "NONE"
        assert _resolve(["-O2"], version="0.11.0")[0] == "NONE"
        assert _resolve(["-O3"], version="0.11.0")[0] == "FULL_AND_PIECEWISE"
        assert _resolve(["-O0", "-cc.cudagraph_mode=PIECEWISE"], version="0.11.0")[0] == "PIECEWISE"

    def test_before_0_11_piecewise_only_and_pins_not_read(self) -> None:
        assert _resolve(["-O0"], version="0.10.1")[0] == "PIECEWISE"
        assert _resolve(["--enforce-eager"], version="0.10.1")[0] == "NONE"

    def test_json_nested_past_pythons_stack_is_a_usage_error(self) -> None:
        """100,000 brackets: json.loads raises RecursionError, which must be exit 2, not an internal error."""
        for argv in (["-cc", "[" * 100_000], ["-cc.cudagraph_capture_sizes=" + "[" * 100_000]):
            with pytest.raises(UsageError):
                vr.pinned_flags(argv)

    def test_an_unknown_mode_is_refused_like_vllm_refuses_it(self) -> None:
        with pytest.raises(UsageError, match="not one of vLLM's modes"):
            _resolve(["-cc.cudagraph_mode=SOMETIMES"])

    def test_the_split_keys_before_0_34_are_refused_as_its_parser_refuses_them(self) -> None:
        """0.33's CompilationConfig forbids unknown fields: its argparse exits on the key (exit 2 here)."""
        with pytest.raises(UsageError, match="0.33.0's parser refuses compilation_config.max_decode_cudagraph_"
                                             "capture_requests: the key is new in 0.34"):
            _resolve(["-cc.max_decode_cudagraph_capture_requests=64"], version="0.33.0")
        assert _resolve(["-cc.max_decode_cudagraph_capture_requests=64"], version="0.34.0")[0] == \
            "FULL_AND_PIECEWISE"

    def test_a_split_count_is_read_as_pydantic_reads_it(self) -> None:
        """0.34's CompilationConfig takes "64" as 64 and refuses 64.5 (run on its parser)."""
        pinned = vr.pinned_flags(["-cc", '{"max_decode_cudagraph_capture_requests": "64"}'])
        mode = graph_mode(GraphPins.from_pinned(pinned), enforce_eager=False, version="0.34.0")
        assert mode.split.max_decode_requests == 64
        with pytest.raises(UsageError, match="is not a count of at least 0"):
            _resolve(["-cc", '{"max_decode_cudagraph_capture_requests": 64.5}'], version="0.34.0")

    def test_a_split_key_of_the_wrong_kind_is_a_usage_error(self) -> None:
        for argv in (["-cc.max_decode_cudagraph_capture_tokens=0"], ["-cc.max_prefill_cudagraph_capture_tokens=-1"],
                     ["-cc.max_decode_cudagraph_capture_requests=lots"],
                     ["-cc.prefill_cudagraph_capture_token_sizes=[1,\"x\"]"],
                     ["-cc.decode_cudagraph_capture_request_sizes=4"]):
            with pytest.raises(UsageError, match="compilation config"):
                _resolve(argv, version="0.34.0")


def _graphs(argv: list[str], version: str = "0.32.0") -> vb.CudaGraphs:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    pinned = vr.pinned_flags(argv)
    mode = graph_mode(GraphPins.from_pinned(pinned), enforce_eager=bool(pinned.get("--enforce-eager")),
                      version=version)
    return vb.cuda_graphs(geometry_from_config(config), rules=vr.rules_for(version)[0], version=version, layers=32,
                          max_num_seqs=256, max_num_batched_tokens=8192, compute_capability=(9, 0), mode=mode)


class TestGraphCounts:
    def test_each_mode_counts_its_graphs(self) -> None:
        """51 sizes up to 512 at max_num_seqs 256, 35 of them decode sizes (1, 2, 4, 8..248 by 8, 256)."""
        assert (_graphs([]).piecewise, _graphs([]).full) == (51, 35)
        assert (_graphs(["-O1"]).piecewise, _graphs(["-O1"]).full) == (51, 0)
        assert (_graphs(["-cc.cudagraph_mode=FULL"]).piecewise, _graphs(["-cc.cudagraph_mode=FULL"]).full) == (0, 51)
        decode_only = _graphs(["-cc.cudagraph_mode=FULL_DECODE_ONLY"])
        assert (decode_only.piecewise, decode_only.full) == (0, 35)
        assert _graphs(["--cudagraph-capture-sizes", "1", "2", "4", "8"]).count == 8

    def test_no_graphs_cost_nothing_not_even_a_band(self) -> None:
        for argv in (["-O0"], ["--enforce-eager"], ["-cc.cudagraph_mode=NONE"]):
            graphs = _graphs(argv)
            assert (graphs.count, graphs.estimate_bytes, graphs.error_bytes) == (0, 0, 0)
        # 0.10: the unfitted band is 1.27 GiB with graphs, nothing without them
        assert _graphs(["--enforce-eager"], version="0.10.1").error_bytes == 0
        assert _graphs([], version="0.10.1").error_bytes >= int(1.27 * GiB) - 1


def plan_for(model: str, *, gpu: str, engine_args: list[str] | None = None, version: str | None = None) -> Plan:
    base = PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpu]))
    return make_plan(dataclasses.replace(base, engine_args=tuple(engine_args or ()), engine_version=version))


class TestThePlan:
    def test_o0_plans_like_enforce_eager_and_o1_counts_half(self) -> None:
        default = plan_for("qwen2.5-7b", gpu="h100")
        eager = plan_for("qwen2.5-7b", gpu="h100", engine_args=["--enforce-eager"])
        o0 = plan_for("qwen2.5-7b", gpu="h100", engine_args=["-O0"])
        o1 = plan_for("qwen2.5-7b", gpu="h100", engine_args=["-O", "1"])
        assert o0.item("cudagraph").bytes == 0 and o0.kv_cache_bytes == eager.kv_cache_bytes
        graphs = default.item("cudagraph").bytes
        first = vb.CUDAGRAPH_FIRST_CAPTURE_BYTES  # one first capture, then each graph's cost
        assert graphs > first and o1.item("cudagraph").bytes == first + (graphs - first) * 51 // (51 + 51)
        assert default.kv_cache_bytes < o1.kv_cache_bytes < o0.kv_cache_bytes
        assert "pinned -O0" in o0.item("cudagraph").detail and o0.item("cudagraph").source == "pinned"

    def test_a_one_kind_mode_keeps_the_other_kinds_cost_in_its_band(self) -> None:
        """The per-graph cost was fitted on FULL_AND_PIECEWISE captures: PIECEWISE alone is planned at
        half, with the other half inside the band (the safe side); no graphs carry no band."""
        default = plan_for("qwen2.5-7b", gpu="h100").item("cudagraph")
        o1 = plan_for("qwen2.5-7b", gpu="h100", engine_args=["-O1"]).item("cudagraph")
        assert o1.error_bytes >= default.bytes - o1.bytes > 0
        assert "the band holds the 51 graphs FULL_AND_PIECEWISE would add" in o1.detail
        assert plan_for("qwen2.5-7b", gpu="h100", engine_args=["-O0"]).item("cudagraph").error_bytes == 0

    def test_the_graph_flags_are_kept_and_shown_as_written(self) -> None:
        plan = plan_for("qwen2.5-7b", gpu="h100", engine_args=["-cc.cudagraph_mode=PIECEWISE",
                                                                "--max-cudagraph-capture-size", "64"])
        assert plan.pinned["--compilation-config"] == '{"cudagraph_mode":"PIECEWISE"}'
        assert plan.pinned["--max-cudagraph-capture-size"] == 64
        assert plan.item("cudagraph").detail.startswith("pinned cudagraph_mode PIECEWISE; 11 PIECEWISE + 0 FULL")
        json.dumps(plan.pinned)  # the JSON output carries them

    def test_0_34_split_pins_change_the_graphs_counted_and_the_kv_cache(self) -> None:
        """An H100 at max_num_seqs 1024: 51 decode graphs by default; a ceiling of 64 requests leaves the
        request grid's 21 (1..6, 8..16 by 2, 20..32 by 4, 40..64 by 8); the prefill graphs stay 51."""
        default = plan_for("qwen2.5-7b", gpu="h100", version="0.34.0")
        capped = plan_for("qwen2.5-7b", gpu="h100", version="0.34.0",
                          engine_args=["-cc.max_decode_cudagraph_capture_requests=64"])
        assert "51 PIECEWISE + 51 FULL graphs" in default.item("cudagraph").detail
        assert "at the pinned capture sizes; 51 PIECEWISE + 21 FULL graphs" in capped.item("cudagraph").detail
        first = vb.CUDAGRAPH_FIRST_CAPTURE_BYTES
        assert capped.item("cudagraph").bytes == first + (default.item("cudagraph").bytes - first) * 72 // 102
        assert capped.kv_cache_bytes > default.kv_cache_bytes
        assert capped.pinned["--compilation-config"] == '{"max_decode_cudagraph_capture_requests":64}'

    def test_0_34_refuses_what_its_config_refuses_with_its_message(self) -> None:
        for argv, message in (
                (["-cc.decode_cudagraph_capture_request_sizes=[4,64]", "-cc.max_decode_cudagraph_capture_requests=32"],
                 "decode_cudagraph_capture_request_sizes holds 64, above max_decode_cudagraph_capture_requests=32."),
                (["--max-cudagraph-capture-size", "64", "-cc.max_decode_cudagraph_capture_requests=16"],
                 "The deprecated cudagraph_capture_sizes and max_cudagraph_capture_size cannot be combined")):
            with pytest.raises(WontFit) as refused:
                plan_for("qwen2.5-7b", gpu="h100", version="0.34.0", engine_args=argv)
            assert message in str(refused.value) and refused.value.rule == "cudagraph-capture-sizes"
            assert "vllm/config/vllm.py:" in str(refused.value)

    def test_another_graph_setting_is_another_calibration_setup(self) -> None:
        def key(argv: list[str]) -> str:
            return calibration_key(gpu_name="H100", model="m", engine="vllm", engine_version="0.32.0",
                                   pinned=vr.pinned_flags(argv), key_flags=vr.CALIBRATION_KEY_FLAGS)

        assert len({key([]), key(["-O0"]), key(["-O1"]), key(["-cc.cudagraph_mode=NONE"]),
                    key(["--cudagraph-capture-sizes", "1", "2"])}) == 5
        assert key(["-O", "1"]) == key(["--optimization-level=1"])


def test_graphs_above_the_fitted_sizes_count_twice_in_the_band() -> None:
    """The per-graph cost was fitted on captures up to size 512: Blackwell's default 1024 (32 sizes
    528..1024, a PIECEWISE and a FULL graph each at max_num_seqs 1024) or a pinned ceiling carry their
    whole cost again in the band."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    geometry = geometry_from_config(config)

    def graphs(argv: list[str], cc: tuple[int, int]) -> vb.CudaGraphs:
        mode = graph_mode(GraphPins.from_pinned(vr.pinned_flags(argv)), enforce_eager=False, version="0.32.0")
        return vb.cuda_graphs(geometry, rules=vr.rules_for("0.32.0")[0], version="0.32.0", layers=32,
                              max_num_seqs=1024, max_num_batched_tokens=16384, compute_capability=cc, mode=mode)

    blackwell, hopper = graphs([], (10, 0)), graphs([], (9, 0))
    assert (blackwell.beyond_fitted_graphs, hopper.beyond_fitted_graphs) == (64, 0)
    assert blackwell.error_bytes - blackwell.count * 32 * vb.CUDAGRAPH_DENSE_ERROR_PER_GRAPH_LAYER \
        == 64 * blackwell.per_graph_bytes
    assert graphs(["--max-cudagraph-capture-size", "1024"], (9, 0)).beyond_fitted_graphs == 64
