"""Plan a grid of inputs and write every output, so a refactor can prove it changed no figure.

    python bench/plan_grid.py OUT.txt            # write the grid's outputs
    python bench/plan_grid.py OUT.txt --quick    # every third case (a minute on 2 cores)
    diff BASE.txt OUT.txt                        # a refactor's proof: no line differs

Two parts, in process (no subprocess per case):
- the CLI's `plan` over profiles x GPUs x engines x flag sets, table and --json, exit code and
  stderr, as a user sees them;
- the planner over the real configs in tests/data/configs/ (vLLM and SGLang, two flag sets), as
  tests/model/test_real_configs.py builds them, rendered as the plan's JSON or the refusal.
Prints the case count and a sha256 of the whole output.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILES = sorted(p.stem for p in (ROOT / "profiles" / "models").glob("*.yaml"))
GPUS = ("rtx4090", "l4", "a100-80gb", "h100", "2xh100", "4xa10g", "t4", "b200")
ENGINES = ("vllm", "sglang")
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("--concurrency", "32"),
    ("--max-gpu-memory", "50%"),
    ("--", "{length}", "4096"),
    ("--", "{length}", "32768", "{kvfp8}"),
    ("--", "{tp}", "2"),
)
ENGINE_WORDS = {
    "vllm": {"{length}": "--max-model-len", "{tp}": "--tensor-parallel-size", "{kvfp8}": "--kv-cache-dtype=fp8"},
    "sglang": {"{length}": "--context-length", "{tp}": "--tp-size", "{kvfp8}": "--kv-cache-dtype=fp8_e4m3"},
}


def _cli(argv: list[str]) -> str:
    from launcher.edge.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as done:
            code = done.code
    return f"exit {code}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"


def cli_cases() -> Iterator[tuple[str, list[str]]]:
    for model, gpu, engine, flags in itertools.product(PROFILES, GPUS, ENGINES, FLAG_SETS):
        words = [ENGINE_WORDS[engine].get(word, word) for word in flags]
        for as_json in (False, True):
            argv = ["plan", model, "--gpu", gpu, "--engine", engine, *(["--json"] if as_json else []), *words]
            yield " ".join(argv), argv


def config_cases() -> Iterator[tuple[str, object]]:
    from launcher.common.errors import SafeServeError
    from launcher.edge.render import plan_to_json
    from launcher.model.catalog import hypothetical_gpus
    from launcher.model.config import geometry_from_config
    from launcher.model.resolve import ResolvedModel
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    for path in sorted((ROOT / "tests" / "data" / "configs").glob("*.json")):
        config = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
        for engine, args in itertools.product(ENGINES, ((), ("length", "8192"))):
            name = f"config {path.stem} {engine} {' '.join(args)}"

            def run(config: dict[str, object] = config, engine: str = engine, args: tuple[str, ...] = args,
                    stem: str = path.stem) -> str:
                try:
                    geometry = geometry_from_config(config)
                    model = ResolvedModel(name=stem, source="local", geometry=geometry, weight_bytes=8 * 2**30,
                                          weight_bytes_source="placeholder", config=config)
                    argv = tuple(ENGINE_WORDS[engine]["{length}"] if a == "length" else a for a in args)
                    request = PlanRequest(model=model, engine=engine, gpus=hypothetical_gpus(("8x h200",)),
                                          engine_args=argv)
                    return json.dumps(plan_to_json(make_plan(request)), sort_keys=True, indent=1)
                except SafeServeError as exc:
                    return f"{type(exc).__name__}: {exc}"
            yield name, run


def main() -> int:
    # The output path comes first; a flag in its place (``plan_grid.py --quick``) once wrote
    # a file named "--quick" into the checkout.
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        return 2
    quick = "--quick" in sys.argv[2:]
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    digest = hashlib.sha256()
    count = 0
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        cases: Iterator[tuple[str, object]] = itertools.chain(cli_cases(), config_cases())
        for index, (name, case) in enumerate(cases):
            if quick and index % 3:
                continue
            text = _cli(case) if isinstance(case, list) else case()  # type: ignore[operator]
            block = f"=== {name}\n{text}\n"
            out.write(block)
            digest.update(block.encode())
            count += 1
    print(f"{count} cases, sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
