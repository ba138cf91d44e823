"""kernels/chain.cu (bench/chain_probe.py's persistent chain of mat-vecs): every op's output is
bit-identical to its own mmvq launch (the same mmvq_rows instance over the same CTA index), in
each mode and with the capped kernel, on a grid far smaller than the items (CTAs come back for
more) and one larger (ticket dispatch) or as large as the device holds at once (static); the plan refuses what the kernel cannot run.
stream_read (the probe's floor: bytes read and nothing else) reads each segment to its end."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import chain  # noqa: E402
from minferd.kernels import mmvq as mv  # noqa: E402
from minferd.kernels.launch import sm_count  # noqa: E402
from minferd.kernels.quant import by_name  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import poisoned  # noqa: E402

K = 512
# (type, rows): a chain of groups as a decode layer has them, rows that leave partial items
GROUPS = [[("Q4_K", 300), ("Q4_K", 64)], [("Q6_K", 37)], [("Q4_K", 1000), ("Q4_K", 1000)], [("Q6_K", 300)],
          [("Q4_K", 2000)]]


def _setup():
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal((1, K), dtype=np.float32))
    s = cp.empty(mv.scratch_bytes(1, K), cp.uint8)
    mv.quantize_x(x, s)
    ops, refs, cnt = [], [], 0
    for g in GROUPS:
        t = g[0][0]
        cfg = mv.CONFIGS[t][1][mv.shape_class(max(r for _, r in g), K)]
        for _, rows in g:
            w = cp.asarray(random_blocks(by_name(t), rows, K, rng))
            ref = cp.empty((1, rows), cp.float32)
            mv.mmvq(t, w, x, ref, scratch=s, x_quantized=True, config=cfg)
            ops.append(chain.ChainOp(t, cfg, w, poisoned((1, rows), cp.float32), s, cnt, cnt - 1 if cnt else None))
            refs.append(ref.get())
        cnt += 1
    return ops, refs


@pytest.mark.parametrize("capped", [False, True])
@pytest.mark.parametrize("mode", list(chain.MODES))
@pytest.mark.parametrize("dispatch,grid", [("ticket", 3), ("ticket", 4000), ("static", 3), ("static", "full")])
def test_chain_is_each_launch_bit_for_bit(mode, capped, dispatch, grid):
    ops, refs = _setup()
    table = chain.plan(ops)
    state = cp.zeros(1 + chain.counters(table), cp.int32)
    if grid == "full":
        grid = sm_count(0) * chain.ctas_per_sm(capped)
    chain.run(cp.asarray(table.view(np.uint8)), table, mode, state[:1], state[1:], grid, capped, dispatch)
    for op, ref in zip(ops, refs):
        assert np.array_equal(op.out.get(), ref), (op.qt, op.w.shape)
    # every item counted once, in its group's counter (bare: none); a ticket chain ran its ticket past the last item
    need = [int(sum(table["items"][table["cnt"] == c])) for c in range(chain.counters(table))]
    assert state[1:].get().tolist() == (need if mode != "bare" else [0] * len(need))
    assert int(state[0].get()) >= chain.total_items(table) if dispatch == "ticket" else int(state[0].get()) == 0


def test_static_dispatch_refuses_a_grid_the_device_cannot_hold_at_once():
    ops, _ = _setup()
    table = chain.plan(ops)
    state = cp.zeros(1 + chain.counters(table), cp.int32)
    most = sm_count(0) * chain.ctas_per_sm(False)
    with pytest.raises(ValueError, match=f"more than the {most} the device holds"):
        chain.run(cp.asarray(table.view(np.uint8)), table, "wait", state[:1], state[1:], most + 1, False, "static")
    with pytest.raises(ValueError, match="dispatch 'round'"):
        chain.run(cp.asarray(table.view(np.uint8)), table, "wait", state[:1], state[1:], 3, False, "round")
    assert not state.any() and all(np.isnan(op.out.get()).all() for op in ops)  # nothing ran


def test_plan_refuses_what_the_kernel_cannot_run():
    ops, _ = _setup()
    with pytest.raises(ValueError, match="no kind for Q4_K"):
        chain.plan([chain.ChainOp("Q4_K", (8, 8, 1, 1), ops[0].w, ops[0].out, ops[0].scratch, 0)])
    with pytest.raises(ValueError, match="which no earlier op"):
        chain.plan([chain.ChainOp(ops[0].qt, ops[0].config, ops[0].w, ops[0].out, ops[0].scratch, 0, wait=1)])
    with pytest.raises(ValueError, match="out must be"):
        chain.plan([chain.ChainOp(ops[0].qt, ops[0].config, ops[0].w, cp.empty((2, 300), cp.float32),
                                  ops[0].scratch, 0)])
    with pytest.raises(ValueError, match="no ops"):
        chain.plan([])


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("sizes", [(40005,), (16 * 1024, 48), (1000 * 16, 7 * 16, 70000 * 16)])
def test_stream_read_reads_every_segment_to_its_last_word(early, sizes):
    """stream_read (chain_probe.py's floor) keeps its loads: a thread whose words fold to 1 stores,
    so a 1 planted in a segment's first or last whole word shows that word was read, and no store
    comes from zeros; a tail under 16 bytes is skipped, as the launcher says."""
    ws = [cp.zeros(n, cp.uint8) for n in sizes]
    sink = cp.zeros(2, cp.uint32)
    chain.stream_read(ws, sink, early)
    assert int(sink[1]) == 0
    for i, w in enumerate(ws):
        for at in (0, w.nbytes // 16 * 16 - 16):
            w[at] = 1
            chain.stream_read(ws, sink, early)
            assert int(sink[1]) == 1, f"segment {i} of {sizes}: its word at byte {at} was not read"
            w[at] = 0
            sink[1] = 0
        if w.nbytes % 16:
            w[-1] = 1
            chain.stream_read(ws, sink, early)
            assert int(sink[1]) == 0, f"segment {i} of {sizes}: its tail was read"
            w[-1] = 0


def test_stream_read_refuses_what_it_cannot_read():
    sink = cp.zeros(2, cp.uint32)
    w = cp.zeros(64, cp.uint8)
    with pytest.raises(ValueError, match="1 to 3"):
        chain.stream_read([w] * 4, sink)
    with pytest.raises(ValueError, match="16-byte"):
        chain.stream_read([w[1:33]], sink)
    with pytest.raises(ValueError, match="uint8"):
        chain.stream_read([cp.zeros(16, cp.float32)], sink)
    with pytest.raises(ValueError, match="sink"):
        chain.stream_read([w], cp.zeros(2, cp.int32))
    with pytest.raises(ValueError, match="CTAs"):
        chain.stream_read([w[:8]], sink)
