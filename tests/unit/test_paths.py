"""minferd.paths: a LoadModel path is bounded before any work, resolved under the model
directories, and opened once without following a link the check did not see."""
import os
import shutil
import time

import pytest

from minferd import paths
from minferd.config import MAX_PATH_BYTES, MAX_PATH_PARTS
from minferd.errors import InvalidRequest, ModelFileError, NotFound, PermissionDenied
from minferd.paths import check_path, open_model_source


@pytest.fixture()
def tree(tmp_path, synth_model):
    models, outside = tmp_path / "models", tmp_path / "outside"
    (models / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(synth_model("qwen2"), models / "a.gguf")
    shutil.copy(synth_model("qwen2"), models / "sub" / "b.gguf")
    shutil.copy(synth_model("llama"), outside / "secret.gguf")
    return models, outside


def opened(requested, models) -> str:
    with open_model_source(requested, [models]) as src:
        st = os.stat(src.path)
        assert src.identity == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        return str(src.path)


# ---- bounds, before any work -------------------------------------------------------------------
@pytest.mark.parametrize("path, words", [
    ("", "empty"),
    ("a\x00b.gguf", "control characters"),
    ("a\nb.gguf", "control characters"),
    ("x" * (MAX_PATH_BYTES + 1), "too long"),
    ("é" * (MAX_PATH_BYTES // 2 + 1), "too long"),  # bytes, not characters
    ("a/" * 300_000 + "x.gguf", "too long"),
    ("a/" * MAX_PATH_PARTS + "x.gguf", "components"),
    ("d/" + "x" * 256, "too long"),
    ("\ud800.gguf", "UTF-8"),
])
def test_paths_no_file_can_have_are_refused_at_once(path, words):
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequest) as e:
        check_path(path)
    assert time.perf_counter() - t0 < 0.1
    assert words in str(e.value) and len(str(e.value)) < 300, str(e.value)


def test_paths_at_the_bounds_pass():
    check_path("a/" * (MAX_PATH_PARTS - 1) + "x.gguf")
    check_path("/" + "x" * 255)
    check_path("/".join(["y" * 200] * (MAX_PATH_BYTES // 201)))


def test_a_huge_path_is_refused_before_resolving(tree, monkeypatch):
    models, _ = tree
    monkeypatch.setattr(paths, "_candidates", lambda *a: pytest.fail("resolved an unbounded path"))
    with pytest.raises(InvalidRequest):
        open_model_source("a/" * 300_000, [models])


# ---- which files ------------------------------------------------------------------------------
def test_names_and_paths_under_the_directory_open(tree):
    models, _ = tree
    real = os.path.realpath(models)
    assert opened("a.gguf", models) == f"{real}/a.gguf"
    assert opened("a", models) == f"{real}/a.gguf"
    assert opened("sub/b.gguf", models) == f"{real}/sub/b.gguf"
    assert opened(f"{models}/sub/../a.gguf", models) == f"{real}/a.gguf"
    (models / "alias.gguf").symlink_to("sub/b.gguf")  # a link inside to a file inside: its target
    assert opened("alias.gguf", models) == f"{real}/sub/b.gguf"


def test_files_outside_are_refused(tree):
    models, outside = tree
    (models / "out.gguf").symlink_to(outside / "secret.gguf")
    (models / "outdir").symlink_to(outside)
    for p in (str(outside / "secret.gguf"), f"{models}/../outside/secret.gguf", "out.gguf", "outdir/secret.gguf",
              "..", "../outside/secret.gguf", str(outside / "missing.gguf")):
        with pytest.raises(PermissionDenied):
            open_model_source(p, [models])


def test_a_link_out_of_the_directory_is_named_as_one(tree):
    """A name inside (an operator's link into a download cache, say) that resolves outside: the
    refusal says a link led out and what to do, not that the name given is outside."""
    models, outside = tree
    (models / "out.gguf").symlink_to(outside / "secret.gguf")
    with pytest.raises(PermissionDenied, match="leads outside .* through a symbolic link.*--models-dir"):
        open_model_source("out", [models])
    with pytest.raises(PermissionDenied, match="is outside the model directories"):
        open_model_source(str(outside / "secret.gguf"), [models])


def test_what_is_not_a_regular_file_is_not_found(tree):
    models, _ = tree
    os.mkfifo(models / "fifo.gguf")  # opening a FIFO for reading would wait for a writer
    (models / "dir.gguf").mkdir()
    (models / "loop.gguf").symlink_to("loop.gguf")
    for p in ("missing.gguf", "fifo.gguf", "fifo", "dir.gguf", "a.gguf/x", ".", "sub"):
        with pytest.raises(NotFound):
            open_model_source(p, [models])
    with pytest.raises((NotFound, PermissionDenied)):
        open_model_source("loop.gguf", [models])


def test_no_directories_load_nothing(tree):
    with pytest.raises(PermissionDenied):
        open_model_source("a.gguf", [])


# ---- the open follows no link the check did not see -------------------------------------------
def resolved_as(monkeypatch, real):
    """As if realpath saw `real` and the tree changed before the open."""
    monkeypatch.setattr(paths, "_candidates", lambda *a: iter([(real, real)]))


def test_a_file_swapped_for_a_link_after_the_check_is_refused(tree, monkeypatch):
    models, outside = tree
    (models / "x.gguf").symlink_to(outside / "secret.gguf")
    resolved_as(monkeypatch, str(models.resolve() / "x.gguf"))
    with pytest.raises(PermissionDenied) as e:
        open_model_source("x.gguf", [models])
    assert "symbolic link" in str(e.value)


def test_a_directory_swapped_for_a_link_after_the_check_is_refused(tree, monkeypatch):
    models, outside = tree
    (outside / "sub").mkdir()
    shutil.copy(outside / "secret.gguf", outside / "sub" / "b.gguf")
    shutil.rmtree(models / "sub")
    (models / "sub").symlink_to(outside / "sub")
    resolved_as(monkeypatch, str(models.resolve() / "sub" / "b.gguf"))
    with pytest.raises(NotFound):  # O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR
        open_model_source("sub/b.gguf", [models])


def test_an_opened_file_outside_the_root_is_refused(tree):
    models, outside = tree
    fd = os.open(outside / "secret.gguf", os.O_RDONLY)
    try:
        assert not paths._still_beneath(fd, str(models.resolve()))
        assert paths._still_beneath(fd, str(outside.resolve()))
    finally:
        os.close(fd)


def test_the_source_reads_the_file_opened_not_the_name(tree):
    models, outside = tree
    with open_model_source("a.gguf", [models]) as src:
        first = src.read(0, 64, "the start")
        os.replace(outside / "secret.gguf", models / "a.gguf")
        assert bytes(src.read(0, 64, "the start")) == bytes(first)
        assert src.identity[1] != os.stat(models / "a.gguf").st_ino


def test_packaged_names_open_plainly(gemma_path):
    with open_model_source("gemma3-270m", []) as src:
        assert os.path.samefile(src.path, gemma_path) and src.size == os.path.getsize(gemma_path)


# ---- no descriptor outlives a refusal ---------------------------------------------------------
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_refusals_close_what_they_opened(tree, monkeypatch):
    models, outside = tree
    os.mkfifo(models / "fifo.gguf")
    (models / "dir.gguf").mkdir()
    (models / "out.gguf").symlink_to(outside / "secret.gguf")
    (models / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    refusals = ["", "x" * 300, "a/" * 3000, "missing.gguf", "fifo.gguf", "dir.gguf", "out.gguf", "..",
                str(outside / "secret.gguf"), "sub/nope.gguf", "a.gguf/x"]
    before = open_fds()
    for _ in range(5):
        for p in refusals:
            with pytest.raises((InvalidRequest, NotFound, PermissionDenied)):
                open_model_source(p, [models])
        from minferd.model.loader import open_model_file
        with pytest.raises(ModelFileError):
            open_model_file(open_model_source("bad.gguf", [models]))
    assert open_fds() == before  # no gc.collect(): closed at the refusal, not when collected
    (models / "y.gguf").symlink_to(outside / "secret.gguf")
    resolved_as(monkeypatch, str(models.resolve() / "y.gguf"))
    for _ in range(5):
        with pytest.raises(PermissionDenied):
            open_model_source("y.gguf", [models])
    assert open_fds() == before
