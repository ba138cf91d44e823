"""A model file opened once: the descriptor every read goes through, and what the file was when
it was opened.

Reads are os.pread calls on that descriptor. A file swapped by name after the open is never seen,
and a file that shrinks while it loads gives a short read, which is a typed refusal; reading it
through a memory map was a SIGBUS that killed the daemon."""
from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import numpy as np

from minferd.errors import ModelFileError

# O_NONBLOCK: opening a FIFO must not hang the caller; a regular file's reads ignore the flag.
OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


class ModelSource:
    """An open regular file: `path` (what errors and status name), `identity` (st_dev, st_ino,
    st_size, st_mtime_ns at open: the weight set's key and what `changed()` compares against)."""

    __slots__ = ("path", "identity", "_file")

    def __init__(self, fd: int, path: str | os.PathLike):
        """Take ownership of `fd`: it is closed here if it is refused, else by close()."""
        self.path = Path(path)
        try:
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise ModelFileError(self.path, f"cannot read: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ModelFileError(self.path, "not a regular file")
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        # A FileIO owns the descriptor so that a source nobody closed still closes when collected.
        self._file = io.FileIO(fd, "rb", closefd=True)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ModelSource":
        """Open a trusted path by name (tests, `minferd run`, packaged models, preloads)."""
        try:
            fd = os.open(path, OPEN_FLAGS)
        except OSError as e:
            raise ModelFileError(path, f"cannot read: {e.strerror}") from None
        return cls(fd, path)

    @property
    def size(self) -> int:
        return self.identity[2]

    @property
    def closed(self) -> bool:
        return self._file.closed

    def read(self, offset: int, n: int, what: str) -> np.ndarray:
        """`n` bytes at `offset` as a fresh uint8 array; a short read means the file shrank."""
        out = np.empty(n, np.uint8)
        view, done = memoryview(out), 0
        try:
            while done < n:  # one read returns at most ~2 GiB on Linux
                got = os.preadv(self._file.fileno(), [view[done:]], offset + done)
                if got == 0:
                    break
                done += got
        except (OSError, ValueError) as e:  # ValueError: read after close()
            raise ModelFileError(self.path, f"cannot read {what}: {getattr(e, 'strerror', None) or e}") from None
        if done < n:
            raise ModelFileError(self.path, f"changed while loading: {what} needs {n} bytes at {offset}, "
                                 f"the file now has {self._now_size()} bytes (it had {self.size})")
        return out

    def changed(self) -> str | None:
        """What differs from the file as it was opened (size, mtime), or None."""
        try:
            st = os.fstat(self._file.fileno())
        except (OSError, ValueError) as e:
            return f"cannot stat it: {getattr(e, 'strerror', None) or e}"
        if st.st_size != self.size:
            return f"its size went from {self.size} to {st.st_size} bytes"
        if st.st_mtime_ns != self.identity[3]:
            return "it was written to (its mtime changed)"
        return None

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "ModelSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _now_size(self) -> int | str:
        try:
            return os.fstat(self._file.fileno()).st_size
        except (OSError, ValueError):
            return "an unknown number of"
