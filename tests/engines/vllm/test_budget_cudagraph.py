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
        assert graphs.estimate_bytes == 86 * 32 * vb.CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER
        assert abs(graphs.estimate_bytes / GiB - 0.65) < 0.01 and abs(graphs.error_bytes / GiB - 0.215) < 0.01

    def test_moe_per_graph_never_below_a_dense_model(self) -> None:
        graphs = _graphs("0.33.0", experts=8)
        assert graphs.estimate_bytes == 86 * vb.CUDAGRAPH_MOE_BYTES_PER_GRAPH
        assert graphs.estimate_bytes > _graphs("0.33.0").estimate_bytes

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
            assert graphs.count == 102, case["id"]
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
