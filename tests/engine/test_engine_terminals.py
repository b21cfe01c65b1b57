"""DOMAIN §5.7 on the session engine, with a scripted FAKE engine: the engine's own logs audit
with no warning (D9: its ResponseEnded + TurnFinalized pair, its close order and its cancels
are one terminal each), one terminal client event per ``response.created`` (D14), an
engine-initiated abort finalizes ``abort`` (D11), shutdown is ``close`` (D13), and a live
session with log_stats off holds no turn state (M14)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.plugin import TextPlugin
from projections.shell.runner import project_as_of
from tests.engine.test_session_rules import turn
from tests.fakes.fake_port import FakeStagePort
from tests.metrics.test_metrics_live_offline import samples

CONFIG = EngineConfig(max_tokens=6, talker_max_tokens=4, flush_interval_s=0.005)
LONG = EngineConfig(max_tokens=400, talker_max_tokens=4, flush_interval_s=0.005)  # ~0.8 s per answer
TERMINALS = {"response.done", "response.cancelled"}


async def open_engine(tmp_path, config=CONFIG, resumable=False, name="ledger"):
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]
    return await SessionEngine.open(
        f"sqlite+aiosqlite:///{tmp_path}/{name}.db", ports, config=config, plugin=TextPlugin(resumable=resumable)
    )


async def until_delta(session):
    seen = []
    while not any(e.type == "response.text.delta" for e in seen):
        seen += session.drain_events()
        await asyncio.sleep(0.001)
    return seen


def one_terminal_each(events) -> Counter:
    """response_id -> number of terminal client events; every created response has one."""
    created = [e.data["response_id"] for e in events if e.type == "response.created"]
    terminals = Counter(e.data["response_id"] for e in events if e.type in TERMINALS)
    assert {r: terminals[r] for r in created} == {r: 1 for r in created}, (created, terminals)
    return terminals


@pytest.mark.parametrize("resumable", [False, True], ids=["ephemeral", "resident"])
async def test_engine_logs_audit_without_warnings(tmp_path, resumable):
    engine = await open_engine(tmp_path, LONG, resumable=resumable)
    short = await open_engine(tmp_path, CONFIG, resumable=resumable, name="short")
    try:
        s = await short.open_session("plain")
        await turn(s, "Hello")
        await turn(s, "Thanks")
        await s.close()
        s = await short.open_session("listener", auto_response=True)
        await turn(s, "mm-hmm")
        await turn(s, "Tell me a joke please")
        await s.close()
        for name, action in (("barge", "barge_in"), ("cancel", "cancel_response"), ("clear", "clear_output_audio")):
            s = await engine.open_session(name)
            await s.append_text("Tell me a long story")
            await s.commit()
            await until_delta(s)
            assert await getattr(s, action)()
            await s.close()
        s = await engine.open_session("closer")
        await s.append_text("Count slowly")
        await s.commit()
        await until_delta(s)
        await s.close("disconnect")
        for eng in (engine, short):
            p = await project_as_of(eng.store)
            assert p.leaks() == []
            assert [f for f in p.findings() if f.severity == "warning"] == []
    finally:
        await engine.aclose()
        await short.aclose()


async def test_one_terminal_client_event_per_response(tmp_path):
    engine = await open_engine(tmp_path, LONG)
    try:
        s = await engine.open_session("d14")
        await s.append_text("Tell me a long story")
        await s.commit()
        events = await until_delta(s)
        await s.barge_in()
        await s.append_text("ok then")
        await s.commit()
        events += await until_delta(s)
        await s.cancel_response()
        assert not await s.cancel_response()  # nothing left to cancel: an error, not silence
        events += s.drain_events()
        assert [e.data["code"] for e in events if e.type == "error"] == ["response_cancel_not_active"]
        terminals = one_terminal_each(events)
        assert len(terminals) == 2
        reasons = [e.data["finished_reason"] for e in events if e.type == "response.cancelled"]
        assert reasons == ["barge_in", "cancel"]
        await s.close()
    finally:
        await engine.aclose()


async def test_response_done_carries_the_engine_finish_reason(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        s = await engine.open_session("len")
        await turn(s, "Say a lot")  # max_tokens=6 truncates the fake reply
        events = s.drain_events()
        one_terminal_each(events)
        (done,) = [e for e in events if e.type == "response.done"]
        assert (done.data["reason"], done.data["finish_reason"]) == ("stop", "length")
        await s.close()
    finally:
        await engine.aclose()


@pytest.mark.parametrize("resumable", [False, True], ids=["ephemeral", "resident"])
async def test_engine_initiated_abort_finalizes_abort(tmp_path, resumable):
    engine = await open_engine(tmp_path, LONG, resumable=resumable)
    try:
        s = await engine.open_session("d11")
        await s.append_text("Tell me a long story")
        await s.commit()
        events = await until_delta(s)
        request_id = s.active.request_id
        await engine.ports[0].abort([request_id])  # the engine's own abort, behind the session's back
        await s.wait_idle(10)
        events += s.drain_events()
        (done,) = [e for e in events if e.type == "response.done"]
        assert (done.data["reason"], done.data["finish_reason"]) == ("abort", "abort")
        await turn(s, "Are you still there?")  # the session stays usable
        events += s.drain_events()
        one_terminal_each(events)
        await s.close()
        p = await project_as_of(engine.store)
        assert [t.finished_reason for t in p.turn_tables] == ["abort", "stop"]
        assert p.leaks() == []
        assert [f.kind for f in p.findings() if f.severity == "warning"] == []
    finally:
        await engine.aclose()


async def test_shutdown_with_a_running_response_is_close(tmp_path):
    engine = await open_engine(tmp_path, LONG)
    s = await engine.open_session("d13")
    await s.append_text("Tell me a long story")
    await s.commit()
    await until_delta(s)
    await engine.aclose()  # reason server_shutdown
    from events.store import EventStore

    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        p = await project_as_of(store)
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        assert p.leaks() == []
    finally:
        await store.close()


async def test_log_stats_off_session_prints_and_holds_no_table_but_is_counted(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        quiet = await engine.open_session("quiet", log_stats=False)
        loud = await engine.open_session("loud")
        for s in (quiet, loud):
            await turn(s, "Hello")
        # One fold per event (issue 23): the session's fold is the one the Prometheus families
        # count, so it builds the quiet session's turn too; nothing of it is printed or held (M14).
        assert quiet.log.on_turn is None and quiet.log._unprinted == []
        assert "loud" in loud.log.projector.turns.sessions
        exposed = samples(engine.metrics.exposition())
        stop = (("finished_reason", "stop"), ("model_name", engine.model_name))
        assert exposed[("vllm_omni:requests_success_total", stop)] == 2  # both sessions' turns counted
        await loud.log.flush()  # a turn is printed once the events that finalized it are durable
        assert [t.session_id for t in engine.printed] == ["loud"]
        for s in (quiet, loud):
            await s.close()
        p = await project_as_of(engine.store)
        assert sorted(t.session_id for t in p.turn_tables) == ["loud", "quiet"]  # offline builds both
    finally:
        await engine.aclose()
