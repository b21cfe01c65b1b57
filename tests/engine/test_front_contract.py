"""The engine API a protocol front codes against (issue 21, research §5.6 G1, G3, G5, G7, G8,
G9), on a scripted FAKE engine: one ``error`` per refused command carrying the client's
``event_id``, a logged pure input clear, the rate of an audio append, shutdown ending running
answers ``close`` on the wire and in the log, and the front recorded on ``SessionOpened``."""

from __future__ import annotations

import io
import json

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import SessionError
from events.jsonl import export_to, import_rows, parse_lines
from events.store import EventStore
from projections.shell.runner import project_as_of
from reports.timeline import timeline_html
from tests.engine.test_engine_terminals import CONFIG, LONG, one_terminal_each, open_engine, until_delta
from tests.engine.test_session_rules import turn
from tests.fakes.fake_port import FakeStagePort


def errors_of(events):
    return [e.data for e in events if e.type == "error"]


async def refused(session, call, event_id):
    """Run ``call`` (a refused command); returns (the SessionError, the error events it put)."""
    session.drain_events()
    with pytest.raises(SessionError) as info:
        await call(event_id)
    return info.value, errors_of(session.drain_events())


# ------------------------------------------------------------------------------ G5, D14
async def test_every_refused_command_puts_exactly_one_error_with_its_event_id(tmp_path):
    engine = await open_engine(tmp_path, LONG)
    try:
        s = await engine.open_session("g5")
        stale = s.fence()  # epoch 0
        cases = [
            ("evt_commit", lambda e: s.commit(event_id=e), "input_audio_buffer_empty", None),
            ("evt_create", lambda e: s.create_response(event_id=e), "input_audio_buffer_empty", None),
            ("evt_text", lambda e: s.append_text("\ud800", event_id=e), "invalid_input", "text"),
            (
                "evt_rate",
                lambda e: s.append_audio(b"\0\0", sample_rate_hz=0, transcript="x", event_id=e),
                "invalid_input",
                "sample_rate_hz",
            ),
        ]
        for event_id, call, code, param in cases:
            exc, errors = await refused(s, call, event_id)
            assert (exc.code, exc.param) == (code, param)
            assert errors == [
                {"code": code, "message": exc.message, "event_id": event_id, **({"param": param} if param else {})}
            ]
        await s.append_text("Tell me a long story")
        await s.commit()
        await until_delta(s)
        exc, errors = await refused(s, lambda e: s.create_response(event_id=e), "evt_busy")
        assert exc.code == "conversation_already_has_active_response"
        assert [(d["code"], d["event_id"]) for d in errors] == [(exc.code, "evt_busy")]
        assert await s.barge_in()  # epoch 0 -> 1: the fence a client saw before is stale now
        exc, errors = await refused(s, lambda e: s.append_text("late", fence=stale, event_id=e), "evt_fence")
        assert (exc.code, exc.param) == ("stale_fence", "fence")
        assert [(d["code"], d["event_id"], d["param"]) for d in errors] == [("stale_fence", "evt_fence", "fence")]
        await s.close(event_id="evt_close")
        exc, errors = await refused(s, lambda e: s.commit(event_id=e), "evt_closed")
        assert exc.code == "session_closed"
        # the stream ended with session.closed: the caller gets the exception, the stream nothing
        # more (CASE-35: a fenced client is told once)
        assert errors == []
        p = await project_as_of(engine.store)
        assert p.leaks() == []
    finally:
        await engine.aclose()


async def test_a_cancel_that_finds_nothing_returns_false_and_one_error(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        s = await engine.open_session("idle")
        s.drain_events()
        assert await s.cancel_response(event_id="evt_1") is False
        assert await s.clear_output_audio(event_id="evt_2") is False
        assert await s.barge_in(event_id="evt_3") is False  # speech over silence: no error (nor below)
        assert await s.cancel_input(event_id="evt_4") is False
        errors = errors_of(s.drain_events())
        assert [(d["code"], d["event_id"]) for d in errors] == [("response_cancel_not_active", "evt_1")]
        await turn(s, "Still usable?")
        assert [e.type for e in s.drain_events() if e.type == "response.done"] == ["response.done"]
        await s.close()
    finally:
        await engine.aclose()


# ------------------------------------------------------------------------------ G1
class PromptRecorder(FakeStagePort):
    """The FAKE thinker, keeping every prompt it was given (what the model heard)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.prompts: list[str] = []

    def generate(self, request_id, prompt, params):
        self.prompts.append(prompt)
        return super().generate(request_id, prompt, params)


async def test_clear_input_drops_the_uncommitted_buffer_and_is_logged(tmp_path):
    ports = [PromptRecorder(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=CONFIG)
    try:
        s = await engine.open_session("clear")
        await s.append_text("forget this")
        await s.clear_input(event_id="evt_clear")
        assert [e.type for e in s.drain_events()][-1] == "input_audio_buffer.cleared"
        with pytest.raises(SessionError, match="input_audio_buffer_empty"):
            await s.commit()  # the buffer is empty
        # committed input awaiting response.create survives a clear of what came after it
        await s.append_text("keep this")
        assert await s.commit(create_response=False) == "COMMIT_ONLY"
        await s.append_text("but not this")
        await s.clear_input()
        await s.create_response()
        await s.wait_idle(10)
        (prompt,) = engine.ports[0].prompts
        assert "keep this" in prompt and "forget this" not in prompt and "not this" not in prompt
        await s.close()
        history = await engine.store.read_stream("clear")
        cleared = [h.event for h in history if h.event.type == "InputCleared"]
        assert [c.dropped_chunks for c in cleared] == [1, 1]
        assert "CancelRequested" not in {h.event.type for h in history}
        p = await project_as_of(engine.store)
        assert [t.finished_reason for t in p.turn_tables] == ["stop"]
        assert p.leaks() == []
        assert [f.kind for f in p.findings() if f.severity == "warning"] == ["command_rejected"]  # the empty commit
    finally:
        await engine.aclose()


async def test_clear_input_never_touches_a_running_response(tmp_path):
    engine = await open_engine(tmp_path, LONG)
    try:
        s = await engine.open_session("busy")
        await s.append_text("Tell me a long story")
        await s.commit()
        events = await until_delta(s)
        await s.append_text("mm")
        await s.clear_input()
        await s.wait_idle(10)
        events += s.drain_events()
        one_terminal_each(events)
        assert [(e.data["reason"]) for e in events if e.type == "response.done"] == ["stop"]
        assert not [e for e in events if e.type in ("response.cancelled", "error")]
        await s.close()
        p = await project_as_of(engine.store)
        assert [t.finished_reason for t in p.turn_tables] == ["stop"]
    finally:
        await engine.aclose()


async def test_a_cleared_append_is_not_the_next_turns_arrival_live_and_offline(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        s = await engine.open_session("arrival", auto_response=True)
        await s.append_text("dropped")
        await s.clear_input()
        await turn(s, "Hello there")
        await s.close()
        history = await engine.store.read_stream("arrival")
        appends = [h.event.ts for h in history if h.event.type == "InputAppended"]
        p = await project_as_of(engine.store)
        (table,) = p.turn_tables
        assert table.arrival_ts == appends[1]  # the kept append's, not the cleared one's
        (printed,) = engine.printed  # the engine's live fold of the same events says the same
        assert printed.arrival_ts == table.arrival_ts
    finally:
        await engine.aclose()


# ------------------------------------------------------------------------------ G7
async def test_audio_append_records_the_rate_the_client_gave(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        s = await engine.open_session("rate")
        pcm = b"\0\0" * 2400  # 2,400 samples: 100 ms at 24 kHz
        await s.append_audio(pcm, sample_rate_hz=24_000, transcript="hi")
        with pytest.raises(TypeError):
            await s.append_audio(pcm, transcript="hi")  # type: ignore[call-arg]  # no default rate
        await s.close()
        (appended,) = [h.event for h in await engine.store.read_stream("rate") if h.event.type == "InputAppended"]
        assert (appended.sample_rate_hz, appended.duration_ms) == (24_000, 100.0)
    finally:
        await engine.aclose()


# ------------------------------------------------------------------------------ G8, D13
@pytest.mark.parametrize("resumable", [False, True], ids=["ephemeral", "resident"])
async def test_shutdown_ends_a_running_answer_close_on_the_wire_and_in_the_log(tmp_path, resumable):
    engine = await open_engine(tmp_path, LONG, resumable=resumable)
    s = await engine.open_session("d13")
    await s.append_text("Tell me a long story")
    await s.commit()
    events = await until_delta(s)
    await engine.aclose()  # reason server_shutdown
    events += s.drain_events()
    one_terminal_each(events)
    terminal = [e for e in events if e.type in ("response.done", "response.cancelled")]
    assert [e.data.get("finished_reason", e.data.get("reason")) for e in terminal] == ["close"]
    assert events[-1].type == "session.closed" and events[-1].data["reason"] == "server_shutdown"
    assert events.index(terminal[0]) < len(events) - 1
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        p = await project_as_of(store)
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        assert p.leaks() == []
    finally:
        await store.close()


# ------------------------------------------------------------------------------ G9
async def test_the_front_is_recorded_on_session_opened_and_absent_otherwise(tmp_path):
    engine = await open_engine(tmp_path)
    try:
        front = await engine.open_session("front", protocol="realtime", connection_id="conn-1")
        plain = await engine.open_session("plain")
        for s in (front, plain):
            await turn(s, "Hello")
            await s.close()
        opened = {
            sid: h.event
            for sid in ("front", "plain")
            for h in await engine.store.read_stream(sid)
            if h.event.type == "SessionOpened"
        }
        assert (opened["front"].protocol, opened["front"].connection_id) == ("realtime", "conn-1")
        assert (opened["plain"].protocol, opened["plain"].connection_id) == (None, None)
        out = io.StringIO()
        await export_to(engine.store, out)
        lines = out.getvalue().splitlines()
        first = [json.loads(line) for line in lines if '"SessionOpened"' in line]
        assert [o["data"].get("protocol") for o in first] == ["realtime", None]
        copy = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/copy.db", create=True)
        try:
            result = await import_rows(copy, parse_lines(lines))
            assert result is not None
            again = io.StringIO()
            await export_to(copy, again)
            assert again.getvalue() == out.getvalue()  # bytes and hash chain survive the round trip
            html = timeline_html(await copy.read_stream("front"))
            assert "front" in html
        finally:
            await copy.close()
    finally:
        await engine.aclose()


def test_schema_of_the_new_fields():
    from events.types import json_schema

    text = json.dumps(json_schema())
    assert "InputCleared" in text and "connection_id" in text


# ------------------------------------------------------------------ concurrent open, one replica
async def test_two_concurrent_opens_of_one_id_on_one_replica_refuse_the_loser_as_session_exists(tmp_path):
    """Two sockets open the same session id at once on this replica: one wins, the other gets
    ``session_exists`` — never ``session_owned_elsewhere`` naming this replica itself."""
    import asyncio

    engine = await open_engine(tmp_path, CONFIG)
    try:
        for n in range(8):  # the race is won by either side; a few rounds cover the append conflict
            results = await asyncio.gather(
                engine.open_session(f"dup-{n}"), engine.open_session(f"dup-{n}"), return_exceptions=True
            )
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(refused) == 1, results
            assert isinstance(refused[0], SessionError) and refused[0].code == "session_exists", refused[0]
    finally:
        await engine.aclose()


# ------------------------------------------------------------------ reopen while the close settles
async def test_an_open_while_the_previous_close_settles_waits_for_that_close(tmp_path):
    """SessionClosed is folded (``closed`` is true) before the close's aborts and their results
    are recorded; an open of the same id in that window (a reconnect right after a drop) waits
    for the close instead of starting the next incarnation beside it (FAKE ports, slowed aborts:
    without the wait the old close's AbortResult lands after the new SessionOpened and the
    audit shows the id leaked)."""
    import asyncio

    from tests.waiting import eventually

    class SlowAbortPort(FakeStagePort):
        async def abort(self, request_ids):
            if request_ids:
                await asyncio.sleep(0.3)
            await super().abort(request_ids)

    ports = [SlowAbortPort(0, "thinker", token_delay_s=0.002), SlowAbortPort(1, "talker", token_delay_s=0.002)]
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=LONG)
    try:
        old = await engine.open_session("settle")
        await old.append_text("Tell me a long story")
        await old.commit()
        await until_delta(old)
        closing = asyncio.create_task(old.close("disconnect"))
        await eventually(lambda: old.closed)
        assert not closing.done()  # the window: closed, the abort still in flight
        new = await engine.open_session("settle")
        assert closing.done() and new.state.incarnation == 1
        await new.close()
        history = [s.event for s in await engine.store.read_stream("settle")]
        kinds = [e.type for e in history]
        assert kinds.index("AbortResult") < kinds.index("SessionOpened", 1)
        p = await project_as_of(engine.store)
        assert p.leaks() == []
    finally:
        await engine.aclose()


async def test_a_closed_session_stays_closed_when_its_id_is_reopened(tmp_path):
    """The next incarnation continues the previous one's fold (issue 23: one fold per event);
    the old Session object must not read the new incarnation's state as its own: it stays
    closed and refuses commands ``session_closed`` (FAKE ports)."""
    engine = await open_engine(tmp_path, LONG)
    try:
        old = await engine.open_session("again")
        await old.close()
        new = await engine.open_session("again")
        assert old.closed and not new.closed
        with pytest.raises(SessionError) as info:
            await old.append_text("hello")
        assert info.value.code == "session_closed"
        await new.append_text("hello")  # the new incarnation is untouched by the refusal
        await new.close()
        kinds = [s.event.type for s in await engine.store.read_stream("again")]
        assert kinds.count("InputAppended") == 1 and kinds.count("SessionOpened") == 2
    finally:
        await engine.aclose()
