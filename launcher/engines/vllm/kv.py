"""vLLM 0.32's KV cache accounting, reproduced to the token.

Sources (vLLM 0.32.0, paths in the vLLM tree):
- page size per layer: `v1/kv_cache_interface.py` (`AttentionSpec.page_size_bytes`;
  MLA caches one latent, no factor 2);
- grouping of full and sliding-window layers: `v1/core/kv_cache_utils.py`
  `_get_kv_cache_groups_uniform_page_size` (group size = the smallest bucket, or the
  largest when it is under 1.5x the smallest; buckets padded to whole groups);
- bytes per block = group size x page; num_blocks = KV bytes // bytes per block;
- per-request blocks: full `cdiv(max_model_len, block)`, sliding
  `cdiv(min(window - 1 + in_flight, max_model_len), block) + 1`
  (`SlidingWindowSpec.max_admission_blocks_per_request`);
- the printed figure: `int(num_blocks / blocks_per_request * max_model_len)` tokens and
  `%.2f` concurrency (`get_kv_cache_capacity`), so sliding-window models print more
  tokens than they have slots;
- the startup check keeps one null block: usable = KV bytes - bytes per block
  (`_check_enough_kv_cache_memory`), and its estimated maximum length is a binary search.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.search import largest_length
from launcher.model import FULL, LINEAR, SLIDING, ModelGeometry, kv_heads_per_rank
from launcher.units import cdiv

DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
CPU_BLOCK_SIZE = 128  # CpuPlatform.check_and_update_config when --block-size is unset


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: layers that share a block table."""

    kind: str  # FULL, SLIDING or MLA
    num_layers: int  # real layers in this group (padding excluded)
    sliding_window: int | None = None


@dataclass(frozen=True)
class KvLayout:
    """How one rank's KV cache is cut into blocks."""

    block_size: int  # tokens per block
    page_bytes: int  # one block of one layer
    group_size: int  # layers per group, padding included
    groups: tuple[KvGroup, ...]
    kv_dtype_bytes: int

    @property
    def bytes_per_block(self) -> int:
        """One block across every layer of a group: what `num_blocks` divides by."""
        return self.group_size * self.page_bytes

    @property
    def padding_layers(self) -> int:
        return self.group_size * len(self.groups) - sum(g.num_layers for g in self.groups)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of `max_model_len` tokens claims across all groups."""
        total = 0
        for group in self.groups:
            if group.kind == SLIDING and group.sliding_window is not None:
                held = min(group.sliding_window - 1 + in_flight_tokens, max_model_len)
                total += cdiv(held, self.block_size) + 1
            else:
                total += cdiv(max_model_len, self.block_size)
        return total


@dataclass(frozen=True)
class KvCapacity:
    """What vLLM will print and enforce for a KV budget."""

    kv_bytes: int
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    tokens: int  # the "KV cache size: N tokens" figure
    fits_one_request: bool
    estimated_max_model_len: int  # the longest length that fits (vLLM's binary search)

    @property
    def concurrency_printed(self) -> str:
        return f"{self.max_concurrency:.2f}"


def page_bytes_per_layer(geometry: ModelGeometry, *, block_size: int, kv_dtype_bytes: int, tp: int) -> int:
    if geometry.mla is not None:
        # MLA: one latent (kv_lora_rank + rope dims) per token, replicated on every rank.
        return block_size * geometry.mla.latent_dim * kv_dtype_bytes
    heads = kv_heads_per_rank(geometry.num_kv_heads, tp)
    return block_size * heads * (geometry.head_dim + geometry.v_head_dim) * kv_dtype_bytes


def pp_partitions(num_layers: int, pp: int) -> list[range]:
    """Layer ranges per pipeline stage, as vLLM's `get_pp_indices` splits them.

    The remainder goes one layer each to the stages before the last.
    """
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def kv_layout(
    geometry: ModelGeometry,
    *,
    block_size: int,
    kv_dtype_bytes: int,
    tp: int = 1,
    pp: int = 1,
    hybrid_manager: bool = True,
) -> KvLayout:
    """Group the KV layers of one rank the way vLLM's KV cache manager does.

    With pipeline parallelism each stage sizes its own cache and the engine uses the
    smallest block count, so the stage with the largest block wins.
    """
    if pp > 1:
        stages = [
            _layout_for_kinds(geometry, [geometry.layer_kinds[i] for i in layers], block_size=block_size,
                              kv_dtype_bytes=kv_dtype_bytes, tp=tp, hybrid_manager=hybrid_manager)
            for layers in pp_partitions(geometry.num_layers, pp)
        ]
        return max(stages, key=lambda layout: layout.bytes_per_block)
    return _layout_for_kinds(geometry, list(geometry.layer_kinds), block_size=block_size,
                             kv_dtype_bytes=kv_dtype_bytes, tp=tp, hybrid_manager=hybrid_manager)


def _layout_for_kinds(geometry: ModelGeometry, kinds: list[str], *, block_size: int, kv_dtype_bytes: int,
                      tp: int, hybrid_manager: bool) -> KvLayout:
    kinds = [k for k in kinds if k != LINEAR]
    if not hybrid_manager:
        # --disable-hybrid-kv-cache-manager: sliding layers are promoted to full attention.
        kinds = [FULL if k == SLIDING else k for k in kinds]
    page = page_bytes_per_layer(geometry, block_size=block_size, kv_dtype_bytes=kv_dtype_bytes, tp=tp)
    buckets: dict[str, int] = {}
    for kind in kinds:
        buckets[kind] = buckets.get(kind, 0) + 1
    window = geometry.sliding_window
    if len(buckets) == 1:
        (kind, count), = buckets.items()
        return KvLayout(block_size=block_size, page_bytes=page, group_size=count,
                        groups=(KvGroup(kind, count, window if kind == SLIDING else None),),
                        kv_dtype_bytes=kv_dtype_bytes)
    smallest, largest = min(buckets.values()), max(buckets.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[KvGroup] = []
    for kind, count in buckets.items():
        num_groups = cdiv(count, group_size)
        for i in range(num_groups):
            members = len(range(i, count, num_groups))  # layers[i::num_groups]
            groups.append(KvGroup(kind, members, window if kind == SLIDING else None))
    return KvLayout(block_size=block_size, page_bytes=page, group_size=group_size,
                    groups=tuple(groups), kv_dtype_bytes=kv_dtype_bytes)


def kv_capacity(layout: KvLayout, kv_bytes: int, *, max_model_len: int, in_flight_tokens: int) -> KvCapacity:
    """Blocks, printed tokens and concurrency for `kv_bytes` of KV cache on the tightest rank."""
    num_blocks = max(0, kv_bytes // layout.bytes_per_block)
    per_request = layout.blocks_per_request(max_model_len, in_flight_tokens)
    concurrency = num_blocks / per_request if per_request else 0.0
    check_memory = kv_bytes - layout.bytes_per_block  # the null block never serves a request
    needed = layout.bytes_per_block * per_request
    return KvCapacity(
        kv_bytes=kv_bytes,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        tokens=int(concurrency * max_model_len),
        fits_one_request=check_memory > 0 and needed <= check_memory,
        estimated_max_model_len=estimate_max_model_len(layout, check_memory, max_model_len, in_flight_tokens),
    )


def estimate_max_model_len(layout: KvLayout, check_memory: int, max_model_len: int, in_flight_tokens: int) -> int:
    """vLLM's `_estimate_max_model_len_from_groups`: the longest length that fits, or 0."""
    def fits(length: int) -> bool:
        return layout.bytes_per_block * layout.blocks_per_request(length, in_flight_tokens) <= check_memory

    if check_memory <= 0:
        return 0
    return largest_length(fits, max_model_len, 1)
