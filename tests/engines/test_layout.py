"""Every engine package has the same layout, an `__init__` that only re-exports, and no module that
imports its own package back (the hidden cycle `vllm/budget.py` once had inside a function)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from launcher.engines import ENGINES

ENGINES_DIR = Path(__file__).resolve().parents[1].parent / "launcher" / "engines"
LAYOUT = {"__init__.py", "adapter.py", "architectures.py", "budget.py", "checks.py", "kv.py", "logs.py",
          "planner.py", "rules.py", "runtime.py", "accepted.py"}
# What one engine needs beyond the shared layout, named so a new module is a decision, not an accident.
# compilation: the CUDA-graph flags; parallel: vLLM's data/expert parallelism (the experts a rank holds);
# context_parallel: vLLM's decode/prefill context parallelism; parameters: the tensors SGLang's loader allocates,
# tensor by tensor; weight_segments: the caching allocator's segments around vLLM's weights, counted from 0.27
EXTRA = {"vllm": {"hybrid.py", "compilation.py", "parallel.py", "context_parallel.py", "weight_segments.py"},
         "sglang": {"parameters.py"}}


@pytest.mark.parametrize("engine", ENGINES)
def test_same_modules_in_every_engine_package(engine: str) -> None:
    assert {p.name for p in (ENGINES_DIR / engine).glob("*.py")} == LAYOUT | EXTRA[engine]


@pytest.mark.parametrize("engine", ENGINES)
def test_init_only_re_exports(engine: str) -> None:
    tree = ast.parse((ENGINES_DIR / engine / "__init__.py").read_text())
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # the docstring
    for node in body:
        is_all = isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
        assert isinstance(node, ast.ImportFrom) or is_all, f"{engine}/__init__.py:{node.lineno} is not a re-export"
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").startswith(f"launcher.engines.{engine}.")


@pytest.mark.parametrize("engine", ENGINES)
def test_no_module_imports_its_own_package(engine: str) -> None:
    """Modules import their siblings (`launcher.engines.vllm.rules`), never the package, at any depth."""
    package = f"launcher.engines.{engine}"
    for path in sorted((ENGINES_DIR / engine).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == package:
                names = [a.name for a in node.names]
                siblings = {p.stem for p in (ENGINES_DIR / engine).glob("*.py")}
                assert set(names) <= siblings, f"{path.name}:{node.lineno} imports {names} from {package}"
            if isinstance(node, ast.ImportFrom) and node.module == "launcher.engines":
                assert engine not in [a.name for a in node.names], f"{path.name}:{node.lineno} imports {package}"


@pytest.mark.parametrize("engine", ENGINES)
def test_rules_rows_are_keyword_deltas_citing_their_source(engine: str) -> None:
    """No positional rows in the version table, and each release's change names where it is written."""
    import importlib

    rules = importlib.import_module(f"launcher.engines.{engine}.rules")
    tree = ast.parse((ENGINES_DIR / engine / "rules.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("VllmRules", "SglangRules"):
            assert not node.args, f"{engine}/rules.py:{node.lineno}: a positional row"
    assert all(row.source for row in rules.RULES)
    assert rules.RULES[-1].version == rules.NEWEST


@pytest.mark.parametrize("engine", ENGINES)
def test_layer_patterns_cite_their_source_and_bind_idempotently(engine: str) -> None:
    """Which layers an engine caches is its table; binding twice changes nothing."""
    import importlib

    from launcher.model.config import FULL, SLIDING, geometry_from_config

    architectures = importlib.import_module(f"launcher.engines.{engine}.architectures")
    assert architectures.LAYER_PATTERNS and all(row.source for row in architectures.LAYER_PATTERNS)
    config = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 10, "sliding_window": 256}
    raw = geometry_from_config(config)
    assert raw.layer_kinds == (SLIDING,) * 4  # the config alone: one window on every layer
    bound = architectures.cached_layers(raw)
    assert bound.layer_kinds == (SLIDING, FULL, SLIDING, FULL) and architectures.cached_layers(bound) == bound


def _contract() -> set[str]:
    from launcher.engines.base import EngineAdapter

    methods = {name for name, value in vars(EngineAdapter).items() if callable(value) and not name.startswith("_")}
    return methods | set(EngineAdapter.__annotations__)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_adapter_meets_the_whole_contract(engine: str) -> None:
    from launcher.engines import adapter

    assert {name for name in _contract() if not hasattr(adapter(engine), name)} == set()


def test_the_contract_says_what_a_third_engine_lacks() -> None:
    """A new engine with only its spec (names, flags) still lacks exactly the ten methods only it can answer;
    `ModuleAdapter` takes them from its modules (below), and mypy reports what is missing either way."""
    import dataclasses

    from launcher.engines.base import SpecAdapter
    from launcher.engines.vllm.adapter import SPEC

    third = SpecAdapter(dataclasses.replace(SPEC, name="third"))
    missing = {name for name in _contract() if not hasattr(third, name)}
    assert missing == {"rules_version", "plan", "engine_decides", "verified_architectures", "engine_argv",
                       "parse_line", "log_reader", "retuned_args", "kv_shortfall", "measurements"}


# What `ModuleAdapter` calls in an engine package for those ten methods: its module protocols' members.
MODULE_FUNCTIONS = {"rules": {"ranks", "gpus_on_node", "worker_node", "rules_for"}, "architectures": {"proof_summary"},
                    "planner": {"plan", "engine_decides"},
                    "runtime": {"engine_argv", "retuned_args", "kv_shortfall", "measurements_for"},
                    "logs": {"parse", "reader"}}


def test_the_module_protocols_name_what_each_engine_module_must_hold() -> None:
    """The twelve methods come from five modules; each protocol lists what its module must define, and both
    engines' modules define it (mypy checks the signatures)."""
    import importlib

    from launcher.engines import base

    protocols = {"rules": base.RulesModule, "architectures": base.ArchitecturesModule,
                 "planner": base.PlannerModule, "runtime": base.RuntimeModule, "logs": base.LogsModule}
    members = {module: {name for name in vars(proto) if callable(getattr(proto, name)) and not name.startswith("_")}
               for module, proto in protocols.items()}
    assert members == MODULE_FUNCTIONS
    for engine in ENGINES:
        for module, names in MODULE_FUNCTIONS.items():
            loaded = importlib.import_module(f"launcher.engines.{engine}.{module}")
            assert {name for name in names if not callable(getattr(loaded, name, None))} == set(), (engine, module)


def test_mypy_names_the_function_a_third_engine_module_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third engine whose runtime module lacks `kv_shortfall`: mypy --strict on its adapter.py says so."""
    api = pytest.importorskip("mypy.api")
    package = tmp_path / "third"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runtime.py").write_text(
        "from launcher.engines.vllm.runtime import engine_argv, measurements_for, retuned_args\n\n"
        "__all__ = ['engine_argv', 'measurements_for', 'retuned_args']\n")
    (package / "adapter.py").write_text(
        "import dataclasses\n\n"
        "from launcher.engines.base import EngineAdapter, ModuleAdapter, PlannerModule\n"
        "from launcher.engines.vllm import architectures, logs, rules\n"
        "from launcher.engines.vllm.adapter import SPEC\n"
        "from third import runtime\n\n\n"
        "def _planner() -> PlannerModule:\n"
        "    from launcher.engines.vllm import planner\n\n"
        "    return planner\n\n\n"
        "ADAPTER: EngineAdapter = ModuleAdapter(dataclasses.replace(SPEC, name='third'), rules=rules,\n"
        "                                       architectures=architectures, planner=_planner, runtime=runtime,\n"
        "                                       logs=logs)\n")
    monkeypatch.setenv("MYPYPATH", f"{ENGINES_DIR.parents[1]}{os.pathsep}{tmp_path}")
    out, _err, status = api.run(["--strict", "--cache-dir", str(tmp_path / "cache"), "-p", "third"])
    assert status == 1, out
    lines = out.splitlines()
    assert 'incompatible type Module; expected "RuntimeModule"' in lines[0]
    assert lines[1].endswith('is missing following "RuntimeModule" protocol member:')
    assert lines[2].endswith("note:     kv_shortfall")


def test_no_any_and_no_bare_ignore_in_the_adapter_path() -> None:
    paths = [ENGINES_DIR / "base.py", ENGINES_DIR / "__init__.py", *(ENGINES_DIR / e / "adapter.py" for e in ENGINES)]
    for path in paths:
        text = path.read_text()
        assert "Any" not in text and "type: ignore" not in text, path.name
