"""SessionLog buffering on a real SQLite file: buffered events of many sessions sharing one
FlushTicker commit together, within the interval, in order; durable emits stay write-ahead."""

from __future__ import annotations

import asyncio

from engine_bridge.session_log import FlushTicker, SessionLog
from events.store.store import EventStore
from events.types import InputAppended, TurnCommitted


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
        await asyncio.sleep(0.5)
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
