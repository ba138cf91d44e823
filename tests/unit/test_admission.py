"""Admission is pure: a snapshot of the table in, a decision (or a refusal with the numbers) out."""
import math

import pytest

from minferd.pool.admission import Decision, TenantView, admit, demotable, evictable
from minferd.pool.ledger import PoolExhausted

NOW = 1000.0


def view(name, ws=None, pinned=False, idle=True, last_used=0.0, expires_at=0.0, own=10, set_bytes=100, w16=0):
    return TenantView(name, ws or name, pinned, idle, last_used, expires_at, own, set_bytes, w16)


def test_room_enough_decides_nothing():
    assert admit(50, 50, [view("a", w16=40)], NOW, "x") == Decision()


def test_demotes_least_recently_used_copies_first_and_no_more_than_needed():
    t = [view("new", w16=40, last_used=9), view("old", w16=40, last_used=1), view("mid", w16=40, last_used=5)]
    d = admit(70, 0, t, NOW, "x")
    assert d.demote == ("old", "mid") and d.unload == () and d.frees == 80


def test_a_shared_copy_is_demoted_once_and_only_when_every_user_is_idle_and_unpinned():
    a, b = view("a", ws="F", w16=40, last_used=1), view("b", ws="F", w16=40, last_used=3)
    assert [t.name for t in demotable([a, b])] == ["b"]  # one per set, aged by its newest user
    assert demotable([a, view("b", ws="F", w16=40, idle=False)]) == []
    assert demotable([a, view("b", ws="F", w16=40, pinned=True)]) == []


def test_unloads_idle_models_expired_first_and_counts_shared_weights_only_with_the_last_user():
    a = view("a", ws="F", own=10, set_bytes=100, last_used=5)
    b = view("b", ws="F", own=10, set_bytes=100, expires_at=math.inf, last_used=1)  # never expires, older
    d = admit(10, 0, [a, b], NOW, "x")
    assert d.unload == ("a",) and d.frees == 10  # the expired one first, though b is older; b keeps the weights
    d = admit(50, 0, [a, b], NOW, "loading c")
    assert d.unload == ("a", "b") and d.frees == 120
    with pytest.raises(PoolExhausted) as e:
        admit(121, 0, [a, b], NOW, "loading c")
    assert e.value.freeable == 120


def test_refusal_names_needed_free_and_freeable_and_decides_nothing():
    t = [view("pinned", pinned=True, w16=40), view("busy", idle=False, w16=40)]
    with pytest.raises(PoolExhausted) as e:
        admit(10, 5, t, NOW, "loading z")
    assert (e.value.needed, e.value.free, e.value.freeable) == (10, 5, 0)
    assert "loading z" in str(e.value) and "needs" in str(e.value)


def test_a_demoted_set_that_is_then_unloaded_is_not_counted_twice():
    t = [view("a", w16=40, set_bytes=140, own=10)]
    d = admit(150, 0, t, NOW, "x")
    assert d.demote == ("a",) and d.unload == ("a",) and d.frees == 40 + 10 + 100


def test_evictable_order_and_rules():
    t = [view("p", pinned=True), view("busy", idle=False), view("late", last_used=5), view("early", last_used=1),
         view("alive", expires_at=NOW + 5)]
    assert [x.name for x in evictable(t, NOW)] == ["early", "late"]
