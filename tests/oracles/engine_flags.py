"""Every flag an installed engine's own argparse accepts, as JSON: the source of the tables in
launcher/engines/<engine>/argparse_flags.json.

    $SAFE_SERVE_VLLM_PYTHON tests/oracles/engine_flags.py vllm OUT.json
    $SAFE_SERVE_SGLANG_PYTHON tests/oracles/engine_flags.py sglang OUT.json   # with the oracle's stubs

vLLM: `make_arg_parser(FlexibleArgumentParser())` (vllm/entrypoints/launchers/cli_args.py:421 on
0.32, vllm/entrypoints/openai/cli_args.py before), which adds EngineArgs.add_cli_args
(vllm/engine/arg_utils.py:934). SGLang: `ServerArgs.add_cli_args(argparse.ArgumentParser())`
(sglang/srt/server_args.py, as `prepare_server_args` builds it). An older release's Python tree
on PYTHONPATH ahead of the venv gives that release's table (VLLM_TARGET_DEVICE=cpu for vLLM).
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
    for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
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


def flags_of(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Canonical (first long) spelling -> every option string of that argument."""
    flags = {}
    for action in parser._actions:
        if not action.option_strings or "--help" in action.option_strings:
            continue
        longs = sorted(s for s in action.option_strings if s.startswith("--"))
        flags[longs[0] if longs else action.option_strings[0]] = sorted(action.option_strings)
    return flags


if __name__ == "__main__":
    engine, out = sys.argv[1], sys.argv[2]
    version, source, parser = vllm_parser() if engine == "vllm" else sglang_parser()
    Path(out).write_text(json.dumps({"version": version, "source": source, "flags": flags_of(parser)},
                                    indent=1, sort_keys=True) + "\n")
    print(version, len(flags_of(parser)))
