"""Which objects of a model loaded outside the pool outlive it on CUDA: the backend, the model, the
arena and its buffer, after the collector runs, and the local pool's bytes in use; for the buffer,
who still refers to it. s30 (H100): the first three went, yet each load kept 679 MiB (its arena's
buffer) in the pool; LocalModel.close() gives it back.

    python bench/leak_probe.py MODEL.gguf"""
import gc, sys, weakref, types
sys.path.insert(0, '.')
from minferd.model.loader import load_local
from minferd.backend.batch import Batch
from minferd.backend.cuda_memory import DeviceMemory

def chain(obj, depth=0, seen=None):
    seen = seen if seen is not None else set()
    if depth > 5:
        return
    for r in gc.get_referrers(obj):
        if id(r) in seen or r is seen or isinstance(r, types.FrameType):
            continue
        seen.add(id(r))
        desc = type(r).__name__
        if isinstance(r, dict):
            keys = [k for k, v in r.items() if v is obj][:3]
            desc += f" keys={keys}"
        print("  " * depth + "<-", desc, str(r)[:100].replace("\n", " "))
        if depth < 5 and not isinstance(r, (list,)) or depth < 2:
            chain(r, depth + 1, seen)

def run(path, graph):
    lm = load_local(sys.argv[1], path, device="cuda", ctx=256)
    m, be = lm.model, lm.model.be
    cache = m.new_cache(be.untracked(), 5 * 32)
    tables = [[0, 1], [2, 3]]
    m.forward_batch(Batch.build([(list(range(1, 20)), 0, tables[0]), (list(range(3, 30)), 0, tables[1])], 32), cache)
    if graph:
        be.to_host(be.decode(m, Batch.build([([5], 19, tables[0]), ([6], 27, tables[1])], 32, width=8), cache))
    return weakref.ref(be), weakref.ref(m), weakref.ref(be.arena), weakref.ref(be._arena_buf)

for path in ("mmq", "w16"):
    for graph in (False, True):
        refs = run(path, graph)
        gc.collect()
        print(path, "graph" if graph else "eager", "alive (be, model, arena, buffer):", [r() is not None for r in refs],
              "pool used", DeviceMemory.local().pool.used_bytes() >> 20, "MiB")
        if refs[0]() is not None:
            chain(refs[0]())
        for i, what in ((2, "arena"), (3, "buffer")):
            if refs[i]() is not None and refs[0]() is None:
                print(f" {what}'s referrers:")
                chain(refs[i]())
