"""SessionLog buffering on a real SQLite file: buffered events of many sessions sharing one
FlushTicker commit together, within the interval, in order; durable emits stay write-ahead."""

from __future__ import annotations

import asyncio

import pytest

from engine_bridge.session_log import FlushTicker, SessionLog, SessionLogBroken
from events.store.store import EventStore
from events.types import InputAppended, TurnCommitted
from tests.waiting import eventually


def _appended(sid: str, ts: float) -> InputAppended:
    return InputAppended(session_id=sid, ts=ts, input_kind="text", text="hi", size_bytes=2)


async def test_shared_ticker_commits_all_sessions_buffered_events_in_one_transaction(sqlite_url: str) -> None:
    store = await EventStore.open(sqlite_url, create=True, synchronous="NORMAL")
    transactions: list[int] = []
    recorder = store.recorder
    write_in = recorder.write_in

    def counting(conn, calls, *args):  # type: ignore[no-untyped-def]
        transactions.append(len(calls))  # write_in runs once per append transaction
        return write_in(conn, calls, *args)

    recorder.write_in = counting  # type: ignore[method-assign]
    try:
        ticker = FlushTicker(0.3)
        logs = [SessionLog(store, f"s{i}", 0, ticker=ticker) for i in range(8)]
        for i, log in enumerate(logs):  # sessions buffer at different moments (a timer each would fire 8 times)
            log.emit_later(_appended(log.session_id, 1.0 + i))
            log.emit_later(_appended(log.session_id, 2.0 + i))
            await asyncio.sleep(0.01)
        assert await store.head_position() == 0  # buffered, not yet written
        await eventually(lambda: all(log.version == 2 for log in logs))  # the tick, however late
        assert transactions == [8]  # one transaction holding every session's append call
        for log in logs:
            i = int(log.session_id[1:])
            assert [e.event.ts for e in await store.read_stream(log.session_id)] == [1.0 + i, 2.0 + i]
        # A durable emit writes what is buffered before it, then itself, at once.
        logs[0].emit_later(_appended("s0", 3.0))
        await logs[0].emit(TurnCommitted(session_id="s0", ts=4.0, turn_id=0))
        assert [e.event.type for e in await store.read_stream("s0")][-2:] == ["InputAppended", "TurnCommitted"]
        await ticker.aclose()
    finally:
        await store.close()


class _HeldStore:
    """A FAKE store whose appends wait for ``release`` and then succeed or raise ``fail``."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.release = asyncio.Event()
        self.fail = fail
        self.appended: list[str] = []

    async def append(self, stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        self.appended += [e.type for e in events]
        return list(range(len(events)))


async def _items(n: int, closed: list[bool]):  # type: ignore[no-untyped-def]
    try:
        for i in range(n):
            yield i
    finally:
        closed.append(True)


async def test_gated_hands_nothing_on_before_the_pipelined_intent_commits() -> None:
    store = _HeldStore()
    log = SessionLog(store, "s", 0)  # type: ignore[arg-type]
    log.emit_ahead(TurnCommitted(session_id="s", ts=1.0, turn_id=0))  # returns at once
    got: list[int] = []
    closed: list[bool] = []

    async def read() -> None:
        async for item in log.gated(_items(3, closed)):
            got.append(item)

    reader = asyncio.get_running_loop().create_task(read())
    await asyncio.sleep(0.05)
    assert got == [] and store.appended == []  # the item is held while the commit is pending
    store.release.set()
    await reader
    assert got == [0, 1, 2] and store.appended == ["TurnCommitted"] and closed == [True]


async def test_gated_closes_the_stream_and_raises_when_the_intent_commit_fails() -> None:
    store = _HeldStore(fail=OSError("disk full"))
    log = SessionLog(store, "s", 0)  # type: ignore[arg-type]
    log.emit_ahead(TurnCommitted(session_id="s", ts=1.0, turn_id=0))
    closed: list[bool] = []
    store.release.set()
    got: list[int] = []
    with pytest.raises(SessionLogBroken, match="disk full"):
        async for item in log.gated(_items(3, closed)):
            got.append(item)
    assert got == [] and closed == [True]


@pytest.mark.parametrize("fail", [None, OSError("disk full")])
async def test_a_turn_is_printed_only_once_the_events_that_finalized_it_are_durable(fail) -> None:
    """What the live engine prints (on_turn) is what the log holds: a turn's tables are handed
    on after the append that holds its finalizing events commits, and never if it fails."""
    from tests.logbuilder import LogBuilder, eph

    x0 = eph("s", 0)
    b = LogBuilder()
    b.add("SessionOpened", "s", 1.0)
    b.add("TurnCommitted", "s", 2.0, turn_id=0, response_id="resp-0", create_response=True)
    b.add("StageRequestSubmitted", "s", 2.01, stage_id=0, request_id=x0, num_tokens_in=5)
    b.add("ResponseBegun", "s", 2.02, response_id="resp-0", turn_id=0, request_id=x0)
    b.add("StageOutput", "s", 2.1, stage_id=0, request_id=x0, num_new_tokens=3)
    b.add("ResponseEnded", "s", 2.4, response_id="resp-0", cause="model")
    store = _HeldStore(fail)
    printed: list[str] = []
    log = SessionLog(store, "s", 0, on_turn=lambda t: printed.append(t.response_id))  # type: ignore[arg-type]
    log.emit_later(*b.events)
    flushing = asyncio.ensure_future(log.flush())
    await asyncio.sleep(0.01)
    assert printed == []  # finalized in the fold, not yet durable: not printed
    store.release.set()
    if fail is None:
        await flushing
        assert printed == ["resp-0"] and "ResponseEnded" in store.appended
    else:
        with pytest.raises(OSError):
            await flushing
        assert printed == []  # never recorded: never printed


async def test_a_fenced_log_writes_nothing_more(tmp_path) -> None:
    """Issue 14 fencing: what a fenced session buffered is dropped (never flushed by the
    clock), and any later emit is refused."""
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/f.db", create=True)
    try:
        log = SessionLog(store, "s", 0, ticker=FlushTicker(0.01))
        log.emit_later(_appended("s", 1.0))
        log.fence("the lease was lost")
        await asyncio.sleep(0.05)  # several ticks
        await log.flush()
        assert await store.head_position() == 0
        with pytest.raises(SessionLogBroken, match="fenced out: the lease was lost"):
            log.emit_later(_appended("s", 2.0))
    finally:
        await store.close()


async def test_writes_asked_for_while_one_commits_are_served_in_order_by_one_append(sqlite_url: str) -> None:
    """Issue 23: a log's writes chain on the store's append future (no lock, no task): one
    append at a time, each expecting the version the one before left; what is emitted while
    one commits goes out in ONE later append, in order; a cancelled waiter stops no write."""
    store = await EventStore.open(sqlite_url, create=True, synchronous="NORMAL")
    appends: list[list[float]] = []
    append = store.append

    def counted(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
        appends.append([e.ts for e in events])
        return append(stream_id, events, expected_version=expected_version)

    store.append = counted  # type: ignore[method-assign]
    try:
        log = SessionLog(store, "s", 0)
        first = asyncio.ensure_future(log.emit(_appended("s", 1.0)))  # its append starts now
        await asyncio.sleep(0)
        second = asyncio.ensure_future(log.emit(_appended("s", 2.0)))
        cancelled = asyncio.ensure_future(log.emit(_appended("s", 3.0)))
        await asyncio.sleep(0)
        cancelled.cancel()  # its waiter goes; its events are written all the same
        log.emit_ahead(_appended("s", 4.0))
        await asyncio.gather(first, second)
        await log.durable()
        assert cancelled.cancelled()
        await log.flush()
        assert appends == [[1.0], [2.0, 3.0], [4.0]] or appends == [[1.0], [2.0, 3.0, 4.0]], appends
        assert [e.event.ts for e in await store.read_stream("s")] == [1.0, 2.0, 3.0, 4.0]
        assert log.version == log.events_written == 4 and log.appends == len(appends)
    finally:
        await store.close()


async def test_a_failed_write_fails_its_waiters_and_the_next_emit_is_refused() -> None:
    """The append's failure reaches every waiter of the write (the queued ones too) and
    breaks the log: nothing later is recorded."""
    store = _HeldStore(OSError("disk full"))
    log = SessionLog(store, "s", 0)  # type: ignore[arg-type]
    log.emit_later(_appended("s", 1.0))
    first = asyncio.ensure_future(log.flush())
    await asyncio.sleep(0.01)
    log.emit_later(_appended("s", 2.0))
    queued = asyncio.ensure_future(log.flush())  # asked for while the first append waits
    await asyncio.sleep(0.01)
    store.release.set()
    with pytest.raises(OSError, match="disk full"):
        await first
    with pytest.raises(OSError, match="disk full"):
        await queued
    with pytest.raises(SessionLogBroken, match="disk full"):
        log.emit_later(_appended("s", 3.0))
    assert store.appended == [] and log.version == 0


async def test_a_cancelled_durable_reader_does_not_cancel_the_pipelined_commit() -> None:
    """A reader waiting in ``durable()`` (a gated engine stream) that is cancelled leaves the
    intent's commit running: a later reader finds it durable."""
    store = _HeldStore()
    log = SessionLog(store, "s", 0)  # type: ignore[arg-type]
    log.emit_ahead(TurnCommitted(session_id="s", ts=1.0, turn_id=0))
    reader = asyncio.ensure_future(log.durable())
    await asyncio.sleep(0.01)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    later = asyncio.ensure_future(log.durable())
    await asyncio.sleep(0.01)
    assert not later.done()  # still waiting for the commit, which was not cancelled
    store.release.set()
    await later
    assert store.appended == ["TurnCommitted"] and log.version == 1 and log._ahead is None
