"""Block layouts of every tensor type minferd accepts: the one table sizes come from.

A GGUF tensor row of n elements is n / block_elems blocks of block_bytes each; nothing
else in the project should hard-code 18, 22, 144 or 210. The ids are ggml's
(gguf.GGMLQuantizationType), so a type read from a file header maps straight in.

The byte layout inside each block is described next to the code that reads it
(dequant_ref.py) and the code that writes it (quantize_ref.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

QK_K = 256  # elements per K-quant super-block


@dataclass(frozen=True, slots=True)
class QuantType:
    name: str
    ggml_id: int
    block_elems: int
    block_bytes: int

    @property
    def is_quantized(self) -> bool:
        # Plain float types are "blocks" of one element; everything else packs a scale.
        return self.block_elems > 1

    @property
    def bits_per_elem(self) -> float:
        return 8.0 * self.block_bytes / self.block_elems


_TABLE = (
    #          name    id  elems  bytes
    QuantType("F32",    0,     1,    4),
    QuantType("F16",    1,     1,    2),
    QuantType("BF16",  30,     1,    2),
    QuantType("Q4_0",   2,    32,   18),  # f16 d, 16 B nibbles
    QuantType("Q4_1",   3,    32,   20),  # f16 d, f16 m, 16 B nibbles
    QuantType("Q5_0",   6,    32,   22),  # f16 d, u32 qh (unaligned), 16 B nibbles
    QuantType("Q5_1",   7,    32,   24),  # f16 d, f16 m, u32 qh, 16 B nibbles
    QuantType("Q8_0",   8,    32,   34),  # f16 d, 32 x int8
    QuantType("Q2_K",  10,  QK_K,   84),  # 16 B scale|min nibbles, 64 B 2-bit q, f16 d, f16 dmin
    QuantType("Q3_K",  11,  QK_K,  110),  # 32 B hmask, 64 B 2-bit q, 12 B 6-bit scales, f16 d
    QuantType("Q4_K",  12,  QK_K,  144),  # f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles
    QuantType("Q5_K",  13,  QK_K,  176),  # as Q4_K plus 32 B high bits before the nibbles
    QuantType("Q6_K",  14,  QK_K,  210),  # 128 B low nibbles, 64 B 2-bit highs, 16 x int8 scales, f16 d
    QuantType("IQ4_NL", 20,    32,   18),  # f16 d, 16 B nibbles indexing the non-linear kvalues_iq4nl
    QuantType("IQ4_XS", 23,  QK_K,  136),  # f16 d, u16 scales_h, 4 B scales_l, 128 B nibbles (as IQ4_NL)
    QuantType("MXFP4",  39,    32,   17),  # e8m0 scale byte, 16 B e2m1 nibbles
)

TYPES: dict[str, QuantType] = {qt.name: qt for qt in _TABLE}
SUPPORTED_NAMES: tuple[str, ...] = tuple(qt.name for qt in _TABLE)
_BY_ID: dict[int, QuantType] = {qt.ggml_id: qt for qt in _TABLE}
# The types the CUDA kernels (dequant.cu, mmvq.cu, gemm_f16.cu; mmq.cu, mmq_small.cu and tcgemv.cu
# their own subsets) decode: every CUDA module enumerates these, not TYPES. A type added to the
# table before its kernels runs on the CPU backend only, and a CUDA load of a file holding one is
# refused up front (model/loader.py check_tensor_types). Today they are the whole table.
CUDA_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4")


class UnsupportedType(KeyError, ValueError):
    """A ggml type id or name outside the table. Both KeyError and ValueError, so either
    idiom catches it; str() is the plain message (KeyError would otherwise quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def by_id(ggml_id: int) -> QuantType:
    try:
        return _BY_ID[int(ggml_id)]
    except KeyError:
        pass
    try:  # name the type when ggml knows it, so the message says "IQ4_XS", not just 23
        from gguf.constants import GGMLQuantizationType
        label = f"{GGMLQuantizationType(int(ggml_id)).name} (ggml id {int(ggml_id)})"
    except (ImportError, ValueError):
        label = f"ggml id {ggml_id}"
    raise UnsupportedType(f"unsupported tensor type {label}; supported: {', '.join(SUPPORTED_NAMES)}")


def by_name(name: str) -> QuantType:
    try:
        return TYPES[name.upper()]
    except KeyError:
        raise UnsupportedType(f"unsupported tensor type {name!r}; "
                              f"supported: {', '.join(SUPPORTED_NAMES)}") from None


def row_bytes(qt: QuantType, n_elems: int) -> int:
    if n_elems < 0 or n_elems % qt.block_elems:
        raise ValueError(f"{qt.name}: row of {n_elems} elements is not a multiple of "
                         f"the {qt.block_elems}-element block")
    return n_elems // qt.block_elems * qt.block_bytes


def tensor_bytes(qt: QuantType, shape: Sequence[int]) -> int:
    """Bytes of a tensor whose shape is in GGUF order: shape[0] (ne0) is the row length."""
    if len(shape) == 0:
        return row_bytes(qt, 1)
    if any(int(n) < 0 for n in shape):
        raise ValueError(f"{qt.name}: negative dimension in shape {tuple(shape)}")
    return row_bytes(qt, int(shape[0])) * math.prod(int(n) for n in shape[1:])
