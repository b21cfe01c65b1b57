"""The live path's critical-path and CPU changes of issue 15: the Stage0 engine call is made
inside ``commit()``'s own step (engine_bridge.eager.start_eagerly), and what a running turn
records is held until its next intent or its end instead of being flushed on every tick of the
clock. The engines are scripted FAKE ports (tests.fakes.fake_port)."""

from __future__ import annotations

import asyncio

import pytest

from engine_bridge.eager import start_eagerly
from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.session_log import FlushTicker, SessionLog
from events import ids
from events.store.store import EventStore
from events.types import InputAppended
from tests.fakes.fake_port import FakeStagePort
from tests.waiting import eventually


async def test_start_eagerly_runs_the_first_step_before_returning() -> None:
    order: list[str] = []

    async def work() -> int:
        order.append("first step")
        await asyncio.sleep(0.001)
        order.append("rest")
        return 7

    async def boom() -> None:
        raise ValueError("refused")

    done = start_eagerly(work())
    order.append("returned")
    assert order == ["first step", "returned"]
    assert await done == 7 and order[-1] == "rest"
    with pytest.raises(ValueError, match="refused"):
        await start_eagerly(boom())  # the first step's exception is the future's, not raised at start

    pending = start_eagerly(work())
    await asyncio.sleep(0)
    pending.cancel()  # thrown into the awaitable where it waits
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert order.count("rest") == 1


@pytest.mark.parametrize("resident", [False, True])
async def test_stage0_engine_call_is_made_before_commit_returns(tmp_path, resident: bool) -> None:
    from engine_bridge.plugin import TextPlugin

    ports = [FakeStagePort(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]
    config = EngineConfig(max_tokens=4, talker_max_tokens=2, ignore_eos=True, flush_interval_s=0.01)
    plugin = TextPlugin(resumable=True) if resident else TextPlugin()
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/e.db", ports, config=config) as engine:
        s = await engine.open_session("s", plugin=plugin)
        await s.append_text("hello")
        await s.commit()
        rid = ids.mint_resident("s", 0, 0) if resident else ids.mint_ephemeral("s", 0, 0, 0)
        assert ports[0].live_request_ids() == {rid}  # no loop pass in between
        await s.wait_idle(5)
        await s.close()


async def test_a_running_turns_records_commit_with_its_next_intent_or_at_its_end(tmp_path) -> None:
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.01), FakeStagePort(1, "talker", token_delay_s=0.01)]
    # Each stage streams for ~0.2 s: ~20 ticks of a 0.01 s clock.
    config = EngineConfig(max_tokens=20, talker_max_tokens=20, ignore_eos=True, flush_interval_s=0.01)
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/h.db", ports, config=config) as engine:
        appends: list[list[str]] = []
        append = engine.store.append

        async def counted(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
            appends.append([e.type for e in events])
            return await append(stream_id, events, expected_version=expected_version)

        engine.store.append = counted  # type: ignore[method-assign]
        s = await engine.open_session("s")
        await s.append_text("hello")
        appends.clear()
        await s.commit()
        await s.wait_idle(5)
        await eventually(lambda: not s.log._pending and not s.log._writing)  # the end-of-turn flush
        outputs = sum(batch.count("StageOutput") for batch in appends)
        assert outputs >= 4  # coalesced per window, both stages
        assert len(appends) <= 4, appends  # submit intent, forward intent, the turn's end (+ a tick)
        assert s.log.events_written == s.log.version == len(await engine.store.read_stream("s"))
        assert not s.log._pending
        await s.close()


async def test_held_events_are_flushed_once_max_held_wait(sqlite_url: str) -> None:
    store = await EventStore.open(sqlite_url, create=True, synchronous="NORMAL")
    try:
        log = SessionLog(store, "s", 0, ticker=FlushTicker(0.01))
        log.max_held = 3

        def appended(ts: float) -> InputAppended:
            return InputAppended(session_id="s", ts=ts, input_kind="text", text="x", size_bytes=1)

        log.emit_held(appended(1.0), appended(2.0))
        await asyncio.sleep(0.05)
        assert await store.head_position() == 0  # held: no clock asked for
        log.emit_held(appended(3.0))

        async def stored_ts() -> list[float]:
            return [e.event.ts for e in await store.read_stream("s")]

        await eventually(lambda: log.version == 3)  # the next tick, however late it comes
        assert await stored_ts() == [1.0, 2.0, 3.0]
        log.emit_held(appended(4.0))
        log.release_held()  # the turn ended
        await eventually(lambda: log.version == 4)
        assert (await stored_ts())[-1] == 4.0
    finally:
        await store.close()
