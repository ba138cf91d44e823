"""Open a GGUF file: metadata, a checked tensor table, and tensor bytes read on demand.

Parsing is gguf.GGUFReader's, over bytes read with os.pread from one open descriptor (a
ModelSource), never over a memory map: a file that shrinks while it loads is a short read and a
ModelFileError, where a map was SIGBUS. Two things are added on top: a fast path for large
metadata arrays (the stock reader makes several numpy objects per element, 30 s for a 262k-token
vocab), and checks that turn every malformed file into one ModelFileError naming the file and the
problem, before anything large is allocated.
"""
from __future__ import annotations

import copy
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from minferd.config import MAX_HEADER_BYTES
from minferd.errors import ModelFileError
from minferd.kernels.quant import QuantType, by_id, tensor_bytes
from minferd.model.source import ModelSource

GGUF_MAGIC = 0x46554747  # "GGUF" little-endian
MAX_DIMS = 4
# A dimension past this asks for terabytes: refuse it as absurd before any arithmetic trusts it.
MAX_DIM = 1 << 40
# The header is parsed from a prefix of the file this long (or the whole file), read again twice
# as long if the parse runs past it: the real gemma3's header (262k tokens) is 6.5 MB.
FIRST_READ = 16 << 20

_SCALAR_SIZES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}


class _PastPrefix(Exception):
    """The parse needs bytes up to `end`, which the file has but the prefix read does not."""

    def __init__(self, end: int):
        self.end = end


class _Reader(GGUFReader):
    """GGUFReader over a prefix of the file held in memory, with whole-array reads: one numpy view
    per scalar array, one per string. `file_size` bounds every claim; a field inside the file but
    past the prefix raises _PastPrefix, so that the caller reads more and parses again."""

    def __init__(self, data: np.ndarray, file_size: int):
        # The stock __init__ maps the file by name; this is its parse, over `data`. Magic and
        # version were checked by GGUFFile (little-endian 2 or 3), so the byte order is the host's.
        self.data, self.file_size = data, file_size
        self.fields: OrderedDict[str, ReaderField] = OrderedDict()
        self.tensors = []
        version = self._get(4, np.uint32)
        counts = self._get(8, np.uint64, 2)
        self._push_field(ReaderField(4, "GGUF.version", [version], [0], [GGUFValueType.UINT32]))
        self._push_field(ReaderField(8, "GGUF.tensor_count", [counts[:1]], [0], [GGUFValueType.UINT64]))
        self._push_field(ReaderField(16, "GGUF.kv_count", [counts[1:]], [0], [GGUFValueType.UINT64]))
        offs = self._build_fields(24, int(counts[1]))
        offs, tensor_fields = self._build_tensor_info(offs, int(counts[0]))
        align = self.fields.get("general.alignment")
        if align is not None:
            if align.types != [GGUFValueType.UINT32]:
                raise ValueError("Bad type for general.alignment field")
            self.alignment = align.parts[-1][0]
            if self.alignment == 0 or (self.alignment & (self.alignment - 1)) != 0:
                raise ValueError("Invalid alignment: must be a non-zero power of two")
        self.data_offset = offs + (-offs % int(self.alignment))
        self._build_tensors(self.data_offset, tensor_fields)

    def _need(self, offset: int, end: int, what: str = "a field") -> None:
        """Refuse a read that runs past the file; ask for a longer prefix if it runs past this one."""
        if end > self.file_size:
            raise ValueError(f"{what} at byte {offset} runs past the end of the file")
        if end > self.data.size:
            raise _PastPrefix(end)

    def _get(self, offset, dtype, count=1, override_order=None):
        dt = np.dtype(dtype)
        end = offset + dt.itemsize * int(count)
        if end > self.data.size:
            self._need(offset, end)
        arr = self.data[offset:end].view(dt)
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_str(self, offset):
        # Some gguf releases check a string against self.data's size, which here is the prefix's.
        slen = self._get(offset, np.uint64)
        if int(slen[0]) > self.file_size - offset - 8:
            raise ValueError(f"a string at byte {offset} runs past the end of the file")
        return slen, self._get(offset + 8, np.uint8, int(slen[0]))

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, sub = int(alen[0]), GGUFValueType(int(itype[0]))
        offs = orig_offs + 12
        remaining = self.file_size - offs
        if sub == GGUFValueType.STRING:
            if n * 8 > remaining:
                raise ValueError(f"a string array claims {n} items, more than the file can hold")
            data = self.data
            raw = memoryview(data)
            parts, idxs = [itype, alen], []
            for _ in range(n):
                end = offs + 8
                if end <= data.size:
                    end += int.from_bytes(raw[offs:end], "little")
                if end > data.size:
                    self._need(offs, end, "a string")
                idxs.append(len(parts))
                parts.append(data[offs + 8:end])
                offs = end
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
    """A GGUF file opened read-only: `metadata` (small values), `tensors` (checked), `raw(name)`.

    It owns its source (a path given is opened here): close() closes it, and a refusal while
    opening closes it at once, so that no refused file keeps a descriptor."""

    def __init__(self, source: ModelSource | str | os.PathLike):
        self.source = source if isinstance(source, ModelSource) else ModelSource.open(source)
        self.path = self.source.path
        try:
            self._check_header()
            self.reader = self._parse()
            self.metadata = self._read_metadata()
            self.tensors = self._read_tensors()
        except BaseException:
            self.source.close()
            raise

    def close(self) -> None:
        self.source.close()

    def with_source(self, source: ModelSource) -> "GGUFFile":
        """This parse over another descriptor of the same file (the caller checked its identity):
        a load that shares a loaded file's parse reads through its own descriptor, never the
        first load's, which is closed once that load is done."""
        twin = copy.copy(self)
        twin.source = source
        return twin

    def changed(self) -> str | None:
        """How the file differs from what was opened (see ModelSource.changed), or None."""
        return self.source.changed()

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
        """The tensor's bytes, read now into a fresh uint8 array shaped (n_rows, row_bytes)."""
        t = self.tensors[name]
        flat = self.source.read(t.offset, t.n_bytes, f"tensor {name}")
        return flat.reshape(t.n_rows, t.n_bytes // t.n_rows)

    def _parse(self) -> _Reader:
        size = self.source.size
        want = min(size, FIRST_READ)
        while True:
            # Doubling bounds the parsing done again at the length of the last prefix.
            head = self.source.read(0, want, "the header")
            try:
                return _Reader(head, size)
            except _PastPrefix as e:
                if e.end > MAX_HEADER_BYTES:  # held in memory while the model is loaded: bounded
                    raise ModelFileError(self.path, f"header runs past {MAX_HEADER_BYTES >> 20} MiB "
                                         f"(needs {e.end} bytes); no real model's does") from None
                want = min(size, max(2 * want, e.end))
            except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as e:
                raise ModelFileError(self.path, f"malformed GGUF: {e}") from None

    def _check_header(self) -> None:
        size = self.source.size
        if size < 24:
            raise ModelFileError(self.path, f"truncated header ({size} bytes; a GGUF header is 24)")
        head = self.source.read(0, 24, "the header").tobytes()
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
        size = self.source.size
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
