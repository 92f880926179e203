"""The checkpoint's MTP (next-n) tensors: named as the engines' loaders skip them, sized from the shards'
headers, and left out of the weights each engine's main model loads (both planners)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.common.units import GiB
from launcher.model import resolve
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.draft import DraftModules, draft_kind, draft_names, mtp_layer_range, summarize
from launcher.model.resolve import ResolvedModel, resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest
from tests.model.test_config import _write_safetensors
from tests.model.test_resolve import _cache_repo

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "configs"
DSV3_BYTES = 688_586_727_753  # DeepSeek-V3's model.safetensors.index.json total_size
INDEX = "model.safetensors.index.json"
LAYER_61 = range(61, 62)


def config(name: str) -> dict[str, Any]:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


class TestNames:
    """vLLM 0.34.0 utils.py:642-668 (`model.layers.{L+i}.`, `layers.{L+i}.`, `model.language_model.layers.{L+i}.`)
    and the `mtp` prefixes its models drop (qwen3_next.py:848, mimo.py:93, ernie45_moe.py:410, ...)."""

    @pytest.mark.parametrize(("name", "kind"), [
        ("model.layers.61.mlp.experts.0.gate_proj.weight", "layer 61"),
        ("model.layers.61.shared_head.head.weight", "layer 61"),
        ("layers.61.eh_proj.weight", "layer 61"),
        ("model.language_model.layers.61.enorm.weight", "layer 61"),
        ("model.layers.60.mlp.experts.0.gate_proj.weight", None),  # the last decoder layer
        ("model.layers.62.input_layernorm.weight", None),  # past the one MTP layer the config counts
        ("model.layers.061.input_layernorm.weight", None),  # the engines match "layers.61." as written
        ("model.layers.\u0666\u0661.input_layernorm.weight", None),  # Arabic-Indic digits are not an index
        ("model.layers.61", None),  # no tensor under it
        ("mtp.layers.0.mlp.experts.3.down_proj.weight", "mtp"),  # Qwen3-Next, Qwen3.5, Nemotron-H, LongCat
        ("mtp.fc.weight", "mtp"),
        ("model.mtp_layers.0.input_layernorm.weight", "mtp"),  # MiMo
        ("model.mtp_block.0.mlp.gate.weight", "mtp"),  # ERNIE 4.5
        ("model.mtp_emb_norm.0.weight", "mtp"),
        ("model.language_model.mtp.fc.weight", "mtp"),
        ("mtp", None),
        ("model.embed_tokens.weight", None), ("lm_head.weight", None),
        ("model.layers.5.self_attn.mtpish.weight", None),  # "mtp" deeper in a decoder layer is not a module
    ])
    def test_which_tensors_are_mtp(self, name: str, kind: str | None) -> None:
        assert draft_kind(name, LAYER_61) == kind

    def test_without_a_count_no_layer_is_mtp(self) -> None:
        assert draft_kind("model.layers.61.mlp.gate.weight", range(0)) is None
        assert draft_kind("mtp.fc.weight", range(0)) == "mtp"

    @pytest.mark.parametrize(("text", "layers", "expected"), [
        ({"num_nextn_predict_layers": 1}, 61, range(61, 62)),  # DeepSeek-V3/R1, GLM-4.5 (92)
        ({"num_mtp_modules": 3}, 62, range(62, 65)),  # MiniMax-M2 (minimax_m2.py:376-379)
        ({"num_nextn_predict_layers": 0}, 61, range(0)),  # Kimi K2
        ({}, 61, range(0)), ({"num_nextn_predict_layers": True}, 61, range(0)),
        ({"num_nextn_predict_layers": "1"}, 61, range(0)), ({"num_nextn_predict_layers": -1}, 61, range(0)),
        ({"num_nextn_predict_layers": 10**9}, 61, range(0)),
    ])
    def test_the_mtp_layers_the_config_counts(self, text: dict[str, Any], layers: int, expected: range) -> None:
        assert mtp_layer_range(text, layers) == expected

    def test_a_long_hostile_name_is_read_in_one_pass(self) -> None:
        assert draft_kind("model.layers." + "6" * 1_000_000 + ".x", LAYER_61) is None
        assert draft_names({"a" * 100_000: "x", 7: "y"}, LAYER_61) == {}  # type: ignore[dict-item]

    def test_summary(self) -> None:
        kinds = {"model.layers.61.a": "layer 61", "model.layers.62.b": "layer 62", "mtp.fc.weight": "mtp"}
        assert summarize(kinds, {"model.layers.61.a": 10, "model.layers.62.b": 20, "mtp.fc.weight": 5,
                                 "other": 99}) == DraftModules(3, 35, "layers 61-62, mtp*")
        assert summarize(kinds, {"model.layers.61.a": 10}) == DraftModules(3, None, "layers 61-62, mtp*")
        assert summarize({}, {}) is None


# --------------------------------------------------------------------------- a local DeepSeek-V3 directory

MTP_TENSORS = {"model.layers.61.mlp.experts.0.gate_proj.weight": ("F8_E4M3", [64, 128]),
               "model.layers.61.mlp.experts.0.gate_proj.weight_scale_inv": ("F32", [1, 1]),
               "model.layers.61.embed_tokens.weight": ("BF16", [32, 64]),
               "model.layers.61.shared_head.head.weight": ("BF16", [32, 64]),
               "model.layers.61.eh_proj.weight": ("BF16", [64, 128])}
MTP_BYTES = 64 * 128 + 4 + 2 * 32 * 64 * 2 + 64 * 128 * 2


def dsv3_dir(root: Path, *, shard: bool = True, weight_map: dict[str, Any] | None = None) -> Path:
    """DeepSeek-V3's config, its index total and a weight_map whose layer 61 sits in a shard written here."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config("deepseek-v3")))
    main_shard, mtp_shard = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    if shard:
        _write_safetensors(root / mtp_shard, {**MTP_TENSORS, "model.layers.60.mlp.gate.weight": ("BF16", [256, 64])})
    wm: dict[str, Any] = {"model.embed_tokens.weight": main_shard, "model.layers.60.mlp.gate.weight": mtp_shard,
                          **{name: mtp_shard for name in MTP_TENSORS}}
    wm.update(weight_map or {})
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": DSV3_BYTES}, "weight_map": wm}))
    return root


class TestLocalCheckpoints:
    def test_the_mtp_layer_sized_from_its_shards_header(self, tmp_path: Path) -> None:
        model = resolve_model(str(dsv3_dir(tmp_path / "m")))
        assert model.weight_bytes == DSV3_BYTES  # what the checkpoint holds stays what it holds
        assert model.draft == DraftModules(5, MTP_BYTES, "layer 61")

    def test_a_shard_not_here_leaves_the_bytes_unknown(self, tmp_path: Path) -> None:
        model = resolve_model(str(dsv3_dir(tmp_path / "m", shard=False)))
        assert model.draft == DraftModules(5, None, "layer 61")

    def test_a_corrupt_shard_leaves_them_unknown_and_the_plan_stands(self, tmp_path: Path) -> None:
        root = dsv3_dir(tmp_path / "m", shard=False)
        (root / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 64)
        model = resolve_model(str(root))
        assert model.draft == DraftModules(5, None, "layer 61") and model.weight_bytes == DSV3_BYTES

    @pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors",
                                       ".hidden.safetensors", "x.bin", "", ["a"], 7, None])
    def test_a_shard_name_outside_the_directory_is_never_opened(self, tmp_path: Path, shard: Any) -> None:
        (tmp_path / "outside.safetensors").write_bytes(b"")  # would be read if the name were followed
        root = dsv3_dir(tmp_path / "m", weight_map={"model.layers.61.enorm.weight": shard})
        assert resolve_model(str(root)).draft == DraftModules(6, None, "layer 61")

    def test_no_index_the_headers_name_them(self, tmp_path: Path) -> None:
        root = tmp_path / "m"
        root.mkdir()
        (root / "config.json").write_text(json.dumps(config("glm-4.5")))  # 92 layers, one next-n layer
        _write_safetensors(root / "a.safetensors", {"model.layers.91.mlp.gate.weight": ("BF16", [160, 64])})
        _write_safetensors(root / "b.safetensors", {"model.layers.92.eh_proj.weight": ("BF16", [64, 128]),
                                                    "model.layers.92.enorm.weight": ("BF16", [64])})
        model = resolve_model(str(root))
        assert model.draft == DraftModules(2, 64 * 128 * 2 + 64 * 2, "layer 92")
        assert model.weight_bytes == 160 * 64 * 2 + 64 * 128 * 2 + 64 * 2

    def test_a_model_without_mtp_has_none(self, tmp_path: Path) -> None:
        root = tmp_path / "m"
        root.mkdir()
        (root / "config.json").write_text(json.dumps(config("qwen3-8b")))
        _write_safetensors(root / "model.safetensors", {"model.layers.36.x": ("BF16", [4])})  # no count: not MTP
        assert resolve_model(str(root)).draft is None


# --------------------------------------------------------------------------- the Hugging Face cache and the Hub


def _hub_run(tmp_path: Path, files: dict[str, bytes]) -> dict[str, Any]:
    hf = tmp_path / "hf"
    _cache_repo(hf, "deepseek-ai/DeepSeek-V3", files)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1",
           "SAFE_SERVE_STATE_DIR": str(tmp_path / "state")}
    run = subprocess.run([sys.executable, "-m", "launcher", "plan", "deepseek-ai/DeepSeek-V3", "--json",
                          *(["--gpu", "h200"] * 8), "--", "-tp", "8"], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def _weights_row(plan: dict[str, Any]) -> dict[str, Any]:
    return next(row for row in plan["budget"] if row["key"] == "weights")


class TestHub:
    def test_cached_shard_sizes_the_mtp_layer_offline(self, tmp_path: Path) -> None:
        local = dsv3_dir(tmp_path / "src")
        names = ("config.json", INDEX, "model-00002-of-00002.safetensors")
        files = {name: (local / name).read_bytes() for name in names}
        row = _weights_row(_hub_run(tmp_path, files))
        assert "less 0.00 GiB, the MTP tensors (layer 61: 5), which vLLM's model does not load" in row["detail"]

    def test_offline_without_the_shard_counts_them(self, tmp_path: Path) -> None:
        local = dsv3_dir(tmp_path / "src")
        plan = _hub_run(tmp_path, {name: (local / name).read_bytes() for name in ("config.json", INDEX)})
        assert ("the MTP tensors (layer 61: 5) counted: the shards holding them are not here to size them"
                in _weights_row(plan)["detail"])

    def test_a_shards_header_from_the_hub(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Two range reads of the header (huggingface_hub's parse_safetensors_file_metadata), never the weights."""
        from huggingface_hub import HfApi

        asked: list[tuple[str, str]] = []

        def header(self: Any, repo_id: str, filename: str, **_: Any) -> Any:
            asked.append((repo_id, filename))
            return SimpleNamespace(tensors={"model.layers.61.eh_proj.weight": SimpleNamespace(data_offsets=(0, 300)),
                                            "model.layers.61.enorm.weight": SimpleNamespace(data_offsets=(300, 314))})

        monkeypatch.setattr(HfApi, "parse_safetensors_file_metadata", header)
        assert resolve._hub_header_sizes("org/m", "s.safetensors", None) == {
            "model.layers.61.eh_proj.weight": 300, "model.layers.61.enorm.weight": 14}
        assert asked == [("org/m", "s.safetensors")]

        def refused(self: Any, repo_id: str, filename: str, **_: Any) -> Any:
            return SimpleNamespace(tensors={"x": SimpleNamespace(data_offsets=(10, 2))})

        monkeypatch.setattr(HfApi, "parse_safetensors_file_metadata", refused)
        assert resolve._hub_header_sizes("org/m", "s.safetensors", None) is None

        def hostile(kind: str) -> Any:
            def parse(self: Any, repo_id: str, filename: str, **_: Any) -> Any:
                if kind == "recursion":
                    raise RecursionError("maximum recursion depth exceeded")
                offsets = {"three": (0, 1, 2), "scalar": 5, "text": "0-9"}[kind]
                return SimpleNamespace(tensors={"x": SimpleNamespace(data_offsets=offsets)})
            return parse

        for kind in ("three", "scalar", "text", "recursion"):  # what huggingface_hub 2.4 lets through
            monkeypatch.setattr(HfApi, "parse_safetensors_file_metadata", hostile(kind))
            assert resolve._hub_header_sizes("org/m", "s.safetensors", None) is None, kind


# --------------------------------------------------------------------------- the planners

MTP_V3 = 15_424_227_552  # DeepSeek-V3's layer 61 at its shapes: fp8 experts with block scales, bf16 embed/head


def plan_dsv3(engine: str, argv: list[str], draft: DraftModules | None) -> Plan:
    model = ResolvedModel(name="deepseek-v3", source="local", geometry=geometry_from_config(config("deepseek-v3")),
                          weight_bytes=DSV3_BYTES, weight_bytes_source="model.safetensors.index.json total_size",
                          config={}, draft=draft)
    return make_plan(PlanRequest(model=model, engine=engine, gpus=hypothetical_gpus(["8x h200"]),
                                 engine_args=tuple(argv)))


def weights(plan: Plan) -> int:
    return next(item.bytes for item in plan.budget if item.key == "weights")


def detail(plan: Plan) -> str:
    return next(item.detail for item in plan.budget if item.key == "weights")


class TestPlanners:
    """Both engines' main model skips the MTP layer (vLLM utils.py:642-668, SGLang deepseek_weight_loader.py:344):
    its bytes leave every rank's weights, and the KV cache gets them."""

    @pytest.mark.parametrize(("engine", "argv"), [("vllm", ["-tp", "8"]), ("sglang", ["--tp", "8"])])
    def test_the_mtp_layer_leaves_each_ranks_weights(self, engine: str, argv: list[str]) -> None:
        whole = plan_dsv3(engine, argv, None)
        without = plan_dsv3(engine, argv, DraftModules(1564, MTP_V3, "layer 61"))
        assert weights(whole) - weights(without) in (MTP_V3 // 8, MTP_V3 // 8 + 1)
        assert without.kv_cache_bytes - whole.kv_cache_bytes > 1.7 * GiB  # 1.80 GiB a rank, in whole blocks
        assert "less 14.36 GiB, the MTP tensors (layer 61: 1,564)" in detail(without)

    def test_under_expert_parallel_the_rank_no_longer_holds_the_mtp_experts_whole(self) -> None:
        """`-dp 8 -ep`: the routed experts of the 58 MoE layers split over 8 ranks; the MTP layer's 256 experts
        were in 'the rest', whole on every rank (14.36 GiB), and are not loaded at all."""
        argv = ["-dp", "8", "--enable-expert-parallel"]
        whole = plan_dsv3("vllm", argv, None)
        without = plan_dsv3("vllm", argv, DraftModules(1564, MTP_V3, "layer 61"))
        assert weights(whole) - weights(without) == MTP_V3

    @pytest.mark.parametrize(("engine", "argv"), [
        ("vllm", ["-tp", "8", "--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}']),
        ("sglang", ["--tp", "8", "--speculative-algorithm", "NEXTN"])])
    def test_speculative_decoding_keeps_them_counted(self, engine: str, argv: list[str]) -> None:
        with_draft = plan_dsv3(engine, argv, DraftModules(1564, MTP_V3, "layer 61"))
        assert weights(with_draft) == weights(plan_dsv3(engine, argv, None))
        assert "the MTP tensors (layer 61: 1,564) counted: the speculative draft asked for may load them" \
            in detail(with_draft)

    @pytest.mark.parametrize("argv", [["-sc", '{"method": "mtp"}'], ["--spec-method", "mtp"],
                                      ["--spec-model", "x/y"], ["--spec-tokens", "2"],
                                      ["--speculative-config.method", "mtp"],
                                      ["--speculative-config.num_speculative_tokens=1"]])
    def test_every_spelling_of_vllms_draft(self, argv: list[str]) -> None:
        """-sc (0.19+), the 0.22+ shorthands and the dotted form all ask for the draft (engine/arg_utils.py:
        1896-1904, utils/argparse_utils.py:462-481 in 0.34.0): the MTP layer stays counted."""
        with_draft = plan_dsv3("vllm", ["-tp", "8", *argv], DraftModules(1564, MTP_V3, "layer 61"))
        assert weights(with_draft) == weights(plan_dsv3("vllm", ["-tp", "8", *argv], None))

    def test_unknown_bytes_stay_counted_and_say_so(self) -> None:
        plan = plan_dsv3("vllm", ["-tp", "8"], DraftModules(1564, None, "layer 61"))
        assert weights(plan) == weights(plan_dsv3("vllm", ["-tp", "8"], None))
        assert "the safe side" in detail(plan)

    def test_bytes_beyond_the_checkpoint_are_not_subtracted(self) -> None:
        plan = plan_dsv3("vllm", ["-tp", "8"], DraftModules(3, DSV3_BYTES, "layer 61"))
        assert weights(plan) == weights(plan_dsv3("vllm", ["-tp", "8"], None))
