"""The console entry: Ctrl-C while the CLI is still importing ends quietly with 130."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_interrupt_during_import_is_a_quiet_130(tmp_path: Path) -> None:
    # A `click` that is interrupted while it loads stands in for Ctrl-C during the imports.
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    result = subprocess.run([sys.executable, "-m", "launcher", "plan", "qwen2.5-7b"], capture_output=True,
                            text=True, env=env, timeout=60, check=False)
    assert result.returncode == 130
    assert result.stderr == "safe-serve: interrupted\n"
