"""Every outcome as data: the JSON Schemas in docs/schemas/ checked against real outputs of the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import psutil
import pytest

from tests.probe.test_probe import StubLibs, _fixture, dead_pid, sleeper, stub_libs  # noqa: F401

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


def schema(name: str) -> dict[str, object]:
    return dict(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, dict[str, object], str]:
    proc = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def no_gpu(stub_libs: StubLibs) -> Iterator[dict[str, str]]:  # noqa: F811
    yield {"LD_LIBRARY_PATH": str(stub_libs.missing)}


@pytest.mark.parametrize("name", sorted(p.name.split(".")[0] for p in SCHEMAS.glob("*.schema.json")))
def test_the_schemas_are_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schema(name))


@pytest.mark.parametrize("argv", [
    ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json"],
    ["plan", "qwen2.5-7b", "--gpu", "h100", "--engine", "sglang", "--json"],
    ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--concurrency", "28", "--json", "--", "--max-model-len", "4096"],
    ["qwen2.5-7b", "--gpu", "2xrtx4090", "--dry-run", "--json", "--", "--tensor-parallel-size", "2"],
])
def test_plans(argv: list[str]) -> None:
    code, doc, _ = run(argv)
    assert code == 0
    jsonschema.validate(doc, schema("plan"))
    assert isinstance(doc["fits"], bool) and doc["fits"] == (doc["risk"] == "none") == (doc["may_not_fit"] is None)


def test_may_not_fit_is_not_a_plain_yes() -> None:
    _, doc, _ = run(["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--concurrency", "28", "--json", "--",
                     "--max-model-len", "4096"])
    assert doc["fits"] is False and doc["risk"] == "may-not-fit" and doc["may_not_fit"]


def test_refusal() -> None:
    code, doc, _ = run(["plan", "llama-3.1-70b", "--gpu", "rtx4090", "--json"])
    assert code == 78
    jsonschema.validate(doc, schema("refusal"))


@pytest.mark.parametrize(("argv", "code"), [
    (["fit", "qwen2.5-7b", "--concurrency", "4", "--tokens", "8192", "--gpu", "rtx4090", "--json"], 0),
    (["fit", "qwen2.5-7b", "--concurrency", "1", "--tokens", "99999999", "--json"], 78),
])
def test_fit(argv: list[str], code: int) -> None:
    got, doc, _ = run(argv)
    assert got == code
    jsonschema.validate(doc, schema("fit"))
    if code:  # 27 GPU types refused for one reason: one reason, not 27
        assert len(doc["reasons"]) == 1 and len(doc["reasons"][0]["gpus"]) == len(doc["gpus"]) > 20


def test_gpus(stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int, tmp_path: Path) -> None:  # noqa: F811
    fixture = tmp_path / "fixture.txt"
    fixture.write_text(_fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid))
    code, doc, _ = run(["gpus", "--json"], env={"LD_LIBRARY_PATH": str(stub_libs.current),
                                                "SAFE_SERVE_NVML_STUB_FIXTURE": str(fixture)})
    assert code == 0 and len(doc["devices"]) == 2  # type: ignore[arg-type]
    jsonschema.validate(doc, schema("gpus"))


def test_every_failure_with_json_is_one_error_object(no_gpu: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("concurency: 3\n")
    cases = [
        (["plan", "banana", "--gpu", "h100", "--json"], 66, {}),
        (["gpus", "--json"], 69, no_gpu),
        (["plan", "qwen2.5-7b", "--json"], 69, no_gpu),
        (["plan", "qwen2.5-7b", "--gpu", "h100", "--concurency", "3", "--json"], 2, {}),
        (["plan", "qwen2.5-7b", "--gpu", "h100", "--margin", "1", "--json"], 2, {}),
        (["plan", "qwen2.5-7b", "--gpu", "h100", "--config", str(bad_config), "--json"], 2, {}),
        (["plan", "qwen2.5-7b", "--gpu", "h100", "--json", "--", "--context-length", "9"], 2, {}),
        (["plan", str(broken), "--gpu", "h100", "--json"], 65, {}),
        (["status", "nothing-here", "--json"], 66, {"SAFE_SERVE_STATE_DIR": str(tmp_path / "state")}),
    ]
    for argv, code, env in cases:
        got, doc, err = run(argv, env)
        assert got == code, (argv, got, err)
        jsonschema.validate(doc, schema("error"))
        assert doc["exit_code"] == code, (argv, doc)
        assert str(doc["reason"])[:40] in err, (argv, doc, err)  # the same reason as the stderr line
