"""The flags vLLM's own argparse takes, by release (argparse_flags.json, read from vLLM's code by
tests/oracles/engine_flags.py: vllm/entrypoints/launchers/cli_args.py:421 make_arg_parser and
vllm/engine/arg_utils.py:934 EngineArgs.add_cli_args on 0.32), and SGLang's spellings of vLLM's.
"""

from __future__ import annotations

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

ACCEPTED = AcceptedFlags("vLLM", load_table(Path(__file__).with_name("argparse_flags.json")), EQUIVALENTS,
                         MODEL_FLAGS, underscores=True)  # FlexibleArgumentParser: _ -> - (argparse_utils.py:337)
