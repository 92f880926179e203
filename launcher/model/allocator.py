"""What PyTorch's CUDA caching allocator reserves for tensors allocated in turn and kept: the segments
an engine's weights sit in, beyond the weights' own bytes.

Both engines build their modules on the device, one allocation per parameter and registered buffer,
and measure after `empty_cache()`, which returns only whole free segments: what stays beyond the
tensors is the rounding and the unused ends of the segments that hold them. SGLang counts it in its
"mem usage" after loading (sglang/parameters.py); vLLM from 0.27, whose KV budget takes what
cudaMemGetInfo saw consumed (vllm/weight_segments.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

# torch 2.13 include/c10/core/AllocatorConfig.h:17-25 (CUDACachingAllocator's get_allocation_size):
SMALL_SIZE = 1 << 20  # up to 1 MiB: packed in 2 MiB segments
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20  # 1-10 MiB: packed in 20 MiB segments
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20  # 10 MiB or more: a segment of its own, rounded up to 2 MiB
MIN_BLOCK = 512  # every request rounded up to 512 B


def rounded(size: int) -> int:
    """A request as the allocator sizes its block: up to a multiple of 512 B."""
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_for(size: int) -> int:
    """The segment a request that fits no free block gets (`get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    return LARGE_BUFFER if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """A replay of CUDACachingAllocator's bookkeeping (torch 2.13 c10/cuda/CUDACachingAllocator.cpp, default
    settings, one stream): two pools (requests up to 1 MiB, the rest), best fit by (size, address) among
    the pool's free blocks, else a new segment (`segment_for`); the block split when the rest is worth a
    block (512 B in the small pool, more than 1 MiB in the large one); a freed block merged with free
    neighbours of its segment; `empty_cache` returns the segments that are one free block. Addresses are
    (segment, offset), segments in the order they were made. Pure: no device, no I/O."""

    def __init__(self) -> None:
        self._sizes: list[int] = []  # per segment its bytes (0 once released)
        self._small: list[bool] = []
        self._offsets: list[list[int]] = []  # per segment its blocks' offsets, sorted
        self._blocks: dict[tuple[int, int], list[int]] = {}  # (segment, offset) -> [size, requested, id or -1]
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # (size, segment, offset)
        self._live: dict[int, tuple[int, int]] = {}
        self._next = 0
        self.reserved = 0
        self.peak = 0  # the most `reserved` reached: what cudaMalloc had to find
        self.allocated = 0  # the bytes the live tensors asked for

    def malloc(self, size: int) -> int:
        """A block for `size` bytes; its id (-1 for an empty tensor, which takes none)."""
        if size <= 0:
            return -1
        request = rounded(size)
        small = request <= SMALL_SIZE
        pool = self._free[small]
        at = bisect.bisect_left(pool, (request, -1, -1))
        if at < len(pool):
            _, segment, offset = pool.pop(at)
        else:
            segment, offset = len(self._sizes), 0
            self._sizes.append(segment_for(request))
            self._small.append(small)
            self._offsets.append([0])
            self._blocks[(segment, 0)] = [self._sizes[-1], 0, -1]
            self.reserved += self._sizes[-1]
            self.peak = max(self.peak, self.reserved)
        block = self._blocks[(segment, offset)]
        rest = block[0] - request
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            block[0] = request
            self._add_free(segment, offset + request, rest)
            bisect.insort(self._offsets[segment], offset + request)
        self._next += 1
        block[1:] = [size, self._next]
        self._live[self._next] = (segment, offset)
        self.allocated += size
        return self._next

    def free(self, handle: int) -> None:
        if handle < 0:
            return
        segment, offset = self._live.pop(handle)
        block = self._blocks[(segment, offset)]
        self.allocated -= block[1]
        size = block[0]
        offsets = self._offsets[segment]
        at = bisect.bisect_left(offsets, offset)
        if at + 1 < len(offsets):  # merge with the next block when it is free
            following = offsets[at + 1]
            neighbour = self._blocks[(segment, following)]
            if neighbour[2] < 0:
                self._drop_free(segment, following, neighbour[0])
                size += neighbour[0]
                del self._blocks[(segment, following)]
                offsets.pop(at + 1)
        if at > 0:  # and with the previous one
            previous = offsets[at - 1]
            neighbour = self._blocks[(segment, previous)]
            if neighbour[2] < 0:
                self._drop_free(segment, previous, neighbour[0])
                size += neighbour[0]
                del self._blocks[(segment, offset)]
                offsets.pop(at)
                offset = previous
        self._blocks[(segment, offset)] = [size, 0, -1]
        self._add_free(segment, offset, size)

    def empty_cache(self) -> None:
        for small in (True, False):
            for size, segment, offset in [entry for entry in self._free[small]
                                          if entry[2] == 0 and entry[0] == self._sizes[entry[1]]]:
                self._drop_free(segment, offset, size)
                del self._blocks[(segment, offset)]
                self._offsets[segment] = []
                self.reserved -= size
                self._sizes[segment] = 0

    @property
    def free_bytes(self) -> int:
        """Free blocks inside the segments kept: what a later request of a fitting size is served from
        (best fit) instead of a new segment."""
        return sum(entry[0] for pool in self._free.values() for entry in pool)

    def _add_free(self, segment: int, offset: int, size: int) -> None:
        self._blocks[(segment, offset)] = [size, 0, -1]
        bisect.insort(self._free[self._small[segment]], (size, segment, offset))

    def _drop_free(self, segment: int, offset: int, size: int) -> None:
        pool = self._free[self._small[segment]]
        pool.pop(bisect.bisect_left(pool, (size, segment, offset)))


def replay(tensors: Iterable[int]) -> CachingAllocator:
    """`tensors` allocated in order and kept, then `empty_cache()`."""
    allocator = CachingAllocator()
    for size in tensors:
        allocator.malloc(size)
    allocator.empty_cache()
    return allocator


def slack_bytes(tensors: Iterable[int]) -> int:
    """Bytes the caching allocator's segments hold beyond `tensors`, allocated in order and kept, after
    `empty_cache()`: the requests' rounding, the rests too small to split, and the free blocks."""
    allocator = replay(tensors)
    return allocator.reserved - allocator.allocated
