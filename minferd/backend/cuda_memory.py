"""Device memory as the pool and a model's forward passes see it: the CuPy pool with the budget as
its hard limit, and each model's scratch arena."""
from __future__ import annotations

import weakref

import cupy as cp


class DeviceMemory:
    """The device as the pool sees it: one CuPy MemoryPool with the budget as its hard limit.

    Each instance makes its pool the process's allocator and keeps the one it replaced (to hand
    back on close), so instances never closed form a chain that keeps every earlier pool, and the
    blocks it cached, alive: s27 call 1 ran a GPU of 141 GB out with a few loads per test in four
    workers. Loads outside the pool share one instance a device (`local`), and `live()` names
    every instance still alive so a test harness can empty them all."""

    _live: weakref.WeakSet = weakref.WeakSet()
    _local: dict[int, "DeviceMemory"] = {}

    def __init__(self, device_id: int = 0, limit: int | None = None):
        self.device_id = device_id
        self.pool = cp.cuda.MemoryPool()
        if limit is not None:
            self.pool.set_limit(size=limit)
        self._previous = cp.cuda.get_allocator()
        cp.cuda.set_allocator(self.pool.malloc)
        DeviceMemory._live.add(self)

    @classmethod
    def local(cls, device_id: int = 0) -> "DeviceMemory":
        """The one unbudgeted instance of this process for loads outside the pool (`minferd run`,
        tests, bench), made the allocator again if another took its place since."""
        mem = cls._local.get(device_id)
        if mem is None:
            mem = cls._local[device_id] = cls(device_id)
        elif cp.cuda.get_allocator() != mem.pool.malloc:
            cp.cuda.set_allocator(mem.pool.malloc)
        return mem

    @classmethod
    def live(cls) -> list["DeviceMemory"]:
        return list(cls._live)

    def close(self) -> None:
        """Hand the process back the allocator it had: a budget must not outlive its owner (a
        test that failed holding its models would otherwise cap every later allocation)."""
        cp.cuda.set_allocator(self._previous)
        self.pool.free_all_blocks()

    name = "cuda"

    def empty(self, shape, dtype):
        return cp.empty(shape, dtype)

    @staticmethod
    def rounded(nbytes: int) -> int:
        """What the pool takes for a request: CuPy rounds blocks up to 512 bytes."""
        return (nbytes + 511) // 512 * 512

    def trim(self) -> None:
        self.pool.free_all_blocks()

    def used_bytes(self) -> int:
        return self.pool.used_bytes()


class _Owner:
    """What every chunk's memory keeps alive: the arena's buffer, until the arena goes.

    A CuPy pool that dies with blocks still split (a backend collected in a reference cycle, its
    pools dropped before the arrays carved from them) leaves those blocks linked prev <-> next in
    a cycle the collector cannot see: CuPy's _Chunk is `no_gc`. Were the buffer their memory's
    owner, it would stay allocated for the process's life: s30's H100 kept 679 MiB for each tiny
    model loaded locally and dropped, and s31's bench/leak_probe.py found the holders invisible to
    gc. Through this owner such a cycle keeps only a few small objects."""

    __slots__ = ("buf",)

    def __init__(self, buf):
        self.buf = buf


class Arena:
    """A model's scratch: one buffer carved front to back into chunks for private MemoryPools,
    which keep and reuse them. A pass that would need more than the arena gets OutOfMemoryError.

    Eager passes share one pool. A captured CUDA graph gets a pool of its own (`graph_pool`),
    as torch's graphs do: inside the capture a freed buffer is reused by the next allocation
    (the replay runs in the same stream order), and after it nothing else allocates there, so
    no later pass can take memory the graph still writes. Keeping every buffer of a capture
    instead (the first version) held 28 layers' dequantized tiles at once and ran out.

    The chunks keep the buffer through `_Owner`, which lets it go when the arena is closed or
    collected. A pool must outlive the arrays it hands out (CuPy's own rule), so the backend
    drops its graphs, and with them their pools, before it closes the arena."""

    def __init__(self, buf):
        self.owner, self.used = _Owner(buf), 0
        self.nbytes = buf.nbytes
        self.pool = cp.cuda.MemoryPool(self._chunk)

    def _chunk(self, size: int):
        size = (size + 511) // 512 * 512
        buf = self.owner.buf
        if buf is None:
            raise RuntimeError("the arena is closed: no pass may allocate from it")
        if self.used + size > self.nbytes:
            raise cp.cuda.memory.OutOfMemoryError(size, self.nbytes - self.used, self.nbytes)
        mem = cp.cuda.UnownedMemory(buf.data.ptr + self.used, size, self.owner)
        self.used += size
        return cp.cuda.MemoryPointer(mem, 0)

    def graph_pool(self) -> cp.cuda.MemoryPool:
        """A pool for one graph's buffers, from this arena's chunks; the graph keeps it."""
        return cp.cuda.MemoryPool(self._chunk)

    def close(self) -> None:
        """Give every chunk back and let the buffer go now, rather than whenever the garbage
        collector runs (the pool <-> arena cycle) or never (see _Owner)."""
        if self.pool is not None:
            self.pool.free_all_blocks()
        self.pool = self.owner.buf = None

    def __del__(self):
        self.owner.buf = None  # collected without close (a dropped local model): see _Owner

    def malloc(self, size: int):
        return self.pool.malloc(size)
