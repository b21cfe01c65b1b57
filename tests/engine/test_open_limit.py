"""``max_sessions`` counts the sessions open now, whatever this engine served before (the check
keeps only the ids that may still be open, so an open costs O(open sessions): issue 23), with
the scripted FAKE stage ports."""

from __future__ import annotations

import asyncio

import pytest

from engine_bridge.messages import EngineConfig, SessionError
from tests.engine.test_engine_terminals import open_engine

LIMIT = EngineConfig(max_tokens=6, talker_max_tokens=4, flush_interval_s=0.005, max_sessions=2)


async def _refused(engine, session_id: str) -> str:
    with pytest.raises(SessionError) as caught:
        await engine.open_session(session_id)
    return caught.value.code


async def test_max_sessions_counts_what_is_open_now(tmp_path) -> None:
    engine = await open_engine(tmp_path, config=LIMIT)
    try:
        for n in range(5):  # sessions served and closed do not count
            await (await engine.open_session(f"done-{n}")).close()
        a = await engine.open_session("a")
        b = await engine.open_session("b")
        assert await _refused(engine, "c") == "max_sessions_reached"
        await a.close()
        c = await engine.open_session("c")
        assert await _refused(engine, "a") == "max_sessions_reached"  # a closed id reopened counts again
        await b.close()
        a2 = await engine.open_session("a")
        assert await _refused(engine, "d") == "max_sessions_reached"
        assert await _refused(engine, "c") == "session_exists"
        assert sorted(sid for sid, s in engine.sessions.items() if not s.closed) == ["a", "c"]
        await a2.close()
        await c.close()
    finally:
        await engine.aclose()


async def test_concurrent_opens_never_exceed_max_sessions(tmp_path) -> None:
    """An open awaits the store between its check and its entry in ``engine.sessions``: opens
    started together each hold a slot from the check on (hostile retest: 5 of 5 opened at
    max_sessions=2), and give it back when they end, opened or not."""
    engine = await open_engine(tmp_path, config=LIMIT)
    try:
        results = await asyncio.gather(*(engine.open_session(f"s{n}") for n in range(5)), return_exceptions=True)
        opened = [r for r in results if not isinstance(r, BaseException)]
        codes = [r.code for r in results if isinstance(r, SessionError)]
        assert (len(opened), codes) == (2, ["max_sessions_reached"] * 3)
        assert sum(not s.closed for s in engine.sessions.values()) == 2
        for session in opened:
            await session.close()
        # a same-id race: the loser fails session_exists and gives its slot back
        twins = await asyncio.gather(engine.open_session("x"), engine.open_session("x"), return_exceptions=True)
        assert [type(r).__name__ for r in twins if isinstance(r, BaseException)] == ["SessionError"]
        y = await engine.open_session("y")
        assert await _refused(engine, "z") == "max_sessions_reached"
        for session in [*(r for r in twins if not isinstance(r, BaseException)), y]:
            await session.close()
        assert engine._admitted == 0
    finally:
        await engine.aclose()
