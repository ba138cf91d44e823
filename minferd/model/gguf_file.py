"""Open a GGUF file: metadata, a checked tensor table, and zero-copy views of tensor bytes.

Parsing is gguf.GGUFReader's. Two things are added on top: a fast path for large metadata
arrays (the stock reader makes several numpy objects per element, 30 s for a 262k-token vocab),
and checks that turn every malformed file into one ModelFileError naming the file and the
problem, before anything large is allocated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from minferd.errors import ModelFileError
from minferd.kernels.quant import QuantType, by_id, tensor_bytes

GGUF_MAGIC = 0x46554747  # "GGUF" little-endian
MAX_DIMS = 4
# A dimension past this asks for terabytes: refuse it as absurd before any arithmetic trusts it.
MAX_DIM = 1 << 40

_SCALAR_SIZES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}


class _Reader(GGUFReader):
    """GGUFReader with whole-array reads: one numpy view per scalar array, one per string."""

    def _get(self, offset, dtype, count=1, override_order=None):
        # The stock reader slices np.memmap, whose __getitem__/__array_finalize__ dominate parsing.
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        end = offset + dt.itemsize * count
        if end > plain.size:
            raise ValueError(f"a field at byte {offset} runs past the end of the file")
        arr = plain[offset:end].view(dt)
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, sub = int(alen[0]), GGUFValueType(int(itype[0]))
        offs = orig_offs + 12
        remaining = self.data.size - offs
        if sub == GGUFValueType.STRING:
            if n * 8 > remaining:
                raise ValueError(f"a string array claims {n} items, more than the file can hold")
            plain = self.__dict__["_plain"]
            raw = memoryview(plain)
            parts, idxs = [itype, alen], []
            for _ in range(n):
                slen = int.from_bytes(raw[offs:offs + 8], "little")
                if slen > plain.size - offs - 8:
                    raise ValueError(f"a string at byte {offs} runs past the end of the file")
                idxs.append(len(parts))
                parts.append(plain[offs + 8:offs + 8 + slen])
                offs += 8 + slen
            return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, sub]
        size = _SCALAR_SIZES.get(sub)
        if size is None:
            raise ValueError(f"arrays of {sub.name} are not supported")
        if n * size > remaining:
            raise ValueError(f"an array claims {n} items, more than the file can hold")
        values = self._get(offs, self.gguf_scalar_to_np[sub], n)
        return 12 + n * size, [itype, alen, values], [2], [GGUFValueType.ARRAY, sub]

    def _build_tensors(self, start_offs, fields):
        # Keep the raw tensor infos: GGUFFile checks them itself, so a bad type id, shape or
        # offset becomes a ModelFileError that names the tensor rather than a numpy exception.
        self.tensor_fields = fields


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    qtype: QuantType
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def row_elems(self) -> int:
        return self.shape[0]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def n_elems(self) -> int:
        return self.row_elems * self.n_rows


class GGUFFile:
    """A GGUF file opened read-only: `metadata` (small values), `tensors` (checked), `raw(name)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._check_header()
        try:
            self.reader = _Reader(self.path)
        except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as e:
            raise ModelFileError(self.path, f"malformed GGUF: {e}") from None
        self.metadata = self._read_metadata()
        self.tensors = self._read_tensors()

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(self.path, "metadata has no general.architecture string")
        return arch

    def field(self, key: str):
        """The full value of a metadata field, large arrays included (e.g. the vocabulary)."""
        f = self.reader.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except (ValueError, UnicodeDecodeError) as e:
            raise ModelFileError(self.path, f"metadata {key}: {e}") from None

    def array_len(self, key: str) -> int:
        """Number of items in an array field without reading them (0 where absent)."""
        f = self.reader.fields.get(key)
        # The declared count (parts: key length, key, value type, item type, count, ...), not
        # len(f.data): _Reader keeps a scalar array as one numpy part, so len(f.data) was 1 for any
        # numeric array (a hostile file's vocabulary of numbers read as 1 token).
        return int(f.parts[4][0]) if f is not None and f.types and f.types[0] == GGUFValueType.ARRAY else 0

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view shaped (n_rows, row_bytes); no copy."""
        t = self.tensors[name]
        flat = self.reader.data.view(np.ndarray)[t.offset:t.offset + t.n_bytes]
        return flat.reshape(t.n_rows, t.n_bytes // t.n_rows)

    def _check_header(self) -> None:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(24)
        except OSError as e:
            raise ModelFileError(self.path, f"cannot read: {e.strerror}") from None
        if len(head) < 24:
            raise ModelFileError(self.path, f"truncated header ({size} bytes; a GGUF header is 24)")
        magic, version = int.from_bytes(head[0:4], "little"), int.from_bytes(head[4:8], "little")
        if magic != GGUF_MAGIC:
            raise ModelFileError(self.path, f"bad magic {head[0:4]!r}: not a GGUF file")
        if version not in (2, 3):
            raise ModelFileError(self.path, f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors = int.from_bytes(head[8:16], "little")
        n_kv = int.from_bytes(head[16:24], "little")
        # Each tensor info takes at least 8+1+4+8+4+8 bytes, each key/value at least 8+1+4+1.
        if n_tensors * 33 + n_kv * 14 > size:
            raise ModelFileError(
                self.path, f"header claims {n_tensors} tensors and {n_kv} metadata keys, "
                f"more than {size} bytes can hold (truncated or corrupt)")

    def _read_metadata(self) -> dict:
        md = {}
        for key, f in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            # Large arrays (vocabularies) are read on demand through field(). By the declared count:
            # len(f.data) is 1 for a numeric array, so a hostile file's array of millions of numbers
            # became a Python list here (tens of bytes per element).
            if f.types and f.types[0] == GGUFValueType.ARRAY and self.array_len(key) > 64:
                continue
            try:
                md[key] = f.contents()
            except (ValueError, UnicodeDecodeError) as e:
                raise ModelFileError(self.path, f"metadata {key}: {e}") from None
        return md

    def _read_tensors(self) -> dict[str, TensorInfo]:
        size = self.reader.data.size
        tensors: dict[str, TensorInfo] = {}
        for rt in self._tensor_fields():
            name, dims, type_id, rel = rt
            where = f"tensor {name}"
            if name in tensors:
                raise ModelFileError(self.path, f"{where}: duplicate tensor name")
            if not 1 <= len(dims) <= MAX_DIMS or any(d < 1 or d > MAX_DIM for d in dims):
                raise ModelFileError(self.path, f"{where}: absurd shape {list(dims)}")
            try:
                qt = by_id(type_id)
            except (KeyError, ValueError) as e:
                raise ModelFileError(self.path, f"{where}: {e}") from None
            try:
                n_bytes = tensor_bytes(qt, dims)
            except ValueError as e:
                raise ModelFileError(self.path, f"{where} ({qt.name}): {e}") from None
            start = self.reader.data_offset + rel
            if rel % self.reader.alignment:
                raise ModelFileError(self.path, f"{where}: offset {rel} is not aligned to {self.reader.alignment}")
            if start + n_bytes > size:
                raise ModelFileError(
                    self.path, f"{where} ({qt.name} {list(dims)}, {n_bytes} bytes at {start}) runs past "
                    f"the end of the file ({size} bytes): truncated tensor data")
            tensors[name] = TensorInfo(name, qt, tuple(dims), start, n_bytes)
        spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in tensors.values())
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                raise ModelFileError(self.path, f"tensors {a} and {b} overlap")
        return tensors

    def _tensor_fields(self):
        """(name, dims, ggml type id, offset relative to the data section) for each tensor info."""
        for f in self.reader.tensor_fields:
            dims = tuple(int(d) for d in f.parts[3])
            yield f.name, dims, int(f.parts[4][0]), int(f.parts[5][0])
