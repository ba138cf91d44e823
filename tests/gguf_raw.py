"""A GGUF file in raw, byte-exact form for building hostile variants (tests/hostile_gguf.py):
header, key/value records, tensor infos and the data section, parsed and written back without
gguf.GGUFWriter, which refuses most of what a hostile file does (n_dims 0, duplicate keys,
unknown value types, counts that lie)."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field, replace

# GGUF value types (gguf.GGUFValueType), spelled out: the corpus must not depend on the parser it tests.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_SCALAR = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
           U64: "Q", I64: "q", F64: "d"}
# ggml type ids the loader supports (minferd.kernels.quant); every other id is unknown to it.
SUPPORTED_TYPE_IDS = {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39}
TB = 1 << 40


@dataclass
class KV:
    key: bytes
    vtype: int
    value: bytes  # the encoded value, exactly as it follows the type id


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int  # relative to the data section
    n_dims: int | None = None  # written instead of len(dims) when set (a lying count)


@dataclass
class RawGGUF:
    kvs: list[KV]
    infos: list[TensorInfo]
    data: bytes  # the data section (after the alignment padding)
    alignment: int = 32
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None  # header counts; None = the true ones
    n_kv: int | None = None

    def to_bytes(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<I", self.version))
        out += struct.pack("<QQ", len(self.infos) if self.n_tensors is None else self.n_tensors,
                           len(self.kvs) if self.n_kv is None else self.n_kv)
        for kv in self.kvs:
            out += enc_str(kv.key) + struct.pack("<I", kv.vtype) + kv.value
        for t in self.infos:
            out += enc_str(t.name) + struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims)
            out += b"".join(struct.pack("<Q", d) for d in t.dims) + struct.pack("<IQ", t.ttype, t.offset)
        out += bytes(-len(out) % self.alignment)
        return bytes(out + self.data)

    # edits, each returning a copy
    def kv_index(self, key: str) -> int:
        return next(i for i, kv in enumerate(self.kvs) if kv.key == key.encode())

    def with_kv(self, key: str, vtype: int, value: bytes) -> "RawGGUF":
        kvs = list(self.kvs)
        new = KV(key.encode(), vtype, value)
        try:
            kvs[self.kv_index(key)] = new
        except StopIteration:
            kvs.append(new)
        return replace(self, kvs=kvs)

    def without_kv(self, key: str) -> "RawGGUF":
        return replace(self, kvs=[kv for kv in self.kvs if kv.key != key.encode()])

    def tensor_index(self, name: str) -> int:
        return next(i for i, t in enumerate(self.infos) if t.name == name.encode())

    def with_tensor(self, which: str, **change) -> "RawGGUF":
        infos = list(self.infos)
        i = self.tensor_index(which)
        infos[i] = replace(infos[i], **change)
        return replace(self, infos=infos)

    def kv_value(self, key: str):
        kv = self.kvs[self.kv_index(key)]
        if kv.vtype == STR:
            return kv.value[8:].decode()
        return struct.unpack("<" + _SCALAR[kv.vtype], kv.value)[0]


def enc_str(s: bytes | str) -> bytes:
    s = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(s)) + s


def enc(vtype: int, v) -> bytes:
    return enc_str(v) if vtype == STR else struct.pack("<" + _SCALAR[vtype], v)


def enc_array(sub: int, items) -> bytes:
    return struct.pack("<IQ", sub, len(items)) + b"".join(enc(sub, x) for x in items)


def _value_size(buf: bytes, off: int, vtype: int) -> int:
    if vtype in _SCALAR:
        return struct.calcsize("<" + _SCALAR[vtype])
    if vtype == STR:
        return 8 + struct.unpack_from("<Q", buf, off)[0]
    if vtype == ARR:
        sub, n = struct.unpack_from("<IQ", buf, off)
        pos = off + 12
        if sub in _SCALAR:
            return 12 + n * struct.calcsize("<" + _SCALAR[sub])
        for _ in range(n):
            pos += _value_size(buf, pos, sub)
        return pos - off
    raise ValueError(f"value type {vtype}")


@dataclass
class Layout:
    """Byte offsets in the good file, for truncations and in-place patches."""
    kv_starts: list[int] = field(default_factory=list)  # where each key/value record begins
    kv_value_at: dict[str, int] = field(default_factory=dict)  # where each value begins
    info_starts: list[int] = field(default_factory=list)
    data_offset: int = 0


def parse(buf: bytes) -> tuple[RawGGUF, Layout]:
    """A valid GGUF file as RawGGUF (trusting it: this is for the good file only)."""
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF", "not a GGUF file"
    pos, kvs, lay = 24, [], Layout()
    for _ in range(n_kv):
        lay.kv_starts.append(pos)
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen]
        pos += 8 + klen
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        size = _value_size(buf, pos, vtype)
        lay.kv_value_at[key.decode()] = pos
        kvs.append(KV(key, vtype, buf[pos:pos + size]))
        pos += size
    infos = []
    for _ in range(n_tensors):
        lay.info_starts.append(pos)
        nlen = struct.unpack_from("<Q", buf, pos)[0]
        name = buf[pos + 8:pos + 8 + nlen]
        pos += 8 + nlen
        nd = struct.unpack_from("<I", buf, pos)[0]
        dims = list(struct.unpack_from(f"<{nd}Q", buf, pos + 4))
        pos += 4 + 8 * nd
        ttype, off = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append(TensorInfo(name, dims, ttype, off))
    raw = RawGGUF(kvs, infos, b"", version=version)
    if any(kv.key == b"general.alignment" for kv in kvs):
        raw.alignment = raw.kv_value("general.alignment")
    lay.data_offset = pos + (-pos % raw.alignment)
    raw.data = buf[lay.data_offset:]
    return raw, lay


def ggml_type_bytes(ttype: int, dims: list[int]) -> int:
    # block (elements, bytes) of the types a synthetic model uses
    blocks = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
              8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
    be, bb = blocks[ttype]
    return dims[0] // be * bb * math.prod(dims[1:])


