"""The flags vLLM's own argparse takes, by release (argparse_flags.json, read from vLLM's code by
tests/oracles/engine_flags.py: vllm/entrypoints/launchers/cli_args.py:421 make_arg_parser and
vllm/engine/arg_utils.py:934 EngineArgs.add_cli_args on 0.32; vllm/entrypoints/common/cli_args.py:431 on
0.33, whose hidden `--no-enable-x` spellings stay registered; :432 and arg_utils.py:966 on 0.34), with each
argument's argparse choices, and SGLang's spellings of vLLM's. FlexibleArgumentParser
(vllm/utils/argparse_utils.py) reads argv the same way in 0.33.0 and 0.34.0 (the file is unchanged): `-O`
at :395-406, `_` to `-` at :374-376, `--model` at :337.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from launcher.engines.accepted_flags import AcceptedFlags, load_table

# SGLang's spelling -> vLLM's (sglang/srt/server_args.py beside vllm/engine/arg_utils.py).
EQUIVALENTS = {
    "--context-length": "--max-model-len",
    "--tp-size": "--tensor-parallel-size (-tp)",
    "--tp": "--tensor-parallel-size (-tp)",
    "--pp-size": "--pipeline-parallel-size (-pp)",
    "--dp-size": "--data-parallel-size (-dp)",
    "--mem-fraction-static": "--gpu-memory-utilization (a fraction of the whole GPU; safe-serve plans it)",
    "--max-running-requests": "--max-num-seqs",
    "--chunked-prefill-size": "--max-num-batched-tokens",
    "--max-total-tokens": "--kv-cache-memory-bytes (bytes, not tokens) or --num-gpu-blocks-override",
    "--disable-cuda-graph": "--enforce-eager",
    "--page-size": "--block-size",
    "--tokenizer-path": "--tokenizer",
    "--random-seed": "--seed",
    "--disable-radix-cache": "--no-enable-prefix-caching",
    "--dist-init-addr": "--master-addr and --master-port",
}
# vLLM's parser moves `--model X` to the positional model (vllm/utils/argparse_utils.py:288).
MODEL_FLAGS = frozenset({"--model"})

OPTIMIZATION_LEVELS = frozenset({"0", "1", "2", "3"})


def optimization_short_flag(engine_args: Sequence[str]) -> list[str]:
    """`-O3`, `-O=3`, `-Odecode` and `-O 3` as vLLM's FlexibleArgumentParser rewrites them before argparse
    (`--optimization-level X`; vllm/utils/argparse_utils.py:358-369 on 0.32, :353-364 on 0.31): `-O` is
    not an argparse option string, so the table alone would refuse what vLLM takes."""
    rewritten: list[str] = []
    for i, arg in enumerate(engine_args):
        if arg.startswith("-O") and arg != "-O":
            rewritten += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(engine_args) and engine_args[i + 1] in OPTIMIZATION_LEVELS:
            rewritten.append("--optimization-level")
        else:
            rewritten.append(arg)
    return rewritten


_FLAGS, _CHOICES = load_table(Path(__file__).with_name("argparse_flags.json"))
ACCEPTED = AcceptedFlags("vLLM", _FLAGS, EQUIVALENTS,
                         MODEL_FLAGS, underscores=True,  # FlexibleArgumentParser: _ -> - (argparse_utils.py:337)
                         rewrite=optimization_short_flag,
                         choices=_CHOICES)
