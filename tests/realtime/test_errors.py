"""Bad input on the wire (research §5.5, §6.2 scenario 5): each gets a GA ``error`` echoing the
client's event_id (and ``param``), the socket stays open, the next turn works, and the log holds
only what the rules decided (refusals of engine commands as ``CommandRejected``; nothing for a
frame the front refused)."""

from __future__ import annotations

import base64
import json

import pytest

from events import ids
from realtime.connection import ConnectionOptions
from realtime.protocol import client_message
from tests.realtime.conftest import REPLY, SHORT, fake_engine, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.test_conformance import one_turn, user_text
from tests.realtime.wire import Wire

SMALL_FRAMES = ConnectionOptions(max_frame_bytes=64 * 1024)

# (client event, error code, param)
FRONT_REFUSALS = [
    ({"type": "no.such.event"}, "unknown_event", "type"),
    ({"type": "conversation.item.delete", "item_id": "x"}, "unsupported_event", "type"),
    ({"type": "barge_in"}, "unknown_event", "type"),  # an extension without ?duplex=1
    ({"type": "session.close"}, "unknown_event", "type"),
    ({"type": "input_audio_buffer.append", "audio": "%%%not base64"}, "invalid_audio", "audio"),
    (
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()},
        "invalid_audio",
        "audio",
    ),
    ({"type": "input_audio_buffer.append", "audio": ""}, "invalid_audio", "audio"),
    ({"type": "input_audio_buffer.append"}, "invalid_audio", "audio"),
    # idle: the engine's refusal (logged CommandRejected, as the idle cancel below), naming the field
    ({"type": "response.cancel", "response_id": "resp-nope"}, "response_cancel_not_active", "response_id"),
    ({"type": "output_audio_buffer.clear"}, "response_cancel_not_active", None),
    (
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        },
        "unsupported_audio_format",
        "session.audio.input.format.type",
    ),
    (
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        },
        "unsupported_audio_format",
        "session.audio.output.format.rate",
    ),
    (
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
        },
        "unsupported_turn_detection",
        "session.audio.input.turn_detection",
    ),
    (
        {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text", "audio"]}},
        "unsupported_session_update",
        "session.output_modalities",
    ),
    (
        {"type": "session.update", "session": {"type": "realtime", "x_duplex_ledger": {"mode": "auto_response"}}},
        "unsupported_session_update",
        "session.x_duplex_ledger.mode",
    ),
    (
        {"type": "session.update", "session": {"type": "realtime", "x_duplex_ledger": {"resumable": True}}},
        "unsupported_session_update",
        "session.x_duplex_ledger.resumable",
    ),
    (
        {"type": "conversation.item.create", "item": {"type": "message", "role": "assistant", "content": []}},
        "unsupported_item",
        "item.role",
    ),
    (  # pipecat's LLMMessagesAppendFrame: instructions are fixed, the log has no role (research §5.2)
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
        },
        "unsupported_item",
        "item.role",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_image"}]},
        },
        "unsupported_item",
        "item.content[0]",
    ),
]


@pytest.fixture
def options() -> ConnectionOptions:
    return SMALL_FRAMES


async def test_every_bad_event_is_an_error_and_the_session_goes_on(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-err"}) as conn:
        wire = Wire(conn)
        await wire.recv()
        await wire.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await wire.until("session.updated")
        # frames that are no event at all: no event_id to echo
        for raw, code, param in [
            ("not json", "invalid_json", None),
            ("[1, 2]", "bad_event", None),
            ('{"event_id": "e-no-type"}', "bad_event", "type"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 70_000}), "event_too_large", None),
        ]:
            await conn.send_raw(raw)
            wire.sent_ids.add("e-no-type")
            error = (await wire.until("error"))["error"]
            assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
            # an object that names an event_id has it echoed even when its type is missing
            assert error["event_id"] == ("e-no-type" if raw.startswith('{"event_id"') else None)
        for n, (event, code, param) in enumerate(FRONT_REFUSALS):
            await wire.send({**event, "event_id": f"bad-{n}"}, refused=code)
            error = (await wire.error_for(f"bad-{n}"))["error"]
            assert (error["code"], error["param"]) == (code, param), event
        # refusals the engine decides (logged as CommandRejected)
        await wire.send(
            {"type": "input_audio_buffer.commit", "event_id": "empty-commit"}, refused="input_audio_buffer_empty"
        )
        await wire.error_for("empty-commit")
        await wire.send(
            {"type": "response.create", "event_id": "nothing-committed"}, refused="input_audio_buffer_empty"
        )
        await wire.error_for("nothing-committed")
        await wire.send({"type": "response.cancel", "event_id": "idle-cancel"}, refused="response_cancel_not_active")
        await wire.error_for("idle-cancel")
        # a text the ledger could not store (a lone surrogate, D12) in the item's SECOND part:
        # the whole item is refused, naming the part, and its first part is not appended either
        await conn.send_raw(
            '{"type": "conversation.item.create", "event_id": "surrogate", "item": {"type": '
            '"message", "role": "user", "content": [{"type": "input_text", "text": "LEFTOVER words"}, '
            '{"type": "input_text", "text": "a\\ud800b"}]}}'
        )
        wire.sent_ids.add("surrogate")
        wire.refused_ids["surrogate"] = "invalid_input"
        error = (await wire.error_for("surrogate"))["error"]
        assert (error["code"], error["param"]) == ("invalid_input", "item.content[1].text")
        await wire.send(
            {"type": "input_audio_buffer.commit", "event_id": "after-refused-item"}, refused="input_audio_buffer_empty"
        )
        await wire.error_for("after-refused-item")
        await wire.send(user_text("Hello there"))
        await wire.send({"type": "response.create", "event_id": "first"})
        await wire.send(
            {"type": "response.create", "event_id": "second"}, refused="conversation_already_has_active_response"
        )
        await wire.error_for("second")
        await wire.until("response.done")
        done = await one_turn(wire, "Still there?")  # the next turn works
        assert done["response"]["status"] == "completed"
        wire.check()
    assert await settled_ledger(state, "rt-err") == ["stop", "stop"]
    history = [s.event for s in await engine.store.read_stream("rt-err")]
    assert [e.error_code for e in history if e.type == "CommandRejected"] == [
        "response_cancel_not_active",  # the idle response.cancel naming a response_id
        "input_audio_buffer_empty",
        "input_audio_buffer_empty",
        "response_cancel_not_active",
        "input_audio_buffer_empty",
        "conversation_already_has_active_response",
    ]
    assert [e.text for e in history if e.type == "InputAppended"] == ["Hello there", "Still there?"]


async def test_session_update_answers_the_effective_config(engine, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-upd"}) as conn:
        wire = Wire(conn)
        created = (await wire.recv())["session"]
        assert created["output_modalities"] == ["audio"] and created["audio"]["input"]["turn_detection"] is None
        assert created["x_duplex_ledger"]["output_audio"] == "stand_in"
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Talk like a pirate",
                "output_modalities": ["text"],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}},
            }
        )
        updated = (await wire.until("session.updated"))["session"]
        assert updated["output_modalities"] == ["text"]
        assert updated["instructions"] == engine.config.system_prompt  # not pretended changed
        assert updated["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        wire.check()


async def test_a_failed_turn_names_the_response_never_the_engine_request_id(tmp_path):
    """``prompt_too_long`` (the thinker's port refuses the prompt): the ``error`` and the
    failed ``response.done`` name the response the client knows, never the engine's request
    id (DOMAIN §1 grammar, ``duplex-s.…``), which stays in the ledger's ``CommandRejected``."""
    failing = await fake_engine(tmp_path, SHORT, REPLY, max_model_len=3)
    try:
        app = make_app(failing)
        async with serve_app(failing, app=app) as port:
            async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "f"}) as c:
                wire = Wire(c)
                await wire.recv()
                await wire.send(user_text("This prompt is far too long"))
                await wire.send({"type": "response.create", "event_id": "rc"})
                response_id = (await wire.until("response.created"))["response"]["id"]
                error = (await wire.until("error"))["error"]
                done = (await wire.until("response.done"))["response"]
                wire.check()
        told = [error["message"], done["status_details"]["error"]["message"]]
        assert error["code"] == "prompt_too_long" and told[0] == told[1]
        assert ids.PREFIX not in told[0] and f"response {response_id!r}" in told[0], told[0]
        assert "over max_model_len 3" in told[0]  # the engine's reason is kept
        rejected = [s.event for s in await failing.store.read_stream("f") if s.event.type == "CommandRejected"]
        assert [e.error_code for e in rejected] == ["prompt_too_long"]
        assert rejected[0].request_id is not None and rejected[0].request_id in rejected[0].message
    finally:
        await failing.aclose()


@pytest.mark.parametrize(
    ("message", "response_id", "told"),
    [
        (
            "stage 0 (thinker) request 'duplex-s.Zg.i.0.e.2.r.stage0': engine dead",
            "resp_1",
            "stage 0 (thinker) request of response 'resp_1': engine dead",
        ),
        ("stage 1 (talker) request 'duplex-s.Zg.i.0.e.0.r.stage1_t3': lost", None, "stage 1 (talker) request: lost"),
        (
            "abort of duplex-s.Zg.e.1.r.stage0 and duplex-s.Zg.i.1.e.0.r.stage0 failed.",
            None,
            "abort of an engine request and an engine request failed.",
        ),
        ("nothing appended since the last commit", "resp_1", "nothing appended since the last commit"),
    ],
)
def test_client_message_replaces_every_engine_request_id(message, response_id, told):
    assert client_message(message, response_id) == told
