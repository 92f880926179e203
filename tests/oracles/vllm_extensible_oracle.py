"""vLLM 0.34's extensible KV cache sizing and CUDA-graph grids, run from the release's own source: a golden file.

    pip download --no-deps vllm==0.34.0 && unzip -q vllm-0.34.0-*.whl 'vllm/*' -d TREE
    python tests/oracles/vllm_extensible_oracle.py TREE/vllm --output tests/data/vllm_extensible_oracle.json

`measure_kv_cache_bytes` and `ExtensibleKVCache.physical_bytes_for` / `blocks_within`
(v1/worker/extensible_kv_cache.py) are pure arithmetic over their arguments: their source is taken
from the file by name, with the module's margin constants as CUDA evaluates them
(`current_platform.is_rocm()` False), and run as written; nothing else of vLLM is imported, so no
GPU, torch or compiled extension is needed. tests/engines/vllm/test_extensible_kv_cache.py replays
every case through launcher/engines/vllm/budget.py. The same for 0.34's CUDA-graph capture grids
(`prefill_cudagraph_capture_grid`, `decode_cudagraph_capture_grid` and their `_walk_grid`,
config/compilation.py), which the CUDA-graph term counts (budget.py `graph_sizes`). And MLA's context
sizing step: `determine_chunked_prefill_workspace_size` with `align_mla_chunked_context_workspace_size` (the
workspace rows) and `plan_mla_context_chunks` (how the cached context is packed into chunks), from
model_executor/layers/attention/mla_attention.py, over a grid of lengths, sequences and blocks, with the
requests `run_context_prefill_warmup` (v1/worker/gpu/warmup.py) builds (budget.py `mla_context_step`).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import textwrap
from pathlib import Path
from typing import Any

GiB, MiB = 1 << 30, 1 << 20
FILE = "v1/worker/extensible_kv_cache.py"
GRIDS = "config/compilation.py"
MLA = "model_executor/layers/attention/mla_attention.py"


def _source_of(tree: ast.Module, text: str, name: str, within: str | None = None) -> str:
    nodes = tree.body
    if within is not None:
        (cls,) = [n for n in nodes if isinstance(n, ast.ClassDef) and n.name == within]
        nodes = cls.body
    (node,) = [n for n in nodes if isinstance(n, ast.FunctionDef) and n.name == name]
    return textwrap.dedent(ast.get_source_segment(text, node) or "")


def load_grids(vllm_dir: Path) -> tuple[dict[str, Any], str]:
    """The release's capture-grid functions (pure: math only) and the file's SHA-256."""
    text = (vllm_dir / GRIDS).read_text()
    tree = ast.parse(text)
    scope: dict[str, Any] = {"math": __import__("math"), "Callable": object}
    for name in ("_walk_grid", "prefill_cudagraph_capture_grid", "decode_cudagraph_capture_grid"):
        exec(_source_of(tree, text, name), scope)  # noqa: S102
    return scope, hashlib.sha256(text.encode()).hexdigest()


def load_mla(vllm_dir: Path) -> tuple[dict[str, Any], str]:
    """The release's MLA workspace and chunk-planning functions (pure arithmetic), and the file's SHA-256."""
    import math
    from dataclasses import dataclass

    text = (vllm_dir / MLA).read_text()
    tree = ast.parse(text)
    scope: dict[str, Any] = {
        "math": math, "lcm": math.lcm, "Callable": object, "dataclass": dataclass,
        "cdiv": lambda a, b: -(-a // b), "round_down": lambda x, y: (x // y) * y,
        "round_up": lambda x, y: ((x + y - 1) // y) * y,
    }
    (plan_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_ContextChunkPlan"]
    exec("@dataclass\n" + (ast.get_source_segment(text, plan_class) or ""), scope)  # noqa: S102
    for name in ("align_mla_chunked_context_workspace_size", "plan_mla_context_chunks"):
        exec(_source_of(tree, text, name), scope)  # noqa: S102
    exec(_source_of(tree, text, "determine_chunked_prefill_workspace_size", within="MLACommonMetadataBuilder")
         .replace("@staticmethod\n", ""), scope)  # noqa: S102
    return scope, hashlib.sha256(text.encode()).hexdigest()


def _config(max_model_len: int, max_num_seqs: int, block: int) -> Any:
    """The attributes the workspace functions read from a VllmConfig (no decode context parallelism)."""
    ns = argparse.Namespace
    return ns(scheduler_config=ns(max_num_seqs=max_num_seqs), cache_config=ns(block_size=block),
              model_config=ns(max_model_len=max_model_len),
              parallel_config=ns(decode_context_parallel_size=1, cp_kv_cache_interleave_size=1))


def mla_cases(scope: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (length, sequences, block, batched tokens): the workspace rows and the rows of each context chunk of
    the warmup's requests, as `run_context_prefill_warmup` builds them (query 2 tokens, no speculative decoding;
    its KV-block cap is left out: the plan assumes the blocks are there) and `plan_mla_context_chunks` packs them
    (block-aligned splits, identity padding without DCP)."""
    out = []
    for length, seqs, block, batched in itertools.product(
            (512, 4096, 8192, 8189, 43_904, 65_536, 163_840), (8, 256, 1024), (16, 64), (2048, 8192)):
        workspace = int(scope["determine_chunked_prefill_workspace_size"](_config(length, seqs, block)))
        query = 2
        context = min(length - query - 1, workspace)
        requests = min(-(-workspace // context), seqs, batched // query)
        plans = scope["plan_mla_context_chunks"]([context] * requests, workspace, (workspace // block) * block,
                                                  block, lambda rows: rows)
        out.append(dict(max_model_len=length, max_num_seqs=seqs, block=block, batched_tokens=batched,
                        workspace=workspace, context=context, requests=requests,
                        chunks=[sum(plan.seq_lens) for plan in plans]))
    return out


def load(vllm_dir: Path) -> tuple[dict[str, Any], str]:
    """The release's functions and constants, and the file's SHA-256 (recorded in the golden file)."""
    path = vllm_dir / FILE
    text = path.read_text()
    tree = ast.parse(text)
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.startswith("KV_CACHE_"):
            expr = ast.get_source_segment(text, node.value) or ""
            constants[node.targets[0].id] = eval(expr.replace("current_platform.is_rocm()", "False"))  # noqa: S307
    scope: dict[str, Any] = dict(constants)
    exec(_source_of(tree, text, "measure_kv_cache_bytes"), scope)  # noqa: S102
    # The block methods, as functions of (segment strides, granule) in place of `self`.
    methods = {}
    for name in ("physical_bytes_for", "blocks_within"):
        methods[name] = _source_of(tree, text, name, within="ExtensibleKVCache")
    exec("\n".join(methods.values()), scope)  # noqa: S102
    return scope, hashlib.sha256(text.encode()).hexdigest()


class _Cache:
    """The attributes `physical_bytes_for` and `blocks_within` read from an ExtensibleKVCache."""

    def __init__(self, scope: dict[str, Any], strides: list[int], granule: int, capacity: int) -> None:
        self.segment_strides = strides
        self.buffer = type("Buffer", (), {"granularity": granule})()
        self.bytes_per_block = sum(strides)
        self.capacity_blocks = capacity
        self.physical_bytes_for = lambda n: scope["physical_bytes_for"](self, n)

    def blocks_within(self, scope: dict[str, Any], num_bytes: int) -> int:
        return int(scope["blocks_within"](self, num_bytes))


def cases(scope: dict[str, Any]) -> dict[str, Any]:
    measure = [
        dict(init_free_memory=free, free_memory=free - used, committed_bytes=committed,
             requested_memory=requested, transient_peak_bytes=transient, torch_reserve_growth_bytes=growth)
        for free, used, committed, requested, transient, growth in itertools.product(
            (22 * GiB, 78 * GiB + 700 * MiB), (14 * GiB, 60 * GiB), (2 * MiB, 56 * MiB),
            (20 * GiB, 72 * GiB, 79 * GiB + 200 * MiB), (300 * MiB, 1 * GiB + 400 * MiB, 3 * GiB),
            (0, 2 * GiB, 5 * GiB))
    ]
    for case in measure:
        case["available"] = int(scope["measure_kv_cache_bytes"](**case))
    blocks = []
    for layers, page, budget in itertools.product((28, 32, 80), (32768, 131072, 262144),
                                                  (3 * GiB + 5 * MiB, 55 * GiB + 123457, 1 * GiB)):
        cache = _Cache(scope, [page] * layers, 2 * MiB, capacity=10**9)
        blocks.append(dict(segments=layers, stride=page, bytes=budget, blocks=cache.blocks_within(scope, budget)))
    constants = {k: v for k, v in scope.items() if k.startswith("KV_CACHE_")}
    return {"constants": constants, "measure": measure, "blocks": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vllm_dir", type=Path, help="the release's vllm/ package directory")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--version", default="0.34.0")
    args = parser.parse_args()
    scope, digest = load(args.vllm_dir)
    grids, grids_digest = load_grids(args.vllm_dir)
    mla, mla_digest = load_mla(args.vllm_dir)
    doc = {"header": {"vllm": args.version, "file": FILE, "sha256": digest, "grids_file": GRIDS,
                      "grids_sha256": grids_digest, "mla_file": MLA, "mla_sha256": mla_digest}, **cases(scope),
           "mla_context": mla_cases(mla),
           "prefill_grid": [{"max_tokens": n, "dense_head": dense,
                             "sizes": grids["prefill_cudagraph_capture_grid"](n, dense)}
                            for n in (1, 48, 512, 1024, 2048, 8192, 16384) for dense in (False, True)],
           "decode_grid": [{"max_requests": n, "sizes": grids["decode_cudagraph_capture_grid"](n)}
                           for n in (1, 6, 7, 100, 256, 1000, 1024, 2048)]}
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(doc['measure'])} sizing cases, {len(doc['blocks'])} block cases -> {args.output}")


if __name__ == "__main__":
    main()
