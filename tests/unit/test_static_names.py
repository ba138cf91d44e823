"""A name that does not exist fails here, also in the modules CI never imports (the CUDA backend
and the launchers' CuPy paths run only on a GPU): pyflakes reads the code without running it."""
from pathlib import Path

import pytest

pyflakes = pytest.importorskip("pyflakes")
from pyflakes import api, messages  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BROKEN = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport,
          messages.ImportStarUsed, messages.ReturnOutsideFunction, messages.DuplicateArgument)


class _Collect:
    def __init__(self):
        self.found = []

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def flake(self, message):
        if isinstance(message, BROKEN):
            self.found.append(str(message))


def test_the_package_names_only_what_exists():
    got = _Collect()
    api.checkRecursive([str(ROOT / "minferd")], got)
    assert not got.found, "\n".join(got.found)


def test_the_check_sees_an_undefined_name(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    return cupy_that_is_not_imported.zeros(3)\n")
    got = _Collect()
    api.checkRecursive([str(tmp_path)], got)
    assert len(got.found) == 1 and "cupy_that_is_not_imported" in got.found[0]
