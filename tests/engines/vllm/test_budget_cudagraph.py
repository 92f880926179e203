"""The CUDA-graph term: how many graphs vLLM captures (its own arithmetic, config/vllm.py
`_set_cudagraph_sizes` and the FULL_AND_PIECEWISE dispatch), what one costs (fitted on the published
captures), and which versions take the estimate out of the KV budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.common.units import GiB, MiB
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import rules as vr
from launcher.model.config import geometry_from_config

DATA = Path(__file__).resolve().parents[2] / "data" / "startup-logs"
SM90, SM100 = (9, 0), (10, 0)


def _sizes(version: str, seqs: int, batched: int, cc: tuple[int, int] | None = SM90) -> tuple[int, ...]:
    return vb.capture_sizes(max_num_seqs=seqs, max_num_batched_tokens=batched, version=version, compute_capability=cc)


class TestCaptureSizes:
    def test_the_default_list_from_0_12(self) -> None:
        """1, 2, 4, multiples of 8 below 256, multiples of 16 up to min(2 x max_num_seqs, 512)."""
        sizes = _sizes("0.32.0", 256, 2048)
        assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512) and len(sizes) == 51
        assert _sizes("0.19.0", 1024, 8192) == sizes  # the H100 tier: same ceiling

    def test_before_0_12_every_multiple_of_8(self) -> None:
        sizes = _sizes("0.11.0", 256, 2048)
        assert len(sizes) == 67 and sizes[-2:] == (504, 512)

    def test_data_centre_blackwell_reaches_1024_from_0_28(self) -> None:
        assert _sizes("0.32.0", 1024, 16384, SM100)[-1] == 1024 and len(_sizes("0.32.0", 1024, 16384, SM100)) == 83
        assert _sizes("0.27.0", 1024, 16384, SM100)[-1] == 512
        assert _sizes("0.32.0", 1024, 16384, (12, 0))[-1] == 512  # RTX 50xx is not the 10.x family

    def test_small_batches_and_their_appended_sizes(self) -> None:
        """The ceiling is at most max_num_batched_tokens, which is captured itself from 0.26; max_num_seqs
        from 0.32."""
        assert _sizes("0.20.0", 256, 300)[-1] == 288  # 256, 272, 288: steps of 16 above 256
        assert _sizes("0.26.0", 256, 300)[-1] == 300
        assert 100 in _sizes("0.32.0", 100, 2048) and 100 not in _sizes("0.29.0", 100, 2048)


def _graphs(version: str, architecture: str = "LlamaForCausalLM", seqs: int = 256, batched: int = 2048,
            experts: int = 0) -> vb.CudaGraphs:
    config = {"architectures": [architecture], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              **({"num_local_experts": experts, "num_experts_per_tok": 2} if experts else {})}
    return vb.cuda_graphs(geometry_from_config(config), rules=vr.rules_for(version)[0], version=version, layers=32,
                          max_num_seqs=seqs, max_num_batched_tokens=batched, compute_capability=SM90)


class TestGraphs:
    def test_full_and_piecewise(self) -> None:
        """One PIECEWISE graph per size, one FULL decode graph per size up to max_num_seqs."""
        graphs = _graphs("0.33.0")
        assert (graphs.piecewise, graphs.full, graphs.count) == (51, 35, 86) and graphs.subtracted
        assert _graphs("0.19.0", seqs=1024, batched=8192).count == 102
        assert _graphs("0.10.2").full == 0  # PIECEWISE only before FULL_AND_PIECEWISE became the default (0.11)

    def test_cost_per_graph_and_layer(self) -> None:
        graphs = _graphs("0.33.0")
        first, per = vb.CUDAGRAPH_FIRST_CAPTURE_BYTES, vb.CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER
        assert graphs.estimate_bytes == first + 86 * 32 * per
        assert abs(graphs.estimate_bytes / GiB - 0.82) < 0.01 and abs(graphs.error_bytes / GiB - 0.242) < 0.01

    def test_moe_per_graph_never_below_a_dense_model(self) -> None:
        graphs = _graphs("0.33.0", experts=8)
        assert graphs.estimate_bytes == 86 * vb.CUDAGRAPH_MOE_BYTES_PER_GRAPH
        assert graphs.estimate_bytes > _graphs("0.33.0").estimate_bytes

    def test_the_description_names_the_form_that_binds(self) -> None:
        """A MoE model of 94 layers (Qwen3-235B-A22B) takes the dense form, first capture and all (2.05 GiB over
        102 graphs, above 102 x 12.75 MiB): the row's reason says so rather than a per-graph cost that misses it."""
        deep = vb.CudaGraphs(piecewise=51, full=51, largest=512, layers=94, moe=True, subtracted=True)
        first, per = vb.CUDAGRAPH_FIRST_CAPTURE_BYTES, vb.CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER
        assert deep.estimate_bytes == first + 102 * 94 * per > 102 * vb.CUDAGRAPH_MOE_BYTES_PER_GRAPH
        assert "x 94 layers x 0.184 MiB beside a 0.32 GiB first capture" in deep.describe()
        assert "takes the dense form" in deep.describe()
        shallow = vb.CudaGraphs(piecewise=51, full=51, largest=512, layers=48, moe=True, subtracted=True)
        assert shallow.estimate_bytes == 102 * vb.CUDAGRAPH_MOE_BYTES_PER_GRAPH
        assert "x 12.8 MiB (MoE, per graph" in shallow.describe()

    @pytest.mark.parametrize(("version", "subtracted"), [("0.19.0", False), ("0.20.0", True), ("0.28.0", True),
                                                         ("0.33.0", True)])
    def test_which_versions_subtract_the_estimate(self, version: str, subtracted: bool) -> None:
        assert _graphs(version).subtracted is subtracted

    def test_the_v2_runner_estimates_nothing_before_0_29(self) -> None:
        """0.28's V2 runner returns 0 (v1/worker/gpu/model_runner.py:843): its graphs land outside the budget."""
        v2 = next(iter(vr.rules_for("0.28.0")[0].v2_runner))
        assert not _graphs("0.28.0", architecture=v2).subtracted
        assert _graphs("0.29.0", architecture=v2).subtracted


def test_every_published_capture_is_inside_its_band() -> None:
    """In sample (bench/startup_logs.py scores it leave-one-out): logged capture - planned, within the band."""
    checked = 0
    for name in ("startup-logs.yaml", "startup-logs-2.yaml"):
        for case in yaml.safe_load((DATA / name).read_text()):
            logged = (case.get("observed") or {}).get("cudagraph_gib")
            version = str(case.get("engine_version") or "")
            config = _config_of(case)
            if logged is None or config is None or not version:
                continue
            geometry = geometry_from_config(config)
            h100 = "H100" in case["gpu"]
            graphs = vb.cuda_graphs(geometry, rules=vr.rules_for(version)[0], version=version,
                                    layers=geometry.kv_layers, max_num_seqs=1024 if h100 else 256,
                                    max_num_batched_tokens=8192 if h100 else 2048, compute_capability=SM90)
            # 51 sizes to 512 (H100 tier), each PIECEWISE and FULL; gpt-oss's config hook captures to 1024:
            # 83 sizes (0.19.0 model_executor/models/config.py:120-133)
            gpt_oss = geometry.architecture in vb.GPT_OSS_ARCHITECTURES
            assert graphs.count == (166 if gpt_oss else 102), case["id"]
            assert graphs.beyond_fitted_graphs == (64 if gpt_oss else 0), case["id"]
            assert abs(float(logged) * GiB - graphs.estimate_bytes) <= graphs.error_bytes, case["id"]
            checked += 1
    assert checked == 10
    assert vb.CUDAGRAPH_MOE_ERROR_PER_GRAPH < 6 * MiB


def _config_of(case: dict) -> dict | None:
    """The config copied beside the log, else the repo's real config (tests/data/configs, by its README)."""
    if case.get("model_config"):
        return dict(json.loads((DATA / "models" / case["model_config"] / "config.json").read_text()))
    configs = DATA.parent / "configs"
    for line in (configs / "README.md").read_text().splitlines():
        cells = [c.strip(" `") for c in line.split("|")]
        if len(cells) > 4 and cells[4].lower() == str(case.get("model") or "").lower():
            return {k: v for k, v in json.loads((configs / cells[1]).read_text()).items() if not k.startswith("_")}
    return None


def test_versions_before_the_fitted_captures_keep_the_wide_band() -> None:
    """No capture before 0.11 has a known count: the band stays at the old formula's farthest miss."""
    assert _graphs("0.10.2").error_bytes == vb.CUDAGRAPH_UNFITTED_ERROR_BYTES
    assert _graphs("0.11.0").error_bytes < vb.CUDAGRAPH_UNFITTED_ERROR_BYTES


GRIDS = json.loads((DATA.parent / "vllm_extensible_oracle.json").read_text())


@pytest.mark.parametrize("case", GRIDS["prefill_grid"], ids=lambda c: f"{c['max_tokens']}-{c['dense_head']}")
def test_prefill_grid_is_vllm_034s(case: dict) -> None:
    """0.34.0's prefill_cudagraph_capture_grid, run from its source (tests/oracles/vllm_extensible_oracle.py)."""
    assert vb.prefill_capture_grid(case["max_tokens"], dense_head=case["dense_head"]) == case["sizes"]


@pytest.mark.parametrize("case", GRIDS["decode_grid"], ids=lambda c: str(c["max_requests"]))
def test_decode_grid_is_vllm_034s(case: dict) -> None:
    assert vb.decode_capture_grid(case["max_requests"]) == case["sizes"]


@pytest.mark.parametrize(("version", "tokens", "decode", "largest"), [
    ("0.10.1", 83, 83, 1024),  # an explicit list to 1024 (0.10.1 models/config.py:258-275)
    ("0.11.0", 81, 81, 992),  # to 992 (0.11.0 :256-273)
    ("0.19.0", 83, 83, 1024),  # max_cudagraph_capture_size 1024 (0.19.0 :120-133)
    ("0.33.0", 83, 83, 1024),  # (0.33.0 :549-562)
    ("0.34.0", 83, 64, 1024),  # the 1024-token list and the decode grid to 1024 requests (0.34.0 :843-880)
])
def test_gpt_oss_captures_to_1024_on_an_h100(version: str, tokens: int, decode: int, largest: int) -> None:
    sizes, decode_sizes = vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, version=version,
                                         compute_capability=SM90, gpt_oss=True)
    assert (len(sizes), len(decode_sizes), sizes[-1]) == (tokens, decode, largest)
    # a pinned ceiling turns the hook off (it only acts when no size is set)
    pinned, _ = vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, version=version,
                               compute_capability=SM90, gpt_oss=True, max_capture_size=512)
    assert pinned[-1] == 512


def test_034_wide_grids_on_b200_and_the_same_graphs_elsewhere() -> None:
    """0.34 on compute capability 10.x with nothing pinned: 54 prefill graphs to 8192 tokens and 64 decode
    graphs to 1024 requests (0.33: 83 + 83 to 1024); off 10.x the graphs of 0.33 (51 + 51 on an H100)."""
    b200 = vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=16384, version="0.34.0",
                          compute_capability=(10, 0))
    assert (len(b200[0]), b200[0][-1], len(b200[1]), b200[1][-1]) == (54, 8192, 64, 1024)
    before = vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=16384, version="0.33.0",
                            compute_capability=(10, 0))
    assert (len(before[0]), len(before[1]), before[0][-1]) == (83, 83, 1024)
    h100 = vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, version="0.34.0", compute_capability=SM90)
    assert h100 == vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, version="0.33.0",
                                  compute_capability=SM90)
    assert (len(h100[0]), len(h100[1])) == (51, 51)
    # gpt-oss on 10.x keeps the wide defaults (its hook skips that family)
    assert vb.graph_sizes(max_num_seqs=1024, max_num_batched_tokens=16384, version="0.34.0",
                          compute_capability=(10, 0), gpt_oss=True) == b200
