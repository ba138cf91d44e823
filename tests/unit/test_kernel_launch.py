"""kernels/launch.py's rules, checked without a GPU: inside a captured graph every kernel of the
folder launches as a programmatic dependent of the node before it, which is safe only because
each one's first statement waits for that node (pdl_enter, pdl.cuh), model weights read into
registers the one thing allowed before it. A kernel without it would read its inputs while they
are being written, so the rule is checked on the source; and the
arguments the ctypes launch passes must be the bytes CuPy's own launch would pass."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from minferd.kernels import DIR
from minferd.kernels.launch import _arg

SOURCES = sorted(DIR.glob("*.cu")) + sorted(DIR.glob("*.cuh"))


# Reads of model weights alone, which no graph node writes: allowed before pdl_enter (pdl.cuh),
# each with the register array it fills (the norms' weights; chain.cu's probe of weight bytes).
WEIGHTS_AHEAD = re.compile(r"float \w+\[NORM_W\]|norm_w_ahead\([^;]*\)|uint4 \w+\[STREAM_LOADS\]|stream_load\([^;]*\)")


def _kernel_bodies(text: str):
    """(name, the body's statements before its first pdl_enter(), that statement or the first
    other one) of each __global__ function in a CUDA source."""
    for m in re.finditer(r"__global__\b", text):
        head_end = text.index("{", m.end())
        name = re.findall(r"(\w+)\s*\(", text[m.end():head_end])
        name = [n for n in name if n not in ("__launch_bounds__", "__cluster_dims__")][0]
        statements = [st.strip() for st in text[head_end + 1:].split(";")]
        before = []
        while WEIGHTS_AHEAD.fullmatch(statements[len(before)]):
            before.append(statements[len(before)])
        yield name, before, statements[len(before)]


def test_every_kernel_waits_for_the_node_before_it_first():
    found = ahead = 0
    for path in SOURCES:
        text = path.read_text()
        for name, before, first in _kernel_bodies(text):
            found += 1
            ahead += bool(before)
            assert first == "pdl_enter()", f"{path.name}: kernel {name} opens with {first[:60]!r}, not pdl_enter()"
        if "__global__" in text:
            assert '#include "pdl.cuh"' in text, f"{path.name} has kernels but does not include pdl.cuh"
    assert found >= 25  # every kernel file of the folder was read
    assert ahead == 4  # rmsnorm_q, rmsnorm_h and combine_rmsnorm_q read their norm's weights first; stream_read_early


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
