"""Which files LoadModel may read, opened once: regular files under the configured model
directories, through a descriptor checked against them.

A requested path is bounded before any work (realpath's cost grows with the square of its
components, and errors echo it). It is resolved (links and `..` followed) and must land under a
directory; then that resolved path is opened one component at a time from the directory's own
descriptor without following links (O_NOFOLLOW). A link swapped in after the check is refused,
never followed, and everything after reads through the descriptor returned, so the file checked
is the file read: opening the checked name again later loaded whatever it pointed to by then."""
from __future__ import annotations

import errno
import os
import re
import stat

from minferd.config import MAX_PATH_BYTES, MAX_PATH_PARTS
from minferd.errors import InvalidRequest, ModelFileError, NotFound, PermissionDenied, excerpt
from minferd.model.loader import PACKAGED_MODELS, resolve_path
from minferd.model.source import OPEN_FLAGS, ModelSource

NAME_MAX = 255  # the kernel's bound on one path component: a longer one names no file
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = OPEN_FLAGS | os.O_NOFOLLOW
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def open_model_source(requested: str, models_dirs) -> ModelSource:
    """The file `requested` names under `models_dirs`, opened: a bare name is looked up in each
    directory (as given, then with .gguf), a relative path under each, an absolute path as is."""
    if requested in PACKAGED_MODELS:  # a model installed from PyPI: a trusted package, not a user path
        return ModelSource.open(resolve_path(requested))
    check_path(requested)
    roots = [os.path.realpath(d) for d in models_dirs]
    if not roots:
        raise PermissionDenied(f"model path {excerpt(requested)}: the daemon has no --models-dir, so it loads no files")
    for path, real in _candidates(requested, roots):
        root = _root_of(real, roots)
        if root is None:
            # Refused whether or not it exists: the answer must not reveal files outside.
            if _root_of(os.path.normpath(path), roots) is not None:  # a name inside whose links lead out
                raise PermissionDenied(f"model path {excerpt(requested)} leads outside the model directories "
                                       f"({', '.join(roots)}) through a symbolic link: links out of them are "
                                       "refused (add the target's directory with --models-dir, or move the file in)")
            raise PermissionDenied(f"model path {excerpt(requested)} is outside the model directories "
                                   f"({', '.join(roots)})")
        source = _open_beneath(root, os.path.relpath(real, root), requested)
        if source is not None:
            return source
    raise NotFound(f"model path {excerpt(requested)}: no such model file under {', '.join(roots)}")


def check_path(requested: str) -> None:
    """Refuse a path no file can have, before resolving it: too long, too many components, a
    component past NAME_MAX, control characters."""
    if not requested:
        raise InvalidRequest("model path is empty")
    try:
        raw = os.fsencode(requested)
    except UnicodeEncodeError:
        raise InvalidRequest(f"model path {excerpt(requested)} is not valid UTF-8") from None
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidRequest(f"model path {excerpt(requested)} is too long: {len(raw)} bytes, "
                             f"at most {MAX_PATH_BYTES}")
    if _CONTROL.search(raw):
        raise InvalidRequest(f"model path {excerpt(requested)} has control characters")
    parts = [p for p in raw.split(b"/") if p]
    if len(parts) > MAX_PATH_PARTS:
        raise InvalidRequest(f"model path {excerpt(requested)} has {len(parts)} components, "
                             f"at most {MAX_PATH_PARTS}")
    longest = max(map(len, parts), default=0)
    if longest > NAME_MAX:
        raise InvalidRequest(f"model path {excerpt(requested)}: a component of {longest} bytes is too long "
                             f"(at most {NAME_MAX})")


def _candidates(requested: str, roots):
    """(path, resolved path) pairs to try, in order (lazily: the first one found wins)."""
    if "/" not in requested:
        paths = (os.path.join(r, n) for r in roots for n in (requested, requested + ".gguf"))
    elif os.path.isabs(requested):
        paths = iter([requested])
    else:
        paths = (os.path.join(r, requested) for r in roots)
    for path in paths:
        try:
            yield path, os.path.realpath(path)
        except FileNotFoundError:
            continue  # a link that went away between realpath's lstat and its readlink: not there
        except OSError as e:
            raise PermissionDenied(f"model path {excerpt(requested)}: {e.strerror}") from None


def _root_of(real: str, roots) -> str | None:
    for root in roots:
        if os.path.commonpath([root, real]) == root:
            return root
    return None


def _open_beneath(root: str, rel: str, requested: str) -> ModelSource | None:
    """Open root/rel without following a link anywhere below root; None where no regular file is."""
    display = os.path.join(root, rel)
    parts = rel.split(os.sep)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the configured root: trusted
    except OSError as e:
        raise NotFound(f"model path {excerpt(requested)}: the model directory {root} cannot be opened "
                       f"({e.strerror})") from None
    try:
        for part in parts[:-1]:
            sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        file_fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    except OSError as e:
        return _refused(e, requested, display)
    finally:
        os.close(fd)
    try:
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(file_fd)
            return None
        if not _still_beneath(file_fd, root):
            os.close(file_fd)
            raise PermissionDenied(f"model path {excerpt(requested)} moved outside the model directories "
                                   "while it was opened")
    except OSError as e:
        os.close(file_fd)
        raise ModelFileError(display, f"cannot read: {e.strerror}") from None
    return ModelSource(file_fd, display)


def _refused(e: OSError, requested: str, display: str) -> None:
    """An open that failed: no file there (None: try the next candidate), or a typed refusal."""
    # ENOTDIR also where a directory became a link: O_DIRECTORY|O_NOFOLLOW does not follow it.
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return None
    if e.errno == errno.ELOOP:
        raise PermissionDenied(f"model path {excerpt(requested)}: {excerpt(display)} is a symbolic link where "
                               "the check saw none (it changed while opened, or loops): refused, not followed") from None
    if e.errno in (errno.EACCES, errno.EPERM):
        raise PermissionDenied(f"model path {excerpt(requested)}: {e.strerror}") from None
    if e.errno == errno.ENAMETOOLONG:
        raise InvalidRequest(f"model path {excerpt(requested)}: {e.strerror}") from None
    raise ModelFileError(display, f"cannot open: {e.strerror}") from None


def _still_beneath(fd: int, root: str) -> bool:
    """The kernel's name for the opened file still lies under root: a directory of the walk that
    was renamed to outside root while it was walked shows here. Unknowable without /proc: True."""
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return True
    return os.path.commonpath([root, name]) == root if name.startswith("/") else True
