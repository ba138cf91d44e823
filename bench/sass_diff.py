"""A kernel module's machine code (sm_90 SASS), instance by instance, in the working tree against
a git revision, on a machine with no GPU: which kernels a source change leaves bit-identical, and
the registers and instructions of those it changes.

    pip install -e ".[kernelcheck]"    # NVRTC, cuobjdump and nvdisasm: no GPU or toolkit needed
    python bench/sass_diff.py MODULE [--against REV] [--match REGEX]

Each of the module's parts (minferd/kernels/__init__.py parts()) is compiled as the daemon
compiles it, once from the working tree and once from REV's minferd/kernels (default HEAD).
Exit status 0 when every kernel compared is identical, 1 when one changed, 2 when a side does not
compile, 3 without NVRTC or cuobjdump (tests/unit skip then).

Why: a kernel that compiles to the same SASS as one that ran its tests on the GPU is that kernel.
Session 19 landed tcgemv's register ring for 256-element blocks this way, the device time spent:
those instances identical to the commit whose ring ran test_tcgemv on the H200, every other
type's identical to the commit before it (bench/NOTES.md).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nvrtc_check import _lib, compile_program  # noqa: E402
from minferd.kernels import DIR, parts  # noqa: E402
from minferd.kernels.precompile import name_expressions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """A CUDA binary utility from PATH or its nvidia-cuda-* wheel (nvidia/cu13/bin)."""
    found = shutil.which(name) or next((p for s in sys.path for p in glob.glob(f"{s}/nvidia/cu13/bin/{name}")), None)
    if not found:
        print(f"no {name}: pip install -e '.[kernelcheck]'", file=sys.stderr)
        sys.exit(3)
    return found


def functions(cuobjdump: str, cubin: bytes, lowered: dict) -> dict[str, tuple[int, list[str]]]:
    """Name expression (or mangled name) -> (registers, instructions without addresses) of each kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    regs = {m.group(1): int(m.group(2)) for m in re.finditer(r"Function (\S+):\s*\n\s*REG:(\d+)", res)}
    out, cur = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = lowered.get(m.group(1), m.group(1))
            out[cur] = (regs.get(m.group(1), -1), [])
        elif cur and re.match(r"\s+/\*[0-9a-f]{4}\*/", line):
            out[cur][1].append(line.split(";")[0].split("*/", 1)[1].strip())
    return out


def build(lib, cuobjdump: str, kernels: Path, module: str, exprs) -> dict:
    rc, log, cubin, lowered = compile_program(lib, kernels / f"{module}.cu", exprs, include=kernels)
    if rc:
        print(f"{kernels / module}.cu: compile failed\n{log[:3000]}", file=sys.stderr)
        sys.exit(2)
    return functions(cuobjdump, cubin, lowered)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", help="a minferd/kernels/*.cu stem, e.g. tcgemv")
    ap.add_argument("--against", default="HEAD", help="the git revision to compare with")
    ap.add_argument("--match", default="", help="only the name expressions this regex finds")
    args = ap.parse_args(argv)
    lib, cuobjdump = _lib(), tool("cuobjdump")
    os.environ.setdefault("NVDISASM_PATH", str(Path(tool("nvdisasm")).parent))  # cuobjdump -sass runs it
    exprs = tuple(e for e in name_expressions(args.module) if re.search(args.match, e))
    same = changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "minferd/kernels"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        old_dir = Path(tmp) / "minferd" / "kernels"
        for part in [p for p in parts(exprs) if p] if exprs else [()]:
            new, old = (build(lib, cuobjdump, d, args.module, part) for d in (DIR, old_dir))
            for name, (regs, code) in new.items():
                old_regs, old_code = old.get(name, (-1, []))
                ok = code == old_code
                same, changed = same + ok, changed + (not ok)
                print(f"{'same   ' if ok else 'CHANGED'} {name[:56]:56s} registers {old_regs:3d} -> {regs:3d},"
                      f" instructions {len(old_code):5d} -> {len(code):5d}", flush=True)
    print(f"{args.module} against {args.against}: {same} kernels' SASS identical, {changed} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
