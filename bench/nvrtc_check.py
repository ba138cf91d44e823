"""Compile the project's kernels with NVRTC for sm_90 on a machine with no GPU: compile errors
and the lowered template names show up here, before a device call costs device time.

    pip install -e ".[kernelcheck]"                    # once: CUDA 13's NVRTC and headers, no GPU needed
    python bench/nvrtc_check.py [dequant mmvq ops ...]  # default: every minferd/kernels/*.cu
    python bench/nvrtc_check.py --parts tcgemv          # each part as kernel() compiles it, timed
    python bench/nvrtc_check.py --plain                 # each module's extern "C" kernels alone

Exit status: 0 all compiled, 1 a module failed, 3 no NVRTC found (tests/unit skip then).
NVRTC_LOG_CHARS: how much of a compile log to print (default 6000; more for ptxas -v's register
counts of every kernel, through compile_module(..., opts=("--ptxas-options=-v",))).

A kernel module's name expressions come from its launcher (minferd/kernels/<name>.py) if it
defines names(); ops.cu and the like have none (extern "C" kernels only). --parts compiles and
times each part as the daemon does (kernels/__init__.py), one at a time.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minferd.kernels import DIR, parts, valve_defines  # noqa: E402
from minferd.kernels.precompile import module_names, name_expressions  # noqa: E402


def _lib():
    cands = [os.environ.get("MINFERD_NVRTC", "")] + \
        [p for s in sys.path for p in glob.glob(f"{s}/nvidia/cu13/lib/libnvrtc.so.*")]
    for c in cands:
        if c and os.path.exists(c) and "builtins" not in c and ".alt." not in c:
            for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so.*")):
                if ".alt." not in b:  # NVRTC dlopens it by name: load it first, globally
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(c)
    print("no libnvrtc: pip install -e '.[kernelcheck]' (or set MINFERD_NVRTC)", file=sys.stderr)
    sys.exit(3)


def compile_program(lib, path: Path, exprs=(), opts=(), include: Path = DIR) -> tuple[int, str, bytes, dict]:
    """NVRTC on the .cu file at path (its headers from include): status, log, the sm_90 cubin, and
    each name expression's lowered (mangled) name."""
    code = (f'#line 1 "{path}"\n' + path.read_text()).encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), code, str(path).encode(), 0, None, None) == 0
    for e in exprs:
        assert lib.nvrtcAddNameExpression(prog, e.encode()) == 0
    # CuPy puts CUDA's headers (cuda_fp16.h) on NVRTC's path; here, the nvidia-cuda-runtime
    # wheel's, or a local toolkit's.
    heads = [p for s in sys.path for p in glob.glob(f"{s}/nvidia/cu13/include") if os.path.exists(f"{p}/cuda_fp16.h")]
    inc = [f"-I{d}".encode() for d in (heads + sorted(glob.glob("/usr/local/cuda*/include")))[:1]]
    opts = tuple(opts) + valve_defines(path.stem)  # as kernels.module() compiles it
    o = [b"-std=c++17", f"-I{include}".encode(), b"-arch=sm_90"] + inc + [x.encode() for x in opts]
    rc = lib.nvrtcCompileProgram(prog, len(o), (ctypes.c_char_p * len(o))(*o))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    cubin, lowered = b"", {}
    if rc == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        cubin = buf.raw
        for e in exprs:
            name = ctypes.c_char_p()
            if lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)) == 0:
                lowered[name.value.decode()] = e
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), cubin, lowered


def compile_module(lib, name: str, exprs=(), opts=()) -> int:
    t = time.time()
    rc, log, _, _ = compile_program(lib, DIR / f"{name}.cu", exprs, opts)
    print(f"{name}: {'ok' if rc == 0 else 'FAILED'} in {time.time() - t:.1f} s, {len(exprs)} name expressions")
    if log.strip():
        print(log[:int(os.environ.get("NVRTC_LOG_CHARS", 6000))])
    return rc


def main(argv) -> int:
    by_part = "--parts" in argv  # each part as kernel() compiles it (kernels/__init__.py), timed
    plain = "--plain" in argv  # only the part of no instances: the extern "C" kernels alone
    lib = _lib()
    rc = 0
    for name in [a for a in argv if not a.startswith("--")] or module_names():
        exprs = () if plain else name_expressions(name)
        if not by_part:
            rc |= compile_module(lib, name, exprs)
            continue
        times = []
        for p in parts(exprs):
            t = time.time()
            rc |= compile_module(lib, name, p)
            times.append(time.time() - t)
        print(f"{name}: {len(times)} parts, {sum(times):.1f} s in all, the largest {max(times):.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
