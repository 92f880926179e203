"""vLLM 0.32's KV cache accounting, reproduced to the token.

Sources (vLLM 0.32.0, paths in the vLLM tree):
- per-layer spec: what each architecture's model code builds
  (`launcher.engines.vllm.architectures.vllm_layer_specs`);
- page size per layer: `v1/kv_cache_interface.py` (`AttentionSpec.page_size_bytes`;
  MLA caches one latent, no factor 2);
- one spec for every layer: one group (`_get_kv_cache_groups_uniform_spec`); one type with
  different shapes: one group whose block spans every page (`UniformTypeKVCacheSpecs`);
- mixed types: `unify_kv_cache_spec_page_size` (smaller pages get a larger block, or are
  padded when they do not divide), then `_get_kv_cache_groups_uniform_page_size` (group size =
  the smallest bucket, or the largest when it is under 1.5x the smallest; buckets padded to
  whole groups), `v1/core/kv_cache_utils.py:1292-1502`;
- `--disable-hybrid-kv-cache-manager` promotes sliding and chunked layers to full
  (`_promote_local_kv_cache_specs`, :1690-1763);
- bytes per block = the largest group's pages; num_blocks = KV bytes // bytes per block;
- per-request blocks: full `cdiv(max_model_len, block)`, sliding
  `cdiv(min(window - 1 + in_flight, max_model_len), block) + 1`
  (`SlidingWindowSpec.max_admission_blocks_per_request`), chunked local
  `cdiv(min(chunk + in_flight, max_model_len), block)` (`ChunkedLocalAttentionSpec`,
  `v1/kv_cache_interface.py:810-831`);
- the printed figure: `int(num_blocks / blocks_per_request * max_model_len)` tokens and
  `%.2f` concurrency (`get_kv_cache_capacity`), so sliding-window models print more
  tokens than they have slots;
- the startup check keeps one null block: usable = KV bytes - bytes per block
  (`_check_enough_kv_cache_memory`), and its estimated maximum length is a binary search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.units import cdiv
from launcher.engines.dtypes import auto_kv_bytes, kv_element_bytes
from launcher.engines.vllm import hybrid
from launcher.engines.vllm.architectures import CHUNKED, LayerSpec, cached_layers, uses_mla, vllm_layer_specs
from launcher.engines.vllm.hybrid import MAMBA
from launcher.engines.vllm.rules import VllmRules
from launcher.model.config import FULL, MLA, SLIDING, ModelGeometry, kv_heads_per_rank
from launcher.plan.search import largest_length

DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
CPU_BLOCK_SIZE = 128  # CpuPlatform.check_and_update_config when --block-size is unset


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: layers that share a block table."""

    kind: str  # FULL, SLIDING, CHUNKED or MLA
    num_layers: int  # real layers in this group (padding excluded)
    sliding_window: int | None = None  # the window (SLIDING) or the chunk (CHUNKED)
    block_size: int | None = None  # tokens per block when page unification changed it
    fixed_blocks: int | None = None  # state layers (MAMBA): blocks a request holds whatever its length


@dataclass(frozen=True)
class KvLayout:
    """How one rank's KV cache is cut into blocks."""

    block_size: int  # tokens per block
    page_bytes: int  # one block of one layer (the unified page)
    group_size: int  # layers per group, padding included
    groups: tuple[KvGroup, ...]
    kv_dtype_bytes: int
    group_bytes: int | None = None  # one block of the largest group, when pages differ within it
    # Decode context parallelism: the ranks of a DCP group hold different tokens of a request, so a request
    # of L tokens claims cdiv(cdiv(L, d), block) blocks a rank (context_parallel.py).
    context_shards: int = 1

    @property
    def bytes_per_block(self) -> int:
        """One block across every layer of a group: what `num_blocks` divides by."""
        return self.group_bytes if self.group_bytes is not None else self.group_size * self.page_bytes

    @property
    def padding_layers(self) -> int:
        return self.group_size * len(self.groups) - sum(g.num_layers for g in self.groups)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of `max_model_len` tokens claims across all groups."""
        total = 0
        for group in self.groups:
            block = group.block_size or self.block_size
            if group.fixed_blocks is not None:
                total += group.fixed_blocks
            elif group.kind == SLIDING and group.sliding_window is not None:
                held = min(group.sliding_window - 1 + in_flight_tokens, max_model_len)
                total += cdiv(held, block) + 1
            elif group.kind == CHUNKED and group.sliding_window is not None:
                total += cdiv(min(group.sliding_window + in_flight_tokens, max_model_len), block)
            else:
                total += cdiv(cdiv(max_model_len, self.context_shards), block)
        return total

    @property
    def smallest_block(self) -> int:
        return min((group.block_size or self.block_size for group in self.groups), default=self.block_size)


@dataclass(frozen=True)
class StateCache:
    """State layers (Mamba / GDN / short conv) in the KV pool: one page each, padded to the attention page."""

    layers: int
    page_bytes: int  # the padded page (the attention page), or the state itself when nothing attends
    blocks_per_request: int | None  # 'align': 2 (+1 Mamba-2 checkpoint); 'none': 1; 'all': None (as attention)


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
    """The page of the model's first KV layer (all layers, for uniform models)."""
    spec = next((s for s in vllm_layer_specs(geometry) if s is not None), None)
    if spec is None:
        return 0
    return _page(spec, block_size, kv_dtype_bytes, kv_dtype_bytes, tp)


def _page(spec: LayerSpec, block_size: int, kv_dtype_bytes: int, auto_dtype_bytes: int, tp: int) -> int:
    """`AttentionSpec.page_size_bytes`: block x heads on this rank x (K + V head) x dtype."""
    heads = 1 if spec.kind == MLA else kv_heads_per_rank(spec.num_kv_heads, tp)
    dtype = kv_dtype_bytes if spec.kv_dtype_honoured else auto_dtype_bytes
    return block_size * heads * (spec.head_size + spec.head_size_v) * dtype


def pp_partitions(num_layers: int, pp: int) -> list[range]:
    """Layer ranges per pipeline stage, as vLLM's `get_pp_indices` splits them.

    The remainder goes one layer each to the stages before the last.
    """
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def kv_layout(
    geometry: ModelGeometry,
    *,
    block_size: int,
    kv_dtype_bytes: int,
    tp: int = 1,
    pp: int = 1,
    hybrid_manager: bool = True,
    auto_dtype_bytes: int = 2,
    state: StateCache | None = None,
) -> KvLayout:
    """Group the KV layers of one rank the way vLLM's KV cache manager does.

    `auto_dtype_bytes` is the model dtype's size, which layers that ignore
    `--kv-cache-dtype` keep. With pipeline parallelism each stage sizes its own cache and
    the engine uses the smallest block count, so the stage with the largest block wins.
    """
    specs = vllm_layer_specs(geometry)
    if state is not None:
        # Hybrid and state-space models: the platform already raised the block (hybrid.py), the
        # state layers join the same pool with their page padded to the attention page.
        return _layout_for_specs(list(specs), block_size=block_size, kv_dtype_bytes=kv_dtype_bytes,
                                 auto_dtype_bytes=auto_dtype_bytes, tp=tp, hybrid_manager=hybrid_manager, state=state)
    if pp > 1:
        stages = [
            _layout_for_specs([specs[i] for i in layers], block_size=block_size, kv_dtype_bytes=kv_dtype_bytes,
                              auto_dtype_bytes=auto_dtype_bytes, tp=tp, hybrid_manager=hybrid_manager)
            for layers in pp_partitions(geometry.num_layers, pp)
        ]
        return max(stages, key=lambda layout: layout.bytes_per_block)
    return _layout_for_specs(list(specs), block_size=block_size, kv_dtype_bytes=kv_dtype_bytes,
                             auto_dtype_bytes=auto_dtype_bytes, tp=tp, hybrid_manager=hybrid_manager)


@dataclass(frozen=True)
class _Layer:
    kind: str
    window: int | None
    shape: tuple[int, int, int, bool]  # heads, head size, V head size, dtype honoured
    block: int
    page: int


def _layout_for_specs(specs: list[LayerSpec | None], *, block_size: int, kv_dtype_bytes: int,
                      auto_dtype_bytes: int, tp: int, hybrid_manager: bool,
                      state: StateCache | None = None) -> KvLayout:
    layers = _layers(specs, state, block_size=block_size, kv_dtype_bytes=kv_dtype_bytes,
                     auto_dtype_bytes=auto_dtype_bytes, tp=tp)
    if not layers:  # attention-free: no KV cache at all
        return KvLayout(block_size=block_size, page_bytes=0, group_size=0, groups=(), kv_dtype_bytes=kv_dtype_bytes)
    if not hybrid_manager:
        layers = _promote_local(layers)
    fixed = state.blocks_per_request if state is not None else None
    first = layers[0]
    if len({(la.kind, la.window, la.shape, la.page) for la in layers}) == 1:
        return KvLayout(block_size=block_size, page_bytes=first.page, group_size=len(layers),
                        groups=(KvGroup(first.kind, len(layers), first.window,
                                        fixed_blocks=fixed if first.kind == MAMBA else None),),
                        kv_dtype_bytes=kv_dtype_bytes)
    if _one_type(layers):
        # UniformTypeKVCacheSpecs: one block table, one block spans every layer's own page.
        return KvLayout(block_size=block_size, page_bytes=max(la.page for la in layers), group_size=len(layers),
                        groups=(KvGroup(first.kind, len(layers), first.window),), kv_dtype_bytes=kv_dtype_bytes,
                        group_bytes=sum(la.page for la in layers))
    layers = _unify_pages(layers)
    group_size, groups = _uniform_page_groups(layers, block_size=block_size, fixed=fixed)
    return KvLayout(block_size=block_size, page_bytes=layers[0].page, group_size=group_size,  # one page now
                    groups=groups, kv_dtype_bytes=kv_dtype_bytes)


def _layers(specs: list[LayerSpec | None], state: StateCache | None, *, block_size: int, kv_dtype_bytes: int,
            auto_dtype_bytes: int, tp: int) -> list[_Layer]:
    """One entry per cached layer: attention layers from their spec, then the state layers."""
    layers = [_Layer(s.kind, s.window, (s.num_kv_heads, s.head_size, s.head_size_v, s.kv_dtype_honoured),
                     block_size, _page(s, block_size, kv_dtype_bytes, auto_dtype_bytes, tp))
              for s in specs if s is not None]
    if state is not None:
        layers += [_Layer(MAMBA, None, (0, 0, 0, False), block_size, state.page_bytes)] * state.layers
    return layers


def _promote_local(layers: list[_Layer]) -> list[_Layer]:
    """--disable-hybrid-kv-cache-manager: local layers allocate like full attention when full
    attention layers are present and the types differ (`_promote_local_kv_cache_specs`)."""
    kinds = {layer.kind for layer in layers}
    local = kinds & {SLIDING, CHUNKED}
    if FULL not in kinds or not local or _one_type(layers):
        return layers
    return [_Layer(FULL, None, layer.shape, layer.block, layer.page) if layer.kind in local else layer
            for layer in layers]


def _unify_pages(layers: list[_Layer]) -> list[_Layer]:
    """unify_kv_cache_spec_page_size: scale the block of smaller pages, pad those that do not divide.
    A state page is padded, never re-blocked."""
    largest_page = max(la.page for la in layers)

    def unified(la: _Layer) -> _Layer:
        if la.page == largest_page:
            return la
        scales = largest_page % la.page == 0 and la.kind != MAMBA
        return _Layer(la.kind, la.window, la.shape, la.block * (largest_page // la.page) if scales else la.block,
                      largest_page)

    return [unified(la) for la in layers]


def _uniform_page_groups(layers: list[_Layer], *, block_size: int,
                         fixed: int | None) -> tuple[int, tuple[KvGroup, ...]]:
    """_get_kv_cache_groups_uniform_page_size: (group size, groups) over layers of one page size.
    Group size is the smallest bucket, or the largest when under 1.5x the smallest; each bucket is
    cut into whole groups (layers[i::num_groups])."""
    buckets: dict[tuple[str, int | None, tuple[int, int, int, bool], int], int] = {}
    for la in layers:
        key = (la.kind, la.window, la.shape, la.block)
        buckets[key] = buckets.get(key, 0) + 1
    smallest, biggest = min(buckets.values()), max(buckets.values())
    group_size = biggest if biggest < smallest * 1.5 else smallest
    groups: list[KvGroup] = []
    for (kind, window, _shape, block), count in buckets.items():
        num_groups = cdiv(count, group_size)
        for i in range(num_groups):
            members = len(range(i, count, num_groups))  # layers[i::num_groups]
            groups.append(KvGroup(kind, members, window, block if block != block_size else None,
                                  fixed_blocks=fixed if kind == MAMBA else None))
    return group_size, tuple(groups)


def _one_type(layers: list[_Layer]) -> bool:
    """`UniformTypeKVCacheSpecs.is_uniform_type`: one block size and one kind (one window)."""
    return len({la.block for la in layers}) == 1 and len({(la.kind, la.window) for la in layers}) == 1


def kv_capacity(layout: KvLayout, kv_bytes: int, *, max_model_len: int, in_flight_tokens: int,
                tokens_from_concurrency: bool = True) -> KvCapacity:
    """Blocks, printed tokens and concurrency for `kv_bytes` of KV cache on the tightest rank.

    The printed tokens: int(concurrency x length) from 0.20.1 (kv_cache_utils.py:1141-1149 in 0.34.0); before,
    num_blocks // groups x the smallest block, x the DCP size (0.19.0 kv_cache_utils.py:1297-1316; 0.10.1
    :847 and :1011)."""
    num_blocks = max(0, kv_bytes // layout.bytes_per_block) if layout.bytes_per_block else 0
    per_request = layout.blocks_per_request(max_model_len, in_flight_tokens)
    concurrency = num_blocks / per_request if per_request else 0.0
    check_memory = kv_bytes - layout.bytes_per_block  # the null block never serves a request
    needed = layout.bytes_per_block * per_request
    return KvCapacity(
        kv_bytes=kv_bytes,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        tokens=(int(concurrency * max_model_len) if tokens_from_concurrency
                else num_blocks // max(len(layout.groups), 1) * _smallest_printed_block(layout, max_model_len)
                * layout.context_shards),
        fits_one_request=check_memory > 0 and needed <= check_memory,
        estimated_max_model_len=estimate_max_model_len(layout, check_memory, max_model_len, in_flight_tokens),
    )


def _smallest_printed_block(layout: KvLayout, max_model_len: int) -> int:
    """The smallest group block the pre-0.20.1 KV line multiplies by: a state group in mamba cache mode 'none'
    (one block a request) has blocks of max_model_len (0.19.0 model_executor/models/config.py:474-480)."""
    none_mode = any(group.kind == MAMBA and group.fixed_blocks == 1 for group in layout.groups)
    return min(layout.smallest_block, max_model_len) if none_mode else layout.smallest_block


def estimate_max_model_len(layout: KvLayout, check_memory: int, max_model_len: int, in_flight_tokens: int) -> int:
    """vLLM's `_estimate_max_model_len_from_groups`: the longest length that fits, or 0."""
    def fits(length: int) -> bool:
        return layout.bytes_per_block * layout.blocks_per_request(length, in_flight_tokens) <= check_memory

    if check_memory <= 0:
        return 0
    return largest_length(fits, max_model_len, 1)


# --------------------------------------------------------------------------- dtype, block and layout


# The `--kv-cache-dtype` values safe-serve sizes, as vLLM stores them
# (STR_DTYPE_TO_TORCH_DTYPE, vllm/utils/torch_utils.py:33 in 0.32.0).
KV_CACHE_DTYPES = {
    "fp8": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8", "fp8_inc": "float8_e4m3fn",
    "bfloat16": "bfloat16", "float16": "float16", "half": "float16",
}


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str) -> tuple[int, str]:
    value = (kv_cache_dtype or "auto").lower()
    if value == "auto":
        return auto_kv_bytes(model_dtype), f"kv-cache-dtype auto = model dtype {model_dtype}"
    size = kv_element_bytes(value, KV_CACHE_DTYPES)
    if size is None:
        raise ValueError(f"kv-cache-dtype {value!r} is not one safe-serve can size yet")
    return size, f"kv-cache-dtype {value}" + (" (1 byte)" if size == 1 else "")


def block_size(geometry: ModelGeometry, *, device: str, compute_capability: tuple[int, int] | None,
               pinned: int | None, cpu_amx: bool | None = None, rules: VllmRules | None = None,
               kv_cache_dtype: str | None = None) -> tuple[int, str]:
    """Tokens per KV block: the attention backend's preference unless pinned."""
    geometry = cached_layers(geometry)
    if device == "cpu":
        return _cpu_block_size(geometry, pinned=pinned, cpu_amx=cpu_amx, rules=rules)
    if pinned:
        return pinned, "pinned --block-size"
    default = rules.default_block_size if rules is not None else DEFAULT_BLOCK_SIZE
    if uses_mla(geometry) and compute_capability is not None and compute_capability[0] >= 10:
        # FlashInfer-MLA takes kernel blocks of 32 and 64: the default where it is one of them
        # (v1/attention/backends/mla/flashinfer_mla.py:204-205 in 0.34.0).
        block = default if default in (32, 64) else 32
        return block, f"FlashInfer-MLA on Blackwell (block {block})"
    if uses_mla(geometry) and compute_capability is not None and compute_capability[0] == 9 \
            and kv_cache_dtype is not None and kv_cache_dtype.startswith("fp8"):
        # FLASH_ATTN_MLA, Hopper's first MLA choice, takes no fp8 cache: FlashMLA does, in blocks of
        # 64 (vllm/platforms/cuda.py:147; v1/attention/backends/mla/flashmla.py:49-59 in 0.32).
        return 64, "FlashMLA for an fp8 MLA cache on Hopper (block 64)"
    return default, (f"CacheConfig.DEFAULT_BLOCK_SIZE {default} (FlashAttention / FlashInfer"
                     + (f", vLLM {rules.version}" if rules is not None else "") + ")")


def _cpu_block_size(geometry: ModelGeometry, *, pinned: int | None, cpu_amx: bool | None,
                    rules: VllmRules | None) -> tuple[int, str]:
    """The CPU backend's block. The reference MLA kernel (no AMX) only compiles for block 16 and vLLM
    forces it even over a pinned --block-size (`CpuPlatform.check_and_update_config`)."""
    if uses_mla(geometry) and not cpu_amx:
        return 16, "CPU MLA reference kernel (no AMX) requires block 16 (vllm/platforms/cpu.py)"
    if rules is not None and not rules.cpu_kernel_block_sizes:  # 0.19-0.20: every layer at the configured block
        return (pinned, "pinned --block-size") if pinned else (CPU_BLOCK_SIZE, "CPU backend default "
                                                                "(vllm/platforms/cpu.py:119-120)")
    sliding = SLIDING in geometry.layer_kinds
    if rules is not None and rules.cpu_sliding_block is not None and sliding:
        # Before 0.30 sliding-window layers take the CPU kernel's smallest block (16, on 0.29 32);
        # other layers keep the configured one and pages are unified to the larger.
        configured = pinned or CPU_BLOCK_SIZE
        if all(kind == SLIDING for kind in geometry.layer_kinds):
            return rules.cpu_sliding_block, (f"vLLM {rules.version} CPU: sliding-window layers take the kernel's "
                                             f"smallest block {rules.cpu_sliding_block} (cpu_attn.py)")
        return max(configured, rules.cpu_sliding_block), ("pinned --block-size" if pinned else
                                                           "CPU backend default (vllm/platforms/cpu.py)")
    if pinned and sliding and pinned % 32:
        # Sliding-window layers pick a kernel block of their own (CPU kernels take multiples
        # of 32) and the other layers are scaled to the same page: `kv lcm block sizes 32`.
        return -(-pinned // 32) * 32, f"pinned --block-size {pinned}, raised to a multiple of 32 by the CPU " \
            "sliding-window kernel (Attention.get_kv_cache_spec)"
    if pinned:
        return pinned, "pinned --block-size"
    return CPU_BLOCK_SIZE, "CPU backend default (vllm/platforms/cpu.py)"


def layout_for(geometry: ModelGeometry, *, block: int, kv_bytes: int, tp: int, pp: int,
               pinned: Mapping[str, Any]) -> KvLayout:
    return kv_layout(geometry, block_size=block, kv_dtype_bytes=kv_bytes, tp=tp, pp=pp,
                     hybrid_manager=not pinned.get("--disable-hybrid-kv-cache-manager", False))


def in_flight_tokens(*, batched_tokens: int, device: str, pp: int, v2_runner: bool = False) -> int:
    """`VllmConfig.max_in_flight_tokens`: concurrent batches x max_num_batched_tokens.

    Async scheduling is the GPU default: 2 batches at PP=1, and PP + 1 on the V2 model runner
    (`max_concurrent_batches`, config/vllm.py:582-586 in 0.32.0, :559-566 in 0.34.0; PP on V1);
    it only matters for sliding-window layers, which must hold the in-flight tokens beyond their window.
    """
    if device != "cpu" and v2_runner:
        return (max(pp, 1) + 1) * batched_tokens
    batches = 2 if device != "cpu" and pp <= 1 else max(pp, 1)
    return batches * batched_tokens


# --------------------------------------------------------------------------- hybrid and state-space models


@dataclass(frozen=True)
class HybridSetup:
    """A hybrid / state-space model's cache as vLLM sets it up (launcher.engines.vllm.hybrid)."""

    layout: KvLayout
    block: int
    block_reason: str
    notes: tuple[str, ...]


# The smallest kernel block of the attention backend (`get_supported_kernel_block_sizes`):
# CPU_ATTN MultipleOf(32) (v1/attention/backends/cpu_attn.py), FlashAttention / FlashInfer 16.
_KERNEL_BLOCK = {"cpu": 32, "cuda": 16}


def hybrid_layout_for(geometry: ModelGeometry, *, block: int, kv_bytes: int, model_dtype_bytes: int, tp: int,
                      device: str, pinned: Mapping[str, Any], rules: VllmRules | None = None,
                      cpu_amx: bool | None = None, cpu_avx512_bf16: bool | None = None,
                      compute_capability: tuple[int, int] | None = None) -> HybridSetup | None:
    """The layout of a model with state layers, after the platform's page unification; None without them."""
    layers = hybrid.state_layers(geometry, tp=tp)
    if layers is None:
        return None
    dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=model_dtype_bytes, device=device, pinned=pinned,
                                 rules=rules, cpu_amx=cpu_amx, cpu_avx512_bf16=cpu_avx512_bf16)
    state_bytes = layers.shape.bytes(dtypes.conv_bytes, dtypes.ssm_bytes)
    mode = hybrid.mamba_cache_mode(pinned, layers=layers, rules=rules)
    gdn_checkpoint = hybrid.flashinfer_gdn_checkpoint(layers, mode, rules=rules, device=device,
                                                      compute_capability=compute_capability, pinned=pinned,
                                                      text=geometry.text_config)
    per_request = hybrid.blocks_per_request(layers, mode, rules, gdn_checkpoint=gdn_checkpoint is not None)
    held = f"{per_request} state block(s)" if per_request is not None else "a state block per block of tokens"
    notes = [f"{layers.count} state layers ({layers.family.mixer}) of {state_bytes:,} B each on a rank "
             f"({dtypes.reason}); mamba cache mode '{mode}': {held} per request"]
    if gdn_checkpoint:
        notes.append(gdn_checkpoint)
    reason = "pinned --block-size" if pinned.get("--block-size") else "the backend's block"
    if layers.attention_free:
        page = state_bytes
    else:
        # The platform sizes the attention page from the model-level heads (`get_num_kv_heads`,
        # `get_head_size`); the layers' own pages are unified afterwards (Zamba2's differ).
        # MLA (Kimi-Linear): `MLAAttentionSpec`, one latent of kv_lora_rank + qk_rope_head_dim per token.
        mla = uses_mla(geometry) and geometry.mla is not None
        per_token = geometry.mla.latent_dim * kv_bytes if mla and geometry.mla else \
            2 * kv_heads_per_rank(geometry.num_kv_heads, tp) * geometry.head_dim * kv_bytes
        raised = hybrid.aligned_block_size(
            block=block, attention_bytes_per_token=per_token, state_bytes=state_bytes,
            kernel_block=_KERNEL_BLOCK.get(device, 16), mla=mla,
            checkpoint_alignment=hybrid.FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if gdn_checkpoint else None)
        if raised != block:
            reason = (f"raised from {block} so that one attention page ({per_token} B/token) holds a state of "
                      f"{state_bytes:,} B (platforms/interface.py:1094-1100)")
            notes.append(f"vLLM sets the attention block size to {raised} tokens for the state pages")
        block, page = raised, raised * per_token
        hybrid.refuse_state_overflow(layers, dtypes, page)
    state = StateCache(layers=layers.count, page_bytes=page, blocks_per_request=per_request)
    layout = kv_layout(geometry, block_size=block, kv_dtype_bytes=kv_bytes, tp=tp, state=state,
                       hybrid_manager=not pinned.get("--disable-hybrid-kv-cache-manager", False))
    return HybridSetup(layout, block, reason, tuple(notes))
