"""Every kernel module compiles for sm_90 with NVRTC, its template names included, on a machine
with no GPU (CI): a broken kernel is caught here, not on the device. Skips without NVRTC
(pip install -e '.[kernelcheck]')."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The compiles run at the lowest priority: on CI's 2 cores they shared the machine with the chaos
# test, whose daemon's status latency is measured.
NICE = {"preexec_fn": lambda: os.nice(19)}
MODULES = sorted(p.stem for p in (ROOT / "minferd" / "kernels").glob("*.cu"))


@pytest.mark.parametrize("name", MODULES)
def test_kernel_module_compiles(name):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "nvrtc_check.py"), name],
                       capture_output=True, text=True, timeout=600, **NICE)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_pending_rope_kv_instances_compile():
    """mmvq_rope_kv's instances (kernels/mmvq_rope_kv.py, the pending path qkv_rope) compile on
    demand, outside mmvq's names(): here those of a Q4_K_M model's types."""
    code = ("import sys; sys.path.insert(0, 'bench'); import nvrtc_check as c; "
            "from minferd.kernels.mmvq_rope_kv import names; "
            "sys.exit(c.compile_module(c._lib(), 'mmvq', names(('Q4_K', 'Q6_K', 'Q5_0', 'Q8_0'))))")  # _lib: 3, no NVRTC
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, **NICE)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_module_compiles_with_no_instances():
    """The part kernel() takes extern "C" kernels from (kernels/__init__.py): no template
    instance, so nothing a module's templates would pull in may be needed by its plain kernels."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "nvrtc_check.py"), "--plain"],
                       capture_output=True, text=True, timeout=600, **NICE)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok in") == len(MODULES), r.stdout


def test_a_changed_header_changes_what_cupy_caches_by(tmp_path, monkeypatch):
    """CuPy keys its kernel cache on the source text; module() puts the headers' digest in it,
    so editing a .cuh can never bring back a cubin compiled from the old header."""
    import minferd.kernels as kernels
    monkeypatch.setattr(kernels, "DIR", tmp_path)
    (tmp_path / "a.cuh").write_text("#define X 1\n")
    before = kernels._headers_digest.__wrapped__()
    (tmp_path / "a.cuh").write_text("#define X 2\n")
    assert kernels._headers_digest.__wrapped__() != before


def sass_diff(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "sass_diff.py"), *args],
                          capture_output=True, text=True, timeout=600, **NICE)


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_sass_diff_tells_an_unchanged_kernel_from_a_changed_one():
    """bench/sass_diff.py, by which session 19 landed tcgemv's register ring without a GPU: a kernel
    compiled from the tree and from the same source in git is the same machine code; Q4_K's
    16-token kernel differs from the commit before the ring (8676695)."""
    if git("diff", "--quiet", "HEAD", "--", "minferd/kernels").returncode:
        pytest.skip("minferd/kernels has uncommitted changes: the tree is not HEAD")
    one = r"^tcgemv_cl<12, 2, 1, 4, 1, 2>$"
    r = sass_diff("tcgemv", "--against", "HEAD", "--match", one)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0 and "1 kernels' SASS identical, 0 changed" in r.stdout, r.stdout + r.stderr
    if git("cat-file", "-e", "8676695~1").returncode:
        pytest.skip("a shallow clone: no commit before the ring")
    r = sass_diff("tcgemv", "--against", "8676695~1", "--match", one)
    assert r.returncode == 1 and "CHANGED tcgemv_cl<12, 2, 1, 4, 1, 2>" in r.stdout, r.stdout + r.stderr
