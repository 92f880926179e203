"""The flags SGLang's own argparse takes, by release (argparse_flags.json, read from SGLang's code by
tests/oracles/engine_flags.py: sglang/srt/server_args.py ServerArgs.add_cli_args, line 351 on
0.5.23, as prepare_server_args builds the parser), and vLLM's spellings of SGLang's.
"""

from __future__ import annotations

from pathlib import Path

from launcher.engines.accepted_flags import AcceptedFlags, load_table

# vLLM's spelling -> SGLang's (vllm/engine/arg_utils.py beside sglang/srt/server_args.py).
EQUIVALENTS = {
    "--max-model-len": "--context-length",
    "-tp": "--tp-size",
    "-pp": "--pp-size",
    "-dp": "--dp-size",
    "--gpu-memory-utilization": "--mem-fraction-static (a fraction for weights and KV; safe-serve plans it)",
    "--device-memory-utilization": "--mem-fraction-static (a fraction for weights and KV; safe-serve plans it)",
    "--max-num-seqs": "--max-running-requests",
    "--max-num-batched-tokens": "--chunked-prefill-size",
    "--kv-cache-memory-bytes": "--max-total-tokens (tokens, not bytes)",
    "--num-gpu-blocks-override": "--max-total-tokens (tokens, not blocks)",
    "--enforce-eager": "--disable-cuda-graph",
    "--block-size": "--page-size",
    "--tokenizer": "--tokenizer-path",
    "--seed": "--random-seed",
    "--no-enable-prefix-caching": "--disable-radix-cache",
    "--master-addr": "--dist-init-addr",
}
# The model is SGLang's --model-path (alias --model); safe-serve passes the positional MODEL there.
MODEL_FLAGS = frozenset({"--model-path", "--model"})

# SGLang's plain argparse.ArgumentParser takes no underscore spellings it does not list itself.
_FLAGS, _CHOICES = load_table(Path(__file__).with_name("argparse_flags.json"))
ACCEPTED = AcceptedFlags("SGLang", _FLAGS, EQUIVALENTS,
                         MODEL_FLAGS, underscores=False,
                         choices=_CHOICES)
