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
