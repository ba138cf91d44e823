"""backend/l2_ahead.py's plan: each decode launch's prefetch window is the stretch of the weight
stream `distance` bytes past its own, wrapping into the next token's first matrices, cut at the
matrices' edges into 16-byte-aligned pieces; and mmvq's check of the pieces it is given."""
from __future__ import annotations

import pytest

from minferd.backend.l2_ahead import AheadPlan, distance_from_valve
from minferd.kernels.mmvq import MAX_AHEAD, check_ahead

# Three launches' matrices (pointer, bytes): a q/k/v group of three, an o, a gate/up pair.
ORDER = [[(0x10000, 4096), (0x20000, 1024), (0x30000, 1024)], [(0x40000, 4096)], [(0x50000, 8192), (0x60000, 8192)]]
TOTAL = sum(n for launch in ORDER for _, n in launch)


def planned(distance: int) -> AheadPlan:
    plan = AheadPlan(distance)
    plan.order = [list(launch) for launch in ORDER]
    plan.plan()
    return plan


def test_each_launch_reads_its_own_size_that_far_ahead():
    plan = planned(6144)
    assert plan.planned and not plan.recording
    # q/k/v: stream [0, 6144) -> [6144, 12288): all of o, then the first 2048 bytes of gate
    assert plan.windows[0x10000] == ((0x40000, 4096), (0x50000, 2048))
    # o: [6144, 10240) -> [12288, 16384): gate's bytes 2048..6144
    assert plan.windows[0x40000] == ((0x50000 + 2048, 4096),)


def test_the_last_launch_wraps_into_the_next_token():
    plan = planned(6144)
    # gate/up: [10240, 26624) -> [16384, 32768) mod 26624: gate's last 2048, all of up, then the
    # stream's first 6144 (q, k, v: of the five pieces MAX_AHEAD are kept)
    assert plan.windows[0x50000] == ((0x50000 + 6144, 2048), (0x60000, 8192), (0x10000, 4096))[:MAX_AHEAD]


def test_pieces_are_aligned_inside_their_matrices():
    order = [[(0x1008, 1000)], [(0x2000, 999)], [(0x3000, 4000)]]
    plan = AheadPlan(100)
    plan.order = order
    plan.plan()
    for pieces in plan.windows.values():
        for p, n in pieces:
            assert p % 16 == 0 and n % 16 == 0 and n > 0
            assert any(q <= p and p + n <= q + m for q, m in (s for launch in order for s in launch))


def test_a_distance_past_the_stream_wraps():
    assert planned(TOTAL + 6144).windows == planned(6144).windows


def test_an_empty_stream_plans_nothing():
    plan = AheadPlan(1 << 20)
    plan.plan()
    assert plan.planned and plan.windows == {}


def test_the_valve(monkeypatch):
    monkeypatch.delenv("MINFERD_L2_AHEAD", raising=False)
    assert distance_from_valve() == 0
    monkeypatch.setenv("MINFERD_L2_AHEAD", "16")
    assert distance_from_valve() == 16 << 20
    for bad in ("-1", "1.5", "lots", "99999"):
        monkeypatch.setenv("MINFERD_L2_AHEAD", bad)
        with pytest.raises(ValueError, match="MINFERD_L2_AHEAD"):
            distance_from_valve()


def test_check_ahead_names_the_bad_piece():
    assert len(check_ahead(())) == 2 * MAX_AHEAD
    assert [int(a) for a in check_ahead([(0x1000, 32)])] == [0x1000, 32] + [0, 0] * (MAX_AHEAD - 1)
    for bad in ([(0x1008, 32)], [(0x1000, 24)], [(0, 32)], [(0x1000, -16)], [(0x1000, 16)] * (MAX_AHEAD + 1)):
        with pytest.raises(ValueError, match="prefetch"):
            check_ahead(bad)
