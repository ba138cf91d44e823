"""Which files LoadModel may read: only regular files under the configured model directories.

The check is on the fully resolved path (symlinks and `..` followed), so a link inside a model
directory that points outside it is refused as well as a plain traversal."""
from __future__ import annotations

import os
from pathlib import Path

from minferd.errors import NotFound, PermissionDenied
from minferd.model.loader import PACKAGED_MODELS, resolve_path


def allowed_model_path(requested: str, models_dirs) -> str:
    if not requested or "\x00" in requested or any(ord(c) < 32 for c in requested):
        raise PermissionDenied(f"model path {requested!r} is empty or has control characters")
    if requested in PACKAGED_MODELS:  # a model installed from PyPI: a trusted package, not a user path
        return resolve_path(requested)
    roots = [Path(os.path.realpath(d)) for d in models_dirs]
    if not roots:
        raise PermissionDenied(f"{requested}: the daemon has no --models-dir, so it loads no files")
    candidates = []
    if os.sep not in requested and "/" not in requested:  # a bare name: look in each directory
        for root in roots:
            candidates += [root / requested, root / (requested + ".gguf")]
    else:
        candidates.append(Path(requested))
    for c in candidates:
        real = Path(os.path.realpath(c))
        if not any(root in real.parents for root in roots):
            # Refused whether or not it exists: the answer must not reveal files outside.
            raise PermissionDenied(f"{requested} is outside the model directories ({', '.join(map(str, roots))})")
        if real.is_file():
            return str(real)
    raise NotFound(f"{requested}: no such model file under {', '.join(map(str, roots))}")
