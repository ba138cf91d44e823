"""The pool's allocator: every long-lived device buffer is made here, tagged (model, kind), and
charged to the ledger before the device is asked for it. A device failure (out of memory
anyway, because another process took memory) becomes PoolExhausted with the ledger unchanged.
"""
from __future__ import annotations

import threading
import weakref

from minferd.pool.ledger import DeviceOutOfMemory, Ledger


class ModelMemory:
    """One model's view of the allocator: what backends receive to allocate for it."""

    def __init__(self, allocator: "Allocator", model: str):
        self.allocator, self.model = allocator, model

    def empty(self, kind: str, shape, dtype):
        return self.allocator.empty(self.model, kind, shape, dtype)

    def release(self, array) -> None:
        self.allocator.release(array)


class Allocator:
    def __init__(self, ledger: Ledger, device):
        """device: the backend's raw memory (empty(shape, dtype), used_bytes())."""
        self.ledger, self.device = ledger, device
        self._live: dict[int, tuple[str, str, int, weakref.finalize]] = {}
        self.fail_at: int | None = None  # tests: make the n-th allocation from now fail
        self.allocations = 0
        self._lock = threading.Lock()
        self._held = 0  # what _live adds up to, kept as one number so status reads it at once

    def for_model(self, model: str) -> ModelMemory:
        return ModelMemory(self, model)

    def empty(self, model: str, kind: str, shape, dtype):
        import numpy as np
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        nbytes = self.device.rounded(nbytes) if hasattr(self.device, "rounded") else nbytes
        self.ledger.charge(model, kind, nbytes)
        self.allocations += 1
        try:
            if self.fail_at is not None:
                self.fail_at -= 1
                if self.fail_at < 0:
                    self.fail_at = None
                    raise MemoryError("injected allocation failure")
            array = self.device.empty(shape, dtype)
        except MemoryError as e:  # cupy's OutOfMemoryError is a MemoryError too
            self.ledger.credit(model, kind, nbytes)
            raise DeviceOutOfMemory(f"allocating {kind} for {model} ({e})", nbytes, self.ledger.free()) from None
        # A buffer dropped without release() (a bug) still returns its bytes to the ledger.
        fin = weakref.finalize(array, self._forget, id(array))
        with self._lock:
            self._live[id(array)] = (model, kind, nbytes, fin)
            self._held += nbytes
        return array

    def release(self, array) -> None:
        entry = self._live.get(id(array))
        if entry is not None:
            entry[3].detach()
            self._forget(id(array))

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self._held -= entry[2]
        if entry is not None:
            model, kind, nbytes, _ = entry
            self.ledger.credit(model, kind, nbytes)

    def trim(self) -> None:
        """Give the device back what the backend keeps cached for reuse (CuPy's pool keeps freed
        blocks): after an unload or a demotion other processes, and nvidia-smi, see the memory."""
        trim = getattr(self.device, "trim", None)
        if trim is not None:
            trim()

    def held_bytes(self) -> int:
        """What the allocator has handed out and not taken back (the ledger must equal it)."""
        return self._held
