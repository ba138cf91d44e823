"""Every kernel module compiles for sm_90 with NVRTC, its template names included, on a machine
with no GPU (CI): a broken kernel is caught here, not on the device. Skips without NVRTC
(pip install -e '.[kernelcheck]')."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "minferd" / "kernels").glob("*.cu"))


@pytest.mark.parametrize("name", MODULES)
def test_kernel_module_compiles(name):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "nvrtc_check.py"), name],
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
