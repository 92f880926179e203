"""The derivations the docs cite live in the repository and equal what their script rebuilds."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from tests import bench_scripts

ROOT = Path(__file__).resolve().parent.parent


def _module() -> types.ModuleType:
    return bench_scripts.load("derivations")


@pytest.mark.parametrize("name", ["activation-peak.md", "vllm-versions.md"])
def test_committed_derivation_is_current(name: str) -> None:
    assert (ROOT / "docs" / "derivations" / name).read_text() == _module().DOCUMENTS[name]()


def test_docs_cite_nothing_outside_the_repository() -> None:
    for doc in (ROOT / "docs").rglob("*.md"):
        text = doc.read_text()
        assert "outside the repo" not in text, doc.name
        for path in re.findall(r"`((?:docs|tests|bench|launcher)/[\w./-]+\.(?:md|json|yaml|py))`", text):
            assert (ROOT / path).exists(), f"{doc.name} cites {path}"
        assert not re.search(r"\bresearch/[\w.-]+\.(?:md|json)", text), doc.name
