""".bin-only checkpoints (pytorch_model*.bin, no safetensors): sized from the index's total_size,
else from the files' sizes on disk, never by reading a pickle; unsizable ones are 65, or with
--trust-engine a launch the engine sizes. Real files in tmp_path, real byte figures."""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from launcher.common.errors import ExitCode, ModelConfigError, UnsizedWeights
from launcher.edge.cli import cli
from launcher.model.resolve import resolve_model
from tests.model.test_config import QWEN25_7B, _write_safetensors
from tests.model.test_resolve import _PLAN, _cache_repo, _run
from tests.model.test_resolve import hub_env as hub_env  # a fixture, used by name

BIN_INDEX = "pytorch_model.bin.index.json"
CAVEAT = "pickles, not opened: their size bounds the tensor bytes from above"
ROPE = 32768 * 128 * 2  # the rotary table vLLM builds beside Qwen2.5-7B's weights (bfloat16), in the weights row


class _Trap:
    """Unpickling this makes a directory: proof that nothing ever loaded the .bin."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _pickle_file(path: Path, marker: Path, padding: int) -> int:
    """A .bin that runs code if loaded, padded to stand for tensor data; returns its size."""
    data = pickle.dumps(_Trap(marker)) + b"\0" * padding
    path.write_bytes(data)
    return len(data)


def _bin_model(root: Path, index: object = None, shards: dict[str, int] | None = None) -> tuple[Path, dict[str, int]]:
    """config.json, the .bin shards given (name -> padding) and an optional index; sizes by name."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(QWEN25_7B))
    sizes = {name: _pickle_file(root / name, root.parent / "unpickled", pad)
             for name, pad in (shards or {"pytorch_model.bin": 10_000}).items()}
    if index is not None:
        (root / BIN_INDEX).write_text(index if isinstance(index, str) else json.dumps(index))
    return root, sizes


def _never_unpickled(root: Path) -> None:
    assert not (root.parent / "unpickled").exists()


class TestResolve:
    def test_index_total_size_is_the_weight_bytes(self, tmp_path: Path) -> None:
        """Sharded .bin with its index: metadata.total_size, not the shards' sizes."""
        shards = {"pytorch_model-00001-of-00002.bin": 5000, "pytorch_model-00002-of-00002.bin": 3000}
        index = {"metadata": {"total_size": 15_231_233_024},
                 "weight_map": {"lm_head.weight": "pytorch_model-00002-of-00002.bin"}}
        model, _ = _bin_model(tmp_path / "m", index, shards)
        resolved = resolve_model(str(model))
        assert resolved.weight_bytes == 15_231_233_024
        assert resolved.weight_bytes_source == f"{BIN_INDEX} total_size" and resolved.weights_sized
        _never_unpickled(model)

    @pytest.mark.parametrize("index", [{"weight_map": {}}, {"metadata": {}, "weight_map": {}}])
    def test_index_without_total_size_falls_back_to_file_sizes(self, tmp_path: Path, index: object) -> None:
        shards = {"pytorch_model-00001-of-00002.bin": 7000, "pytorch_model-00002-of-00002.bin": 1000}
        model, sizes = _bin_model(tmp_path / "m", index, shards)
        resolved = resolve_model(str(model))
        on_disk = sum(os.path.getsize(model / name) for name in shards)
        one_pickle = len(pickle.dumps(_Trap(tmp_path / "unpickled")))
        assert resolved.weight_bytes == sum(sizes.values()) == on_disk == 8000 + 2 * one_pickle
        assert resolved.weight_bytes_source == f"sizes of 2 .bin file(s) on disk ({CAVEAT})"
        _never_unpickled(model)

    def test_bad_total_size_in_the_index_is_65(self, tmp_path: Path) -> None:
        """A total_size that is there but not a byte count would be planned: refused, naming the file."""
        model, _ = _bin_model(tmp_path / "m", '{"metadata": {"total_size": -5}}')
        with pytest.raises(ModelConfigError) as caught:
            resolve_model(str(model))
        assert str(caught.value) == (f"{model}/{BIN_INDEX}: metadata.total_size must be a byte count "
                                     "from 1 to 2**50, not -5")

    def test_single_bin_without_index_is_its_size_on_disk(self, tmp_path: Path) -> None:
        """The trainer's training_args.bin and optimizer.bin are not weights (as the engines filter them)."""
        model, sizes = _bin_model(tmp_path / "m", shards={"pytorch_model.bin": 123_456, "training_args.bin": 4000,
                                                          "optimizer.bin": 9000})
        resolved = resolve_model(str(model))
        assert resolved.weight_bytes == sizes["pytorch_model.bin"] == os.path.getsize(model / "pytorch_model.bin")
        assert resolved.weight_bytes_source == f"sizes of 1 .bin file(s) on disk ({CAVEAT})"
        _never_unpickled(model)

    def test_safetensors_win_over_bin(self, tmp_path: Path) -> None:
        """Both engines glob *.safetensors before *.bin: so do we."""
        model, _ = _bin_model(tmp_path / "m")
        expected = _write_safetensors(model / "model.safetensors", {"a": ("BF16", [256, 128])})
        resolved = resolve_model(str(model))
        assert resolved.weight_bytes == expected == 256 * 128 * 2
        assert resolved.weight_bytes_source == "headers of 1 safetensors file(s)"

    def test_fifo_named_like_a_bin_is_refused_without_blocking(self, tmp_path: Path) -> None:
        model = tmp_path / "m"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN25_7B))
        os.mkfifo(model / "pytorch_model.bin")
        caught: list[BaseException] = []
        worker = threading.Thread(target=lambda: caught.append(pytest.raises(ModelConfigError, resolve_model,
                                                                              str(model)).value), daemon=True)
        worker.start()
        worker.join(10)
        assert not worker.is_alive() and str(caught[0]) == f"{model}/pytorch_model.bin: is a FIFO, not a regular file"

    def test_no_weights_to_size_is_65_or_unsized_with_trust(self, tmp_path: Path) -> None:
        model = tmp_path / "m"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN25_7B))
        (model / "model.gguf").write_bytes(b"GGUF" + b"\0" * 100)
        with pytest.raises(UnsizedWeights) as caught:
            resolve_model(str(model))
        assert caught.value.exit_code == ExitCode.DATA
        why = f"{model}: no *.safetensors, *.bin or model.safetensors.index.json to read the weight size from"
        assert caught.value.message == why and "--trust-engine" in (caught.value.hint or "")
        unsized = resolve_model(str(model), unsized_ok=True)
        assert (unsized.weights_sized, unsized.weight_bytes) == (False, 0)
        assert unsized.weight_bytes_source == f"unknown: {why}"


class TestCommandLine:
    def test_plan_without_index_plans_on_the_file_sizes(self, tmp_path: Path) -> None:
        """Documented choice (README, docs/operators.md): an index-less .bin plans (0), labelled."""
        model, sizes = _bin_model(tmp_path / "m", shards={"pytorch_model.bin": 2_000_000})
        result = CliRunner().invoke(cli, ["plan", str(model), "--gpu", "rtx4090", "--json"])
        assert result.exit_code == 0, result.output
        weights = next(i for i in json.loads(result.output)["budget"] if i["key"] == "weights")
        assert weights["bytes"] == sizes["pytorch_model.bin"] + ROPE and weights["source"] == "measured"
        assert weights["detail"].startswith(f"sizes of 1 .bin file(s) on disk ({CAVEAT}), + 0.01 GiB as loaded")
        _never_unpickled(model)

    def test_plan_with_index_plans_on_its_total_size(self, tmp_path: Path) -> None:
        model, _ = _bin_model(tmp_path / "m", {"metadata": {"total_size": 15_231_233_024}})
        result = CliRunner().invoke(cli, ["plan", str(model), "--gpu", "rtx4090", "--json"])
        weights = next(i for i in json.loads(result.output)["budget"] if i["key"] == "weights")
        assert (result.exit_code, weights["bytes"]) == (0, 15_231_233_024 + ROPE)
        assert weights["detail"].startswith(f"{BIN_INDEX} total_size, + 0.01 GiB as loaded (rotary tables")

    def test_unsizable_weights_exit_codes(self, tmp_path: Path) -> None:
        """65 without --trust-engine (plan and serve); plan --trust-engine refuses (78, as for an unknown
        geometry); serve --trust-engine starts the engine with no flags added: it sizes the weights."""
        model = tmp_path / "m"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN25_7B))
        (model / "consolidated.00.pth").write_bytes(b"\0" * 64)
        env = {**os.environ, "SAFE_SERVE_STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1"}

        def safe_serve(*args: str) -> tuple[int, str, str]:
            run, _ = _run([sys.executable, "-m", "launcher", *args, str(model), "--gpu", "rtx4090"], env)
            return run.returncode, run.stdout, run.stderr

        why = f"{model}: no *.safetensors, *.bin or model.safetensors.index.json to read the weight size from"
        code, _, err = safe_serve("plan")
        assert (code, err) == (65, f"safe-serve: {why} (--trust-engine starts it anyway and the engine sizes "
                                   "the weights itself)\n")
        assert safe_serve("serve", "--dry-run")[0] == 65
        code, out, _ = safe_serve("plan", "--trust-engine", "--json")
        assert code == 78 and json.loads(out)["reason"] == f"the weight size is unknown: {why}"
        code, out, err = safe_serve("serve", "--trust-engine", "--dry-run", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["engine_args"] == [] and doc["kv_cache_tokens"] == 0 and "the engine decides" in doc["notes"][-1]


class TestHubCache:
    def test_cached_bin_index_plans_offline(self, tmp_path: Path, hub_env: Callable[..., dict[str, str]]) -> None:
        _cache_repo(tmp_path / "hf", "someorg/binidx", {
            "config.json": json.dumps(QWEN25_7B).encode(),
            BIN_INDEX: json.dumps({"metadata": {"total_size": 15_231_233_024}}).encode()})
        run, _ = _run([*_PLAN, "someorg/binidx", "--json"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 0, run.stderr
        weights = next(i for i in json.loads(run.stdout)["budget"] if i["key"] == "weights")
        assert weights["bytes"] == 15_231_233_024 + ROPE
        assert weights["detail"].startswith(f"someorg/binidx {BIN_INDEX} total_size, + 0.01 GiB as loaded")

    def test_cached_single_bin_plans_offline_on_its_size(self, tmp_path: Path,
                                                         hub_env: Callable[..., dict[str, str]]) -> None:
        data = pickle.dumps(_Trap(tmp_path / "unpickled")) + b"\0" * 50_000
        _cache_repo(tmp_path / "hf", "someorg/onebin", {"config.json": json.dumps(QWEN25_7B).encode(),
                                                        "pytorch_model.bin": data})
        run, _ = _run([*_PLAN, "someorg/onebin", "--json"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 0, run.stderr
        weights = next(i for i in json.loads(run.stdout)["budget"] if i["key"] == "weights")
        assert weights["bytes"] == len(data) + ROPE
        assert weights["detail"].startswith(f"someorg/onebin pytorch_model.bin size on disk (cached; {CAVEAT}), + 0.01")
        assert not (tmp_path / "unpickled").exists()


class TestHubOnline:
    """The Hub's answers stood in for in-process: the .bin index it serves, else pytorch_model.bin's
    size from a HEAD request (huggingface_hub's HfFileMetadata.size), else unsized."""

    @pytest.fixture
    def hub(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        import huggingface_hub
        from huggingface_hub.errors import EntryNotFoundError

        from launcher.model import resolve

        answers: dict[str, Any] = {"index": None, "size": None, "heads": []}

        def small_file(repo_id: str, filename: str, token: str | None, *, offline: bool) -> Path | None:
            assert filename == BIN_INDEX and not offline
            if answers["index"] is None:
                return None
            path = tmp_path / filename
            path.write_text(json.dumps(answers["index"]))
            return path

        def head(url: str, **_: Any) -> Any:
            answers["heads"].append(url)
            if answers["size"] is None:
                raise EntryNotFoundError("404")
            return type("Meta", (), {"size": answers["size"]})()

        monkeypatch.setattr(resolve, "_hub_small_file", small_file)
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", head)
        return answers

    def test_served_index_total_size(self, hub: dict[str, Any]) -> None:
        from launcher.model.resolve import _hub_bin_weight_bytes

        hub["index"] = {"metadata": {"total_size": 15_231_233_024}}
        assert _hub_bin_weight_bytes("someorg/x", None) == (15_231_233_024, f"someorg/x {BIN_INDEX} total_size")
        assert hub["heads"] == []

    def test_single_bin_size_from_a_head_request(self, hub: dict[str, Any]) -> None:
        from launcher.model.resolve import _hub_bin_weight_bytes

        hub["size"] = 548_118_077
        assert _hub_bin_weight_bytes("someorg/x", None) == (
            548_118_077, f"someorg/x pytorch_model.bin size on the Hub ({CAVEAT})")
        assert hub["heads"] == [huggingface_hub_url("someorg/x", "pytorch_model.bin")]

    def test_neither_is_unsized(self, hub: dict[str, Any]) -> None:
        from launcher.model.resolve import _hub_bin_weight_bytes

        with pytest.raises(UnsizedWeights) as caught:
            _hub_bin_weight_bytes("someorg/x", None)
        assert caught.value.message == ("someorg/x: no safetensors weights, and neither a pytorch_model.bin.index.json "
                                        "total_size nor a pytorch_model.bin to size")


def huggingface_hub_url(repo_id: str, filename: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, filename)
