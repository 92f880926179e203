"""Every flag an installed engine's own argparse accepts, as JSON: the source of the tables in
launcher/engines/<engine>/argparse_flags.json.

    $SAFE_SERVE_VLLM_PYTHON tests/oracles/engine_flags.py vllm OUT.json
    $SAFE_SERVE_SGLANG_PYTHON tests/oracles/engine_flags.py sglang OUT.json   # with the oracle's stubs

vLLM: `make_arg_parser(FlexibleArgumentParser())` (vllm/entrypoints/common/cli_args.py:431 on 0.33, :432 on
0.34, vllm/entrypoints/launchers/cli_args.py:421 on 0.32, vllm/entrypoints/openai/cli_args.py before), which
adds EngineArgs.add_cli_args (vllm/engine/arg_utils.py:934 on 0.32, :966 on 0.34). SGLang:
`ServerArgs.add_cli_args(argparse.ArgumentParser())` (sglang/srt/server_args.py, as `prepare_server_args`
builds it). An older or newer release's Python tree on PYTHONPATH ahead of the venv gives that release's table
(VLLM_TARGET_DEVICE=cpu for vLLM).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path


def vllm_parser() -> tuple[str, str, argparse.ArgumentParser]:
    import vllm

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    for name in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                 "vllm.entrypoints.openai.cli_args"):  # 0.33+, 0.32, earlier
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return vllm.__version__, name + ".make_arg_parser", module.make_arg_parser(FlexibleArgumentParser())
    raise SystemExit("no make_arg_parser in this vLLM")


def sglang_parser() -> tuple[str, str, argparse.ArgumentParser]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.oracles import sglang_oracle

    sglang_oracle.Oracle()  # the oracle's import stubs (triton, torchvision, ...)
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return __version__, "sglang.srt.server_args.ServerArgs.add_cli_args", parser


def _registered(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Every option string the parser matches for `action`: its own, and those registered but hidden
    from help (vLLM 0.33's EnableDisableAction keeps `--no-enable-x` only in the parser's table,
    utils/argparse_utils.py:120-151)."""
    return sorted({*action.option_strings,
                   *(s for s, a in parser._option_string_actions.items() if a is action)})


def flags_of(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Canonical (first long) spelling -> every option string of that argument."""
    flags = {}
    for action in parser._actions:
        strings = _registered(parser, action)
        if not strings or "--help" in strings:
            continue
        longs = [s for s in strings if s.startswith("--")]
        flags[longs[0] if longs else strings[0]] = strings
    return flags


# How argparse's `type` turns a value into what `choices` is checked against (argparse calls
# `type` first): as typed (no type, or str), or lower-cased with '-' as '_' (vLLM's --moe-backend,
# arg_utils.py:1806 in 0.32). Any other conversion is not recorded: its choices are not checked.
_PROBE = "Ab-C"
_NORMALIZATIONS = {"Ab-C": "exact", "ab_c": "lower_underscore", "ab-c": "lower"}


def choices_of(parser: argparse.ArgumentParser) -> dict[str, dict[str, object]]:
    """Canonical spelling -> {"values": the choices as strings, "normalize": how a value is turned into
    one}, for the arguments with string choices and a conversion named in _NORMALIZATIONS."""
    found: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        if (not action.option_strings or action.choices is None or action.nargs is not None
                or "--help" in action.option_strings):  # several values per flag: not checked
            continue
        # a set's order changes from run to run (SGLang's --sampling-backend): sorted then
        values = sorted(action.choices) if isinstance(action.choices, (set, frozenset)) else list(action.choices)
        if not values or not all(isinstance(v, str) for v in values):
            continue
        try:
            converted = _PROBE if action.type in (None, str) else action.type(_PROBE)  # type: ignore[misc,operator]
        except Exception:  # a type that refuses the probe: not a plain string conversion
            continue
        normalize = _NORMALIZATIONS.get(converted) if isinstance(converted, str) else None
        if normalize is None:
            continue
        strings = _registered(parser, action)
        longs = [s for s in strings if s.startswith("--")]
        found[longs[0] if longs else strings[0]] = {"values": values, "normalize": normalize}
    return found


if __name__ == "__main__":
    engine, out = sys.argv[1], sys.argv[2]
    version, source, parser = vllm_parser() if engine == "vllm" else sglang_parser()
    Path(out).write_text(json.dumps({"version": version, "source": source, "flags": flags_of(parser),
                                     "choices": choices_of(parser)}, indent=1, sort_keys=True) + "\n")
    print(version, len(flags_of(parser)), len(choices_of(parser)))
