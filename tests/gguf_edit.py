"""Rewrite a GGUF file with changes: the tool tests use to derive bad files from good ones."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from minferd.model.gguf_file import GGUFFile
from minferd.model.synth_vocab import add_metadata

DROP = object()


def rewrite(src, dst, metadata: dict | None = None, tensors: dict | None = None) -> None:
    """Copy src to dst. metadata maps key -> new value (or DROP); tensors maps name -> DROP or
    a dict with any of "type" (a ggml type name), "shape" (GGUF order) and "data" (uint8 bytes)."""
    gf = GGUFFile(src)
    metadata, tensors = metadata or {}, tensors or {}
    w = GGUFWriter(str(dst), arch=None)
    for key, f in gf.reader.fields.items():
        if key.startswith("GGUF.") or key in metadata:
            continue
        vtype = f.types[0]
        value = f.contents()
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    for key, value in metadata.items():
        if isinstance(value, tuple):  # (value, GGUFValueType) to force a type
            w.add_key_value(key, value[0], value[1])
    add_metadata(w, {k: v for k, v in metadata.items() if v is not DROP and not isinstance(v, tuple)})
    order = []
    for name, t in gf.tensors.items():
        change = tensors.get(name, {})
        if change is DROP:
            continue
        data = np.asarray(change.get("data", gf.raw(name).reshape(-1)), dtype=np.uint8)
        qtype = GGMLQuantizationType[change.get("type", t.qtype.name)]
        shape = tuple(change.get("shape", t.shape))
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), data.size, raw_dtype=qtype)
        order.append(data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for data in order:
        w.write_tensor_data(data)
    w.close()
