"""The golden file is SGLang's own output: re-run SGLang's code on the smoke subset and compare.

Runs where SAFE_SERVE_SGLANG_PYTHON names the oracle venv's Python (.ci/run builds it with
`tests/oracles/sglang_oracle.py --setup`); skipped elsewhere with that reason.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ORACLE_PYTHON = os.environ.get("SAFE_SERVE_SGLANG_PYTHON")
HERE = Path(__file__).parent


@pytest.mark.skipif(not ORACLE_PYTHON, reason="SAFE_SERVE_SGLANG_PYTHON is not set (see .ci/run)")
def test_sglang_reproduces_the_golden_file() -> None:
    """SGLang 0.5.23's resolution, run now, gives exactly the committed golden values."""
    run = subprocess.run(
        [ORACLE_PYTHON, str(HERE / "oracles" / "sglang_oracle.py"), "--grid", "--subset", "smoke",
         "--output", "/dev/null", "--compare", str(HERE / "data" / "sglang_oracle.json")],
        capture_output=True, text=True, timeout=600, cwd=HERE.parent,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.skipif(not ORACLE_PYTHON, reason="SAFE_SERVE_SGLANG_PYTHON is not set (see .ci/run)")
def test_sglang_reproduces_the_layouts_golden_file() -> None:
    """SGLang's ModelConfig and pool code, run now over every config, give the committed layouts (~30 s)."""
    run = subprocess.run(
        [ORACLE_PYTHON, str(HERE / "oracles" / "sglang_layouts.py"), "--compare",
         str(HERE / "data" / "sglang_layouts.json")],
        capture_output=True, text=True, timeout=600, cwd=HERE.parent,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
