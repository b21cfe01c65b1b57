"""events.gc_pause: the collector is off inside, back on after (errors included), and a
pause never turns on a collector its caller had turned off."""

from __future__ import annotations

import gc

import pytest

from events.gc_pause import gc_paused


def test_pause_turns_the_collector_off_and_back_on() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause did not turn it on under the outer one
    assert gc.isenabled()


def test_pause_turns_it_back_on_after_an_error() -> None:
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_pause_leaves_a_collector_the_caller_turned_off_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_decode_rows_and_fold_batch_run_paused_and_restore_it() -> None:
    from events.store.rows import StoredRow, decode_rows
    from projections.projector import Projector
    from projections.shell.readmodels import fold_batch
    from tests.events.test_structs import ROWS

    seen: list[bool] = []
    rows = [
        StoredRow(i + 1, r.stream_id, 1, r.event_id, r.type, r.schema_version, r.ts_us, 0, r.data)
        for i, r in enumerate(ROWS[:20])
    ]
    events = decode_rows(rows)
    assert gc.isenabled() and len(events) == 20

    class Watching(Projector):
        def apply(self, stored):  # type: ignore[no-untyped-def]
            seen.append(gc.isenabled())
            return super().apply(stored)

    fold_batch(Watching(), events)
    assert seen and not any(seen) and gc.isenabled()
