"""How a device turns tensor allocations into the memory a budget counts: three small allocator models.

The memory tracker (:mod:`autobatch.explain.worker.tracker`) sees every tensor storage a step creates and
frees; an allocator model turns that stream into the figure the device's budget limits:
:class:`ExactAllocator` (the live bytes, nothing else), :class:`CpuAllocatorModel` (``VmData`` of a CPU probe
process with glibc pinned as :mod:`autobatch.devices.cpu` pins it) and :class:`CudaAllocatorModel` (PyTorch's
CUDA caching allocator's reserved segments).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Protocol

KiB = 1 << 10
MiB = 1 << 20

# glibc with autobatch's pinning, and c10's CPU allocator (posix_memalign with 64-byte alignment).
CPU_MMAP_THRESHOLD = 64 * KiB
CPU_PAGE = 4 * KiB
CPU_ALIGNMENT = 64
_SIZE_SZ = 8
_MINSIZE = 32

# The CUDA caching allocator's constants (c10/cuda/CUDACachingAllocator.cpp).
CUDA_MIN_BLOCK = 512
CUDA_SMALL_SIZE = 1 * MiB
CUDA_SMALL_BUFFER = 2 * MiB
CUDA_LARGE_BUFFER = 20 * MiB
CUDA_MIN_LARGE_ALLOC = 10 * MiB
CUDA_ROUND_LARGE = 2 * MiB


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class Allocator(Protocol):
    """Turns storage allocations into device memory; ``current`` and ``peak`` in the device's units."""

    current: int
    peak: int

    def alloc(self, nbytes: int) -> object: ...

    def free(self, handle: object) -> None: ...


@dataclass
class ExactAllocator:
    """The bytes of the live storages.

    What a measured run compares against its real peak, the difference being the residual it reports.
    """

    current: int = 0
    peak: int = 0

    def alloc(self, nbytes: int) -> object:
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        return nbytes

    def free(self, handle: object) -> None:
        assert isinstance(handle, int)
        self.current -= handle


def cpu_bytes(nbytes: int) -> int:
    """Data memory one CPU tensor allocation of ``nbytes`` takes under autobatch's pinned glibc."""
    if nbytes <= 0:
        return 0
    chunk = round_up(nbytes + _SIZE_SZ, 16)
    request = chunk + CPU_ALIGNMENT + _MINSIZE  # _int_memalign asks for room to align within
    if request >= CPU_MMAP_THRESHOLD:
        return round_up(request + _SIZE_SZ, CPU_PAGE)
    return chunk


@dataclass
class CpuAllocatorModel:
    """``VmData`` growth of a pinned-glibc CPU process (mapped blocks page-rounded, heap chunks 16 B).

    Glibc pinned as autobatch pins it (``MALLOC_MMAP_THRESHOLD_=65536``, one arena). PyTorch's CPU allocator
    calls ``posix_memalign(64, n)``: a request that reaches the mmap threshold becomes its own mapping, rounded up
    to whole pages with the chunk header and alignment slack, and is unmapped when freed; smaller ones come from
    the heap in 16-byte steps.
    """

    current: int = 0
    peak: int = 0

    def alloc(self, nbytes: int) -> object:
        size = cpu_bytes(nbytes)
        self.current += size
        self.peak = max(self.peak, self.current)
        return size

    def free(self, handle: object) -> None:
        assert isinstance(handle, int)
        self.current -= handle


def cuda_round(nbytes: int) -> int:
    """The caching allocator's request rounding: at least 512 B, in steps of 512 B."""
    return CUDA_MIN_BLOCK if nbytes < CUDA_MIN_BLOCK else round_up(nbytes, CUDA_MIN_BLOCK)


def cuda_segment_size(size: int) -> int:
    """Size of the segment the allocator reserves for a (rounded) request that no cached block fits."""
    if size <= CUDA_SMALL_SIZE:
        return CUDA_SMALL_BUFFER
    if size < CUDA_MIN_LARGE_ALLOC:
        return CUDA_LARGE_BUFFER
    return round_up(size, CUDA_ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class CudaAllocatorModel:
    """A best-fit, split-and-merge model of PyTorch's CUDA caching allocator (one stream).

    ``current``/``peak`` are reserved bytes (segments); ``allocated``/``peak_allocated`` the rounded
    blocks in use, as ``memory_allocated`` reports them.

    Requests round up to 512 B; requests of at most 1 MiB come from 2 MiB segments (the small pool), larger ones
    from 20 MiB segments when under 10 MiB, else from a segment of their own size rounded up to 2 MiB. A request
    takes the best-fitting free block of its pool (splitting it when the rest is worth keeping: at least 512 B
    in the small pool, more than 1 MiB in the large one); freed blocks merge with free neighbours and stay
    cached. ``reserved`` is the sum of segments (what ``max_memory_reserved`` and the budget count); segments are
    never released, as a step that needed the allocator to flush its cache does not count as fitting.
    """

    current: int = 0
    peak: int = 0
    allocated: int = 0
    peak_allocated: int = 0
    segments: int = 0
    #: Free blocks per pool (small: True), sorted by (size, segment, offset): keys and blocks side by side.
    _keys: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _free: dict[bool, list[_Block]] = field(default_factory=lambda: {True: [], False: []})

    def alloc(self, nbytes: int) -> object:
        size = cuda_round(nbytes)
        small = size <= CUDA_SMALL_SIZE
        keys = self._keys[small]
        index = bisect.bisect_left(keys, (size, -1, -1))
        if index < len(keys):
            keys.pop(index)
            block = self._free[small].pop(index)
        else:
            block = _Block(self.segments, 0, cuda_segment_size(size), small)
            self.segments += 1
            self.current += block.size
            self.peak = max(self.peak, self.current)
        rest = block.size - size
        if rest >= CUDA_MIN_BLOCK if small else rest > CUDA_SMALL_SIZE:
            tail = _Block(block.segment, block.offset + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._insert(tail)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, handle: object) -> None:
        assert isinstance(handle, _Block)
        block = handle
        block.free = True
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free and neighbour is not block:
                self._remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert(block)

    def _insert(self, block: _Block) -> None:
        index = bisect.bisect_left(self._keys[block.small], block.key())
        self._keys[block.small].insert(index, block.key())
        self._free[block.small].insert(index, block)

    def _remove(self, block: _Block) -> None:
        index = bisect.bisect_left(self._keys[block.small], block.key())
        self._keys[block.small].pop(index)
        self._free[block.small].pop(index)


def make_allocator(kind: str) -> Allocator:
    """``exact``, ``cpu`` or ``cuda``."""
    if kind == "cpu":
        return CpuAllocatorModel()
    if kind == "cuda":
        return CudaAllocatorModel()
    return ExactAllocator()
