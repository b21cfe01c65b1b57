"""engine_bridge.heap: what is alive when a serving process has started leaves the collector's
passes; cyclic garbage of the startup is collected first, not frozen."""

from __future__ import annotations

import gc
import weakref

from engine_bridge.heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_the_startup_heap_is_frozen_after_its_garbage_is_collected():
    alive = [_Node()]  # tracked by the collector, reachable
    cycle = _Node()
    cycle.peer = _Node()
    cycle.peer.peer = cycle
    garbage = weakref.ref(cycle)
    del cycle  # unreachable cycle: only a collection frees it
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 0
        assert garbage() is None  # collected before the freeze, not kept alive in it
        assert not any(o is alive for o in gc.get_objects())  # no generation holds it any more
    finally:
        gc.unfreeze()  # the test process keeps collecting as before
    assert any(o is alive for o in gc.get_objects())
