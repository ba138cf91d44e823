"""kernels/launch.py's rules, checked without a GPU: inside a captured graph every kernel of the
folder launches as a programmatic dependent of the node before it, which is safe only because
each one's first statement waits for that node (pdl_enter, pdl.cuh). A kernel without it would
read its inputs while they are being written, so the rule is checked on the source. The one
kind of statement allowed before it is a mat-vec's weight prefetch (pdl.cuh's prefetch_rows_l2,
of weights no node writes) and the index arithmetic it needs, which reads no memory. And the
arguments the ctypes launch passes must be the bytes CuPy's own launch would pass."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from minferd.kernels import DIR
from minferd.kernels.launch import _arg

SOURCES = sorted(DIR.glob("*.cu")) + sorted(DIR.glob("*.cuh"))


# Before pdl_enter: `const int` / `const u8*` index arithmetic on arguments and blockIdx (no
# loads: no `[`, no `*` dereference, no __ldg), and `if (pf) <a prefetch call>`.
_INDEX = re.compile(r"const (int|u8\*) \w+ = [\w\s.()+\-*/?:<=>,]+")
_PREFETCH = re.compile(r"if \(pf\) (prefetch_rows_l2|tc_prefetch)\([\w\s.()+\-*/,]+\)")


def _is_index(statement: str) -> bool:
    unary_star = re.search(r"(=|\(|\?|:|,)\s*\*", statement)  # a dereference, not a product
    return bool(_INDEX.fullmatch(statement)) and "__ldg" not in statement and not unary_star


def _kernel_bodies(text: str):
    """(name, the body's first statement that is not the weight prefetch's) of each __global__
    function in a CUDA source."""
    for m in re.finditer(r"__global__\b", text):
        head_end = text.index("{", m.end())
        name = re.findall(r"(\w+)\s*\(", text[m.end():head_end])
        name = [n for n in name if n not in ("__launch_bounds__", "__cluster_dims__")][0]
        body = text[head_end + 1:]
        while True:
            first, body = (s.strip() for s in body.split(";", 1))
            first = " ".join(first.split())
            if not (_PREFETCH.fullmatch(first) or _is_index(first)):
                break
        yield name, first


def test_every_kernel_waits_for_the_node_before_it_first():
    found = 0
    for path in SOURCES:
        text = path.read_text()
        for name, first in _kernel_bodies(text):
            found += 1
            assert first == "pdl_enter()", f"{path.name}: kernel {name} opens with {first[:60]!r}, not pdl_enter()"
        if "__global__" in text:
            assert '#include "pdl.cuh"' in text, f"{path.name} has kernels but does not include pdl.cuh"
    assert found >= 25  # every kernel file of the folder was read


@pytest.mark.parametrize("before", ["const int e = *ids", "const int e = ids[0]", "const int e = __ldg(ids)",
                                    "float s = 0.0f", "if (pf) out[0] = 1.0f"])
def test_only_index_arithmetic_and_the_prefetch_may_come_before_pdl_enter(before):
    ok = ("__global__ void k(const u8* W, const int* ids, float* out, int pf) {\n"
          "  const int r0 = (int)blockIdx.x * 4;\n  if (pf) prefetch_rows_l2(W, 64, r0, min(9, r0 + 4), 0, 64);\n"
          "  pdl_enter();\n}")
    assert list(_kernel_bodies(ok)) == [("k", "pdl_enter()")]
    bad = ok.replace("  pdl_enter();", f"  {before};\n  pdl_enter();")
    assert list(_kernel_bodies(bad)) == [("k", before)]


def test_no_launcher_takes_a_function_around_the_kernel_wrapper():
    """Every launch goes through launch.Kernel (kernels.kernel), so none escapes the rule above."""
    root = DIR.parents[1]
    for path in list((root / "minferd").rglob("*.py")):
        if path.name == "__init__.py" and path.parent == DIR:
            continue
        assert ".get_function(" not in path.read_text(), f"{path.relative_to(root)} calls get_function"


@pytest.mark.parametrize("value,ctype", [(np.int32(-7), ctypes.c_int32), (np.uint64(2**63 + 5), ctypes.c_uint64),
                                         (np.float32(1.5), ctypes.c_float), (np.int64(-3), ctypes.c_int64)])
def test_numpy_scalars_pass_as_their_own_bytes(value, ctype):
    a = _arg(value)
    assert ctypes.sizeof(a) == value.nbytes
    assert ctype.from_buffer_copy(bytes(a)).value == value


def test_python_numbers_pass_as_cupy_passes_them():
    assert isinstance(_arg(5), ctypes.c_int64) and _arg(5).value == 5
    assert isinstance(_arg(0.25), ctypes.c_double) and _arg(0.25).value == 0.25


class _FakeDeviceArray:
    class data:
        ptr = 0x7F0000001000


def test_arrays_pass_as_their_device_pointer():
    assert _arg(_FakeDeviceArray()).value == 0x7F0000001000


@pytest.mark.parametrize("bad", [True, None, "x", [1, 2], np.zeros(3)])
def test_anything_else_is_refused_by_type(bad):
    with pytest.raises(TypeError, match="kernel argument of type"):
        _arg(bad)


def test_the_rows_valve_is_a_whole_number(monkeypatch):
    from minferd.kernels.launch import MAX_ROWS, rows_limit
    monkeypatch.delenv("MINFERD_PDL", raising=False)
    assert rows_limit() == MAX_ROWS
    monkeypatch.setenv("MINFERD_PDL", "0")
    assert rows_limit() == 0
    monkeypatch.setenv("MINFERD_PDL", "yes" * 30)
    with pytest.raises(ValueError, match="MINFERD_PDL='yesyes"):
        rows_limit()
