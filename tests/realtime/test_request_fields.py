"""Fields a newcomer with the ``openai`` SDK sets (research §5.1): ``response.create``'s
``metadata`` is the client's and is echoed on the response object; ``max_output_tokens`` is
the engine's fixed budget, shown as the effective value, with an ``error`` when another one was
asked for; a ``response.create`` after audio without transcript says why there is no input.
All on the FAKE engine (tests/fakes), through a real WebSocket client (the SDK)."""

from __future__ import annotations

import base64

import pytest

from tests.realtime.conftest import SHORT, sdk_client
from tests.realtime.fakes import tone_chunk
from tests.realtime.ledger import settled_ledger
from tests.realtime.test_conformance import user_text
from tests.realtime.wire import Wire


async def _open(conn) -> Wire:
    wire = Wire(conn)
    created = await wire.recv()
    assert created["type"] == "session.created"
    return wire


async def test_response_metadata_is_echoed_merged_with_the_servers_keys(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-meta"}) as c:
        wire = await _open(c)
        await wire.send(user_text("Hello"))
        metadata = {"k": "v", "finished_reason": "mine", "turn": "1"}
        await wire.send({"type": "response.create", "response": {"metadata": metadata}})
        created = await wire.until("response.created")
        assert created["response"]["metadata"] == metadata
        done = await wire.until("response.done")
        # the client's keys, the server's win a collision (they say what happened)
        assert done["response"]["metadata"] == {
            "k": "v",
            "turn": "1",
            "finished_reason": "stop",
            "finish_reason": "stop",
        }
        # the next response without metadata carries only the server's keys, as before
        await wire.send(user_text("Again"))
        await wire.send({"type": "response.create"})
        assert "metadata" not in (await wire.until("response.created"))["response"]
        done = await wire.until("response.done")
        assert done["response"]["metadata"] == {"finished_reason": "stop", "finish_reason": "stop"}
        wire.check()
    assert await settled_ledger(state, "rt-meta") == ["stop", "stop"]


async def test_a_client_reason_key_never_reaches_response_done(engine, state, port):
    """The server's reason keys are its alone, also where this ending sets no such key: a
    completed response sets no wire_reason, so a client's would read as the server's."""
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-spoof"}) as c:
        wire = await _open(c)
        await wire.send(user_text("Hello"))
        metadata = {"k": "v", "wire_reason": "turn_detected", "finished_reason": "barge_in"}
        await wire.send({"type": "response.create", "response": {"metadata": metadata}})
        assert (await wire.until("response.created"))["response"]["metadata"] == metadata
        done = await wire.until("response.done")
        assert done["response"]["metadata"] == {"k": "v", "finished_reason": "stop", "finish_reason": "stop"}
        wire.check()
    assert await settled_ledger(state, "rt-spoof") == ["stop"]


async def test_a_cancelled_response_drops_a_client_finish_reason(long_engine, long_state, long_port):
    """A cancel sets finished_reason and wire_reason but no finish_reason: a client's
    ``finish_reason: stop`` on a cancelled response would contradict its status."""
    async with sdk_client(long_port).realtime.connect(
        model="duplex-ledger", extra_query={"session_id": "rt-spoof-cancel"}
    ) as c:
        wire = await _open(c)
        await wire.send(user_text("Hello"))
        await wire.send({"type": "response.create", "response": {"metadata": {"finish_reason": "stop", "k": "v"}}})
        await wire.until("response.created")
        await wire.send({"type": "response.cancel"})
        done = await wire.until("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["metadata"] == {
            "k": "v",
            "finished_reason": "cancel",
            "wire_reason": "client_cancelled",
        }
        wire.check()
    assert await settled_ledger(long_state, "rt-spoof-cancel") == ["cancel"]


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
        ["k", "v"],
    ],
)
async def test_bad_response_metadata_is_refused_with_no_response(engine, state, port, metadata):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-badm"}) as c:
        wire = await _open(c)
        await wire.send(user_text("Hello"))
        await wire.send(
            {"type": "response.create", "event_id": "r1", "response": {"metadata": metadata}}, refused="invalid_value"
        )
        error = await wire.error_for("r1")
        assert error["error"]["param"] == "response.metadata"
        # the limits themselves are accepted, and the session goes on
        ok = {f"k{i}": "v" * 512 for i in range(15)} | {"k" * 64: ""}
        await wire.send({"type": "response.create", "response": {"metadata": ok}})
        assert (await wire.until("response.done"))["response"]["metadata"]["k" * 64] == ""
        assert len(wire.of_type("response.created")) == 1
        wire.check()
    assert await settled_ledger(state, "rt-badm") == ["stop"]


async def test_session_shows_the_effective_max_output_tokens(engine, state, port):
    effective = SHORT.max_tokens
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-max"}) as c:
        wire = await _open(c)
        assert wire.frames[0]["session"]["max_output_tokens"] == effective
        await wire.send(
            {"type": "session.update", "event_id": "u1", "session": {"type": "realtime", "max_output_tokens": 8}},
            refused="fixed_by_server",
        )
        error = await wire.error_for("u1")
        assert error["error"]["param"] == "session.max_output_tokens"
        assert "fixed by the server" in error["error"]["message"] and str(effective) in error["error"]["message"]
        updated = await wire.until("session.updated")
        assert updated["session"]["max_output_tokens"] == effective
        # asking for the effective value is no error; other fields of the update are applied
        await wire.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "max_output_tokens": effective, "output_modalities": ["text"]},
            }
        )
        updated = await wire.until("session.updated")
        assert updated["session"]["output_modalities"] == ["text"] and len(wire.of_type("error")) == 1
        # a value GA refuses refuses the whole update
        await wire.send(
            {
                "type": "session.update",
                "event_id": "u3",
                "session": {"type": "realtime", "max_output_tokens": 0, "output_modalities": ["audio"]},
            },
            refused="invalid_value",
        )
        assert (await wire.error_for("u3"))["error"]["param"] == "session.max_output_tokens"
        await wire.send(user_text("Hello"))
        await wire.send(
            {"type": "response.create", "event_id": "r1", "response": {"max_output_tokens": "inf"}},
            refused="fixed_by_server",
        )
        assert (await wire.error_for("r1"))["error"]["param"] == "response.max_output_tokens"
        created = await wire.until("response.created")
        assert created["response"]["max_output_tokens"] == effective
        assert created["response"]["output_modalities"] == ["text"]  # the refused update changed nothing
        done = await wire.until("response.done")
        assert done["response"]["max_output_tokens"] == effective
        wire.check()
    assert await settled_ledger(state, "rt-max") == ["stop"]


async def test_response_after_audio_without_transcript_names_the_cause(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-notr"}) as c:
        wire = await _open(c)
        await wire.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(tone_chunk(3)).decode()})
        await wire.send({"type": "input_audio_buffer.commit"})
        await wire.until("conversation.item.input_audio_transcription.failed")
        await wire.send({"type": "response.create", "event_id": "r1"}, refused="input_audio_buffer_empty")
        message = (await wire.error_for("r1"))["error"]["message"]
        assert "no transcript" in message and "input_audio" in message and "'transcript'" in message
        # with nothing committed at all, the engine's own message stays
        await wire.send(user_text("Hello"))
        await wire.send({"type": "response.create"})
        await wire.until("response.done")
        await wire.send({"type": "response.create", "event_id": "r2"}, refused="input_audio_buffer_empty")
        assert (await wire.error_for("r2"))["error"]["message"] == "no committed input"
        wire.check()
    assert await settled_ledger(state, "rt-notr") == ["stop"]
    history = [s.event for s in await engine.store.read_stream("rt-notr")]
    rejected = [e for e in history if e.type == "CommandRejected"]
    assert [e.error_code for e in rejected] == ["input_audio_buffer_empty"] * 2
