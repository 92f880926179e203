"""The command line's edges: versions, JSON, and one clear line per bad input (GPU spellings: test_catalog)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.edge.cli import cli


class TestPlanCommand:
    def test_json_schema_fields(self) -> None:
        """--json carries the documented fields and the exact flags the launch adds."""
        result = CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        for key in ("engine", "engine_version", "max_model_len", "gpu_memory_utilization", "kv_cache_bytes",
                    "kv_cache_tokens", "max_concurrency", "budget", "engine_args"):
            assert key in doc
        assert doc["schema"] == "safe-serve.plan/1" and doc["mem_fraction_static"] is None
        # vLLM 0.34 (the newest, planned when none is installed): the utilization is only a cap, set at
        # the free memory less the context and the margin (23.64 - 0.53 - 0.25 GiB of 23.64).
        assert doc["gpu_memory_utilization"] == 0.9669
        assert doc["engine_args"] == ["--gpu-memory-utilization", "0.9669", "--max-model-len",
                                      str(doc["max_model_len"])]
        assert {item["key"] for item in doc["budget"]} >= {"weights", "activation", "cudagraph", "kv"}

    def test_ecc_unknown_card_says_its_total_spans(self) -> None:
        """`--gpu rtx6000ada`: the JSON and the table say the CUDA total spans ECC on and off, and how
        to plan one; `-ecc` plans the published ECC-on total."""
        doc = json.loads(CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "rtx6000ada", "--json"]).output)
        assert doc["gpu"]["cuda_total_spans"] == "ECC state unknown: from ECC on to ECC off"
        assert any("--gpu rtx6000ada-ecc or rtx6000ada-noecc" in note for note in doc["notes"])
        table = CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "rtx6000ada", "--engine", "sglang"]).output
        assert "the middle of ECC on (in-band ECC) to ECC off" in table
        doc = json.loads(CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "rtx6000ada-ecc", "--json"]).output)
        assert doc["gpu"]["cuda_total_spans"] is None and doc["gpu"]["cuda_total_bytes"] == 47706349240

    def test_unknown_engine_version_says_so(self) -> None:
        """A version newer than we know plans with the newest rules and a note."""
        result = CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "h100", "--engine", "sglang",
                                          "--engine-version", "0.7.1", "--json"])
        doc = json.loads(result.output)
        assert doc["rules_version"] == "0.5.23" and any("newer than 0.5.23" in n for n in doc["notes"])

    def test_older_vllm_uses_its_default_utilization(self) -> None:
        """vLLM 0.10 defaulted to 0.9 and did not subtract a CUDA-graph estimate."""
        doc = json.loads(CliRunner().invoke(cli, ["plan", "qwen2.5-7b", "--gpu", "h100", "--engine-version",
                                                  "0.10.2", "--json"]).output)
        graphs = next(i for i in doc["budget"] if i["key"] == "cudagraph")
        assert doc["gpu_memory_utilization"] == 0.9 and graphs["bytes"] == 0

    def test_dry_run_prints_the_command(self) -> None:
        """--dry-run prints the exact engine command line and exits 0."""
        result = CliRunner().invoke(cli, ["qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--dry-run",
                                          "--", "--port", "31000"])
        assert result.exit_code == 0, result.output
        last = result.output.strip().splitlines()[-1]
        assert "-m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --port 31000 --mem-fraction-static" \
            in last and "--context-length" in last


@pytest.mark.parametrize(("argv", "code", "text"), [
    (["plan", "no-such-model", "--gpu", "h100"], 66, "not a directory, a known alias"),
    (["plan", "qwen2.5-7b", "--gpu", "rtx9999"], 2, "not a GPU in the catalog"),
    (["plan", "qwen2.5-7b", "--gpu", "h100-ecc"], 2, "knows one memory setup for NVIDIA H100"),
    (["plan", "qwen2.5-7b", "--gpu", "h100", "--", "--max-model-len", "lots"], 2, "cannot read 'lots'"),
    (["plan", "llama-3.1-70b", "--gpu", "rtx4090"], 78, "will not fit"),
    (["plan", "qwen2.5-7b"], 69, "--gpu NAME"),
    (["plan", "qwen2.5-7b", "--gpu", "h100", "--concurency", "2"], 2, "No such option"),
])
def test_bad_input_is_one_line_and_a_documented_code(argv: list[str], code: int, text: str) -> None:
    """Bad input prints a clear message (no traceback) and exits with its documented code."""
    run = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LD_LIBRARY_PATH": "/nonexistent"})
    assert run.returncode == code, run.stderr
    assert text in run.stderr and "Traceback" not in run.stderr


def test_malformed_index_is_exit_65(tmp_path) -> None:
    """A broken safetensors index is a data error (65) naming the file, not a traceback."""
    from tests.model.test_config import QWEN25_7B

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    run = subprocess.run([sys.executable, "-m", "launcher", "plan", str(tmp_path), "--gpu", "h100"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 65 and "model.safetensors.index.json: not valid JSON" in run.stderr
    assert "Traceback" not in run.stderr


def test_trust_engine_launches_a_hybrid_model_unplanned() -> None:
    """--trust-engine on a model we cannot size adds no flags: the engine decides, and says so."""
    import tempfile

    # Ling 2.5 (BailingMoeV2_5ForCausalLM): a hybrid whose linear-attention state safe-serve does not size.
    config = {"architectures": ["BailingMoeV2_5ForCausalLM"], "model_type": "bailing_moe_linear", "hidden_size": 64,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
              "max_position_embeddings": 4096,
              "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
    with tempfile.TemporaryDirectory() as model:
        Path(model, "config.json").write_text(json.dumps(config))
        Path(model, "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10**6}}))
        refused = CliRunner().invoke(cli, ["plan", model, "--gpu", "rtx4090"])
        trusted = CliRunner().invoke(cli, [model, "--gpu", "rtx4090", "--trust-engine", "--dry-run", "--json"])
    from launcher.common.errors import ExitCode, UnsupportedModel

    assert isinstance(refused.exception, UnsupportedModel) and refused.exception.exit_code == ExitCode.CONFIG
    assert "3 of 4 layers" in str(refused.exception)
    doc = json.loads(trusted.output)
    assert doc["engine_args"] == [] and doc["kv_cache_tokens"] == 0 and "the engine decides" in doc["notes"][0]


@pytest.mark.parametrize(("typed", "meant"), [("gpu", "gpus"), ("stauts", "status"), ("plna", "plan"),
                                              ("model", "models")])
def test_a_mistyped_command_is_exit_2_naming_the_command(typed: str, meant: str) -> None:
    """`safe-serve gpu` was served as model 'gpu' (an NVML error without a GPU, 66 with one)."""
    run = subprocess.run([sys.executable, "-m", "launcher", typed, "--dry-run", "--gpu", "h100", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        f"safe-serve: no command '{typed}': did you mean `safe-serve {meant}`? "
        f"(to serve a model named '{typed}': safe-serve serve {typed})"]
    assert json.loads(run.stdout)["error"] == "UsageError"


def test_a_word_near_a_command_that_is_a_directory_or_named_by_serve_is_served(tmp_path: Path) -> None:
    """A local directory named like a command, and `safe-serve serve gpu`, still mean the model."""
    (tmp_path / "gpu").mkdir()
    for argv in (["gpu", "--dry-run", "--gpu", "h100"], ["serve", "gpu", "--dry-run", "--gpu", "h100"]):
        run = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        assert run.returncode in (65, 66) and "no command" not in run.stderr, run.stderr


@pytest.mark.parametrize("flags", [["--", "--bogus-flag"], ["--", "--context-length", "4096"],
                                   ["--", "--model", "other/model"], ["--engine-cmd", "vllm 'serve"]])
def test_serve_refuses_an_engine_flag_before_the_start_lock_and_the_probe(flags: list[str]) -> None:
    """Was checked only when planning, after the start lock (a wait of up to --lock-timeout behind another
    start) and the NVML probe: without a GPU, 69 'NVML could not be loaded' instead of the flag's 2."""
    run = subprocess.run([sys.executable, "-m", "launcher", "qwen2.5-7b", *flags], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent"})
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    named = "--engine-cmd" if flags[0] == "--engine-cmd" else flags[1]
    assert named in run.stderr and "NVML" not in run.stderr
