"""Field cases CASE-26 (idempotent append: retries, partial overlaps, ids reused across streams)
and CASE-27 (failed appends burn no position; a follower never stalls or skips), on both
backends, with the right answers of ``../shared/cases/CASE-26.md`` / ``CASE-27.md``."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from events.store import EventStore
from events.store.errors import ConcurrencyError, EventIdConflict
from events.types import InputAppended, SessionOpened


def ia(sid: str, ts: float, eid: str | None = None) -> InputAppended:
    kw = {"event_id": eid} if eid else {}
    return InputAppended(session_id=sid, ts=ts, size_bytes=3200, **kw)


async def test_case_26_idempotent_append(db_url):
    st = await EventStore.open(db_url, create=True)
    try:
        a, b, c, d, e = (str(uuid.UUID(int=i)) for i in (0xA1, 0xB2, 0xC3, 0xD4, 0xE5))
        await st.append("S1", [SessionOpened(session_id="S1", ts=1.0)], expected_version=0)
        assert await st.append("S1", [ia("S1", 2.0, a), ia("S1", 2.1, b)], expected_version=1) == [2, 3]
        assert await st.append("S1", [ia("S1", 2.0, a), ia("S1", 2.1, b)], expected_version=1) == [2, 3]  # lost ack
        assert await st.append("S1", [ia("S1", 2.0, a), ia("S1", 2.1, b)]) == [2, 3]
        with pytest.raises(EventIdConflict):  # partial overlap: nothing written
            await st.append("S1", [ia("S1", 3.0, c), ia("S1", 2.1, b), ia("S1", 3.1, d)])
        await st.append("S2", [SessionOpened(session_id="S2", ts=1.0)], expected_version=0)
        with pytest.raises(EventIdConflict):  # an id of another stream
            await st.append("S2", [ia("S2", 2.0, a)])
        with pytest.raises(ValueError):  # an id twice in one batch
            await st.append("S1", [ia("S1", 4.0, c), ia("S1", 4.1, c)])
        results = await asyncio.gather(
            st.append("S1", [ia("S1", 5.0, e)], expected_version=3),
            st.append("S1", [ia("S1", 5.0, e)], expected_version=3),
        )
        assert results == [[5], [5]]
        s1 = [(x.version, str(x.event.event_id), x.position) for x in await st.read_stream("S1")]
        assert [(v, i) for v, i, _ in s1][1:] == [(2, a), (3, b), (4, e)]
        assert [x.position for x in await st.read_stream("S2")] == [4]
        assert await st.head_position() == 5
    finally:
        await st.close()


async def test_case_27_failed_appends_leave_no_hole(db_url):
    st = await EventStore.open(db_url, create=True)
    try:
        for s in ("S1", "S2", "S3"):
            await st.append(s, [SessionOpened(session_id=s, ts=1.0)], expected_version=0)
        taken = str(uuid.UUID(int=0x77))
        await st.append("S3", [ia("S3", 1.5, taken)])
        seen: list[int] = []

        async def follow() -> None:
            async for event in st.subscribe(from_position=1, poll_interval=0.02):
                seen.append(event.position)

        follower = asyncio.create_task(follow())
        calls = []
        for k in range(60):
            s = ("S1", "S2")[k % 2]
            if k % 3 == 0:
                calls.append(("stale", st.append(s, [ia(s, 2.0 + k / 100)], expected_version=0)))
            elif k % 5 == 0:
                calls.append(("conflict", st.append(s, [ia(s, 2.0 + k / 100), ia(s, 2.0 + k / 100, taken)])))
            else:
                calls.append(("ok", st.append(s, [ia(s, 2.0 + k / 100), ia(s, 2.0 + k / 100 + 0.001)])))
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        outcome = {"stale": ConcurrencyError, "conflict": EventIdConflict}
        ok_positions: list[int] = []
        for (want, _), result in zip(calls, results):
            if want == "ok":
                assert not isinstance(result, BaseException), result
                ok_positions += result
            else:
                assert isinstance(result, outcome[want]), (want, result)
        assert sum(w == "stale" for w, _ in calls) == 20 and sum(w == "conflict" for w, _ in calls) == 8
        head = await st.head_position()
        assert head == 68 and sorted(ok_positions) == list(range(5, 69))
        assert [x.position async for x in st.read_all()] == list(range(1, 69))
        assert await st.append("S1", [ia("S1", 9.0)]) == [69]
        for _ in range(200):
            if len(seen) >= 69:
                break
            await asyncio.sleep(0.02)
        follower.cancel()
        assert seen == list(range(1, 70))
        assert (await st.stream_version("S1"), await st.stream_version("S2")) == (34, 33)
    finally:
        await st.close()
