"""Launch and watch: start the engine with the plan's flags, check its numbers, retune or abort.

``watch`` holds the `Watch` (one serve's state: retunes, readiness, failures while serving),
``progress`` the live status line on a terminal; the start lock is ``launcher.common.devlock`` and the
calibration store ``launcher.plan.calibration``.
"""

from __future__ import annotations

from launcher.serve.watch import ABORT, RETUNE, WARN, ServeOptions, Watch, child_env, diverges, run_serve

__all__ = ["ABORT", "RETUNE", "WARN", "ServeOptions", "Watch", "child_env", "diverges", "run_serve"]
