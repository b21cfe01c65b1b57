"""Realtime GA conformance on the FAKE engine, driven by the official ``openai`` SDK: every raw
frame validated strictly (tests/realtime/wire.py), the wire invariants checked, then the
ledger (research/realtime.md §6.2)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from websockets.exceptions import ConnectionClosed

from events import ids
from events.store.store import EventStore
from projections.shell.runner import project_as_of
from tests.realtime.conftest import LONG, REPLY, SHORT, fake_engine, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.wire import Wire

TEXT_TURN = ["conversation.item.added", "conversation.item.done"]
RESPONSE_OPEN = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
]


def user_text(text: str, event_id: str | None = None) -> dict:
    event = {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }
    if event_id:
        event["event_id"] = event_id
    return event


async def one_turn(wire: Wire, text: str) -> dict:
    start = len(wire.frames)
    await wire.send(user_text(text))
    await wire.send({"type": "response.create"})
    done = await wire.until("response.done")
    kinds = [f["type"] for f in wire.frames[start:]]
    assert kinds[:2] == TEXT_TURN and kinds[2:6] == RESPONSE_OPEN, kinds
    return done


async def test_two_turn_text_conversation(engine, state, client):
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-text"}) as conn:
        wire = Wire(conn)
        created = await wire.recv()
        assert created["type"] == "session.created" and created["session"]["x_duplex_ledger"]["incarnation"] == 0
        await wire.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        updated = await wire.until("session.updated")
        assert updated["session"]["output_modalities"] == ["text"]
        first = await one_turn(wire, "Hello, who are you?")
        second = await one_turn(wire, "And what can you do?")
        wire.check()
        for done in (first, second):
            assert done["response"]["status"] == "completed"
            assert done["response"]["output"][0]["content"][0]["type"] == "output_text"
        r0, r1 = first["response"]["id"], second["response"]["id"]
        assert r0 != r1 and r0.startswith("resp-rt-text-0-") and r1.startswith("resp-rt-text-0-")
        assert len(wire.of_type("response.output_text.delta")) >= 2
        assert not wire.of_type("response.output_audio.delta")
    assert await settled_ledger(state, "rt-text") == ["stop", "stop"]
    history = await engine.store.read_stream("rt-text")
    begun = [s.event.response_id for s in history if s.event.type == "ResponseBegun"]
    assert begun == [r0, r1]  # the wire ids are the ledger's
    submitted = [s.event.request_id for s in history if s.event.type == "StageRequestSubmitted"]
    assert submitted[:2] == [ids.mint_ephemeral("rt-text", 0, 0, 0), ids.mint_ephemeral("rt-text", 0, 0, 1)]
    (opened,) = [s.event for s in history if s.event.type == "SessionOpened"]
    assert opened.protocol == "realtime" and opened.connection_id.startswith("ws-")  # G9
    closed = [s.event for s in history if s.event.type == "SessionClosed"]
    assert [c.reason for c in closed] == ["session_close"]  # the SDK's close() (1000): the client ended it


async def test_two_turn_audio_mode(engine, state, port):
    client = sdk_client(port)
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-audio"}) as conn:
        wire = Wire(conn)
        await wire.recv()
        await wire.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}})
        await wire.until("session.updated")
        for text in ("Hello there", "Tell me more"):
            done = await one_turn(wire, text)
            assert done["response"]["status"] == "completed"
            assert done["response"]["output"][0]["content"][0]["type"] == "output_audio"
        wire.check()
        audio = [base64.b64decode(f["delta"]) for f in wire.of_type("response.output_audio.delta")]
        assert audio and all(len(chunk) % 960 == 0 for chunk in audio)
        assert wire.of_type("response.output_audio_transcript.delta")
        assert not wire.of_type("response.output_text.delta")
    assert await settled_ledger(state, "rt-audio") == ["stop", "stop"]


async def test_truncated_and_failed_responses(tmp_path):
    """``length`` -> GA ``incomplete``/``max_output_tokens``; a turn the engine fails ->
    ``error`` then ``response.done`` ``failed`` carrying that error (D14)."""
    truncating = await fake_engine(tmp_path / "a", SHORT)  # no scripted reply: runs to max_tokens
    failing = await fake_engine(tmp_path / "b", SHORT, REPLY, max_model_len=3)
    try:
        apps = make_app(truncating), make_app(failing)
        async with serve_app(truncating, app=apps[0]) as port:
            async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "t"}) as c:
                wire = Wire(c)
                await wire.recv()
                done = await one_turn(wire, "Go on and on")
                assert done["response"]["status"] == "incomplete"
                assert done["response"]["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
                wire.check()
        async with serve_app(failing, app=apps[1]) as port:
            async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "f"}) as c:
                wire = Wire(c)
                await wire.recv()
                await wire.send(user_text("This prompt is far too long"))
                await wire.send({"type": "response.create", "event_id": "rc"})
                error = (await wire.until("error"))["error"]
                assert (error["code"], error["type"]) == ("prompt_too_long", "invalid_request_error")
                done = await wire.until("response.done")
                assert done["response"]["status"] == "failed"
                assert done["response"]["status_details"]["error"]["code"] == "prompt_too_long"
                wire.check()
        assert await settled_ledger(apps[0].state.realtime, "t") == ["stop"]
        assert await settled_ledger(apps[1].state.realtime, "f") == ["error"]
    finally:
        await truncating.aclose()
        await failing.aclose()


async def test_server_shutdown_under_a_response(tmp_path):
    """``engine.aclose()`` with a response running: the client gets its ``response.done``
    (``failed``, ``session_closed``), then close 1001; the log says ``close`` (D13)."""
    engine = await fake_engine(tmp_path, LONG)
    closed = False
    try:
        async with serve_app(engine) as port:
            async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "s"}) as c:
                wire = Wire(c)
                await wire.recv()
                await wire.send(user_text("Tell me a long story"))
                await wire.send({"type": "response.create"})
                await wire.until("response.output_audio_transcript.delta")
                shutdown = asyncio.create_task(engine.aclose())
                done = await wire.until("response.done")
                assert done["response"]["status"] == "failed"
                assert done["response"]["status_details"]["error"]["code"] == "session_closed"
                with pytest.raises(ConnectionClosed) as info:
                    await wire.recv()
                assert info.value.rcvd.code == 1001
                wire.check()
                await asyncio.wait_for(shutdown, 15)
                closed = True
    finally:
        if not closed:
            await engine.aclose()
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        p = await project_as_of(store)
        assert p.leaks() == [] and [t.finished_reason for t in p.turn_tables] == ["close"]
        history = [s.event for s in await store.read_stream("s")]
        assert [e.reason for e in history if e.type == "SessionClosed"] == ["server_shutdown"]
    finally:
        await store.close()


async def test_a_frame_over_15_mib_is_refused_and_the_session_goes_on(engine, state, client):
    """The default limit (GA's 15 MiB per event plus the envelope): the front answers, not the
    transport (no 1009 close), and nothing reaches the ledger."""
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-big"}) as conn:
        wire = Wire(conn)
        await wire.recv()
        audio = "A" * (state.options.max_frame_bytes + 1)
        await conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "event_id": "big", "audio": audio}))
        error = (await wire.until("error", timeout_s=30))["error"]
        assert error["code"] == "event_too_large" and error["event_id"] is None  # never parsed
        done = await one_turn(wire, "Still fine?")
        assert done["response"]["status"] == "completed"
        wire.check()
    assert await settled_ledger(state, "rt-big") == ["stop"]
    history = [s.event for s in await engine.store.read_stream("rt-big")]
    assert [e.input_kind for e in history if e.type == "InputAppended"] == ["text"]
