"""The llama.cpp oracle must be a portable build (issue 13, item 12). Built natively on a CPU with
AMX, llama-cpp-python runs AMX tile instructions, and on a machine without them (or under a
hypervisor that hides them) the oracle tests die with "Illegal instruction" instead of failing."""
from __future__ import annotations

import re

import pytest

PORTABLE = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
            '-DGGML_AVX512=OFF"')
REBUILD = (f"rebuild it portably: {PORTABLE} pip install --no-cache-dir --force-reinstall --no-deps "
           f"llama-cpp-python (.ci/run does this)")


def enabled_features(info: str) -> set[str]:
    """'CPU : SSE3 = 1 | AVX = 1 | AMX_INT8 = 0 | ...' -> the names set to 1."""
    return {name for name, on in re.findall(r"([A-Z0-9_]+) = (\d)", info) if on == "1"}


def test_enabled_features_parses_llama_cpp_system_info():
    info = "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | AVX512 = 0 | LLAMAFILE = 1 | "
    assert enabled_features(info) == {"SSE3", "AVX2", "AMX_INT8", "LLAMAFILE"}


def test_the_oracle_is_built_without_amx():
    llama_cpp = pytest.importorskip("llama_cpp", reason="the oracle extra is not installed")
    info = llama_cpp.llama_print_system_info().decode()
    amx = sorted(f for f in enabled_features(info) if f.startswith("AMX"))
    assert not amx, f"llama-cpp-python was built with {', '.join(amx)} ({info.strip()}); {REBUILD}"
