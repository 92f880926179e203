"""Docs consistent with the code: the version ranges the docs state are the engines' rule ranges,
and a figure's label is true to its source."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.engines import ENGINES, adapter
from launcher.engines.versions import version_key

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
LABEL = {"vllm": "vLLM", "sglang": "SGLang"}
# "vLLM 0.8.5 to 0.33" states what safe-serve supports; a range that ends before the newest
# ("vLLM 0.8.5 to 0.18: what differs") describes a span of releases, not the support.
RANGE = re.compile(r"\b(vLLM|SGLang) \(?(\d+\.\d+(?:\.\d+)?) to (\d+\.\d+(?:\.\d+)?)\b(?!:)")


def same_release(doc: str, code: str) -> bool:
    """`0.19` in prose is the 0.19.0 release of the rules."""
    return version_key(doc).release == version_key(code).release[: len(version_key(doc).release)]


def stated_ranges() -> list[tuple[str, str, str, str]]:
    return [(path.name, m[1], m[2], m[3]) for path in DOCS for m in RANGE.finditer(path.read_text())]


def test_every_stated_range_is_the_rules_range() -> None:
    found = stated_ranges()
    by_label = {LABEL[name]: adapter(name) for name in ENGINES}
    for where, label, low, high in found:
        engine = by_label[label]
        assert same_release(low, engine.oldest) and same_release(high, engine.newest), \
            (where, f"{label} {low} to {high}", f"rules: {engine.oldest} to {engine.newest}")


@pytest.mark.parametrize("doc", ["README.md", "operators.md"])
def test_readme_and_guide_state_both_ranges(doc: str) -> None:
    labels = {label for where, label, _, _ in stated_ranges() if where == doc}
    assert labels == {"vLLM", "SGLang"}


def test_the_range_is_what_the_rules_hold() -> None:
    from launcher.engines.sglang import RULES as SGLANG_RULES
    from launcher.engines.vllm import RULES as VLLM_RULES

    assert adapter("vllm").newest == VLLM_RULES[-1].version
    assert adapter("sglang").newest == SGLANG_RULES[-1].version
    assert adapter("sglang").oldest == SGLANG_RULES[0].version
    assert adapter("vllm").oldest in {r.version for r in VLLM_RULES}


def test_a_release_older_than_the_range_is_a_warning() -> None:
    proc = subprocess.run([sys.executable, "-m", "launcher", "plan", "qwen2.5-7b", "--gpu", "h100",
                           "--engine-version", "0.7.0", "--json"], capture_output=True, text=True, timeout=60)
    doc = json.loads(proc.stdout)
    assert any(f"older than {adapter('vllm').oldest}" in w for w in doc["warnings"]), doc["warnings"]


def test_profile_weights_are_catalog_not_measured(tmp_path: Path) -> None:
    """A shipped profile was written without Hub access: its weights are `catalog`; bytes read from
    a local checkpoint's own index are `measured`."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "plan", "qwen2.5-7b", "--gpu", "h100", "--json"],
                          capture_output=True, text=True, timeout=60)
    weights = next(i for i in json.loads(proc.stdout)["budget"] if i["key"] == "weights")
    assert weights["source"] == "catalog"
    from launcher.model.resolve import load_profile

    profile = load_profile("qwen2.5-7b") or {}
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(profile["config"]))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": profile["weight_bytes"]}, "weight_map": {}}))
    proc = subprocess.run([sys.executable, "-m", "launcher", "plan", str(model), "--gpu", "h100", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    weights = next(i for i in json.loads(proc.stdout)["budget"] if i["key"] == "weights")
    assert weights["source"] == "measured" and weights["bytes"] > 0
