"""What a standard client is told about its response (research/realtime.md §1.3, §5.1):
``response.done.response.usage`` is the engine's own token counts of that response (the
ledger's, also for a cancelled one); ``response.create``'s per-response overrides are honoured
(``output_modalities``), told ``fixed_by_server`` (``instructions``, ``max_output_tokens``) or
refused naming the ``param`` — never answered silently with the session's values; a number
with a fractional part of zero is that integer. On the FAKE engine (tests/fakes), through a
real WebSocket client (the ``openai`` SDK); every frame is validated strictly against the
SDK's GA models (:class:`tests.realtime.wire.Wire`)."""

from __future__ import annotations

import pytest
from openai.types.realtime import RealtimeResponseUsage

from engine_bridge.messages import EngineConfig
from realtime.protocol import ProtocolError
from realtime.request_fields import FIXED_BY_SERVER, max_output_tokens_notice
from realtime.usage import response_usage
from tests.realtime.conftest import SHORT, fake_engine, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.test_conformance import user_text
from tests.realtime.wire import Wire


async def _open(conn) -> Wire:
    wire = Wire(conn)
    assert (await wire.recv())["type"] == "session.created"
    return wire


async def _answering(conn) -> Wire:
    """The opened session's wire once a long answer streams (its first transcript delta)."""
    wire = await _open(conn)
    await wire.send(user_text("Tell me a long story"))
    await wire.send({"type": "response.create"})
    await wire.until("response.output_audio_transcript.delta")
    return wire


async def _ledger_tokens(engine, session_id: str, response_id: str) -> dict[str, int]:
    """What the log holds of ``response_id``'s request: Stage0's prompt tokens as submitted and
    each stage's output tokens (sum of ``StageOutput.num_new_tokens``)."""
    history = [s.event for s in await engine.store.read_stream(session_id)]
    (request_id,) = [e.request_id for e in history if e.type == "ResponseBegun" and e.response_id == response_id]
    (tokens_in,) = [
        e.num_tokens_in
        for e in history
        if e.type == "StageRequestSubmitted" and e.request_id == request_id and e.stage_id == 0
    ]
    out = {0: 0, 1: 0}
    for e in history:
        if e.type == "StageOutput" and e.request_id == request_id:
            out[e.stage_id] += e.num_new_tokens
    return {"in": tokens_in, "text": out[0], "audio": out[1]}


def _expected_usage(tokens: dict[str, int]) -> dict:
    return {
        "total_tokens": tokens["in"] + tokens["text"] + tokens["audio"],
        "input_tokens": tokens["in"],
        "input_token_details": {"text_tokens": tokens["in"], "audio_tokens": 0},
        "output_tokens": tokens["text"] + tokens["audio"],
        "output_token_details": {"text_tokens": tokens["text"], "audio_tokens": tokens["audio"]},
    }


# ---------------------------------------------------------------------------------- usage
async def test_usage_of_a_completed_response_is_the_engines_token_counts(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-use"}) as c:
        wire = await _open(c)
        dones = []
        for text in ("Hello", "And again, with more words this time"):
            await wire.send(user_text(text))
            await wire.send({"type": "response.create"})
            dones.append((await wire.until("response.done"))["response"])
        wire.check()
    assert await settled_ledger(state, "rt-use") == ["stop", "stop"]
    for done in dones:
        tokens = await _ledger_tokens(engine, "rt-use", done["id"])
        assert tokens["text"] > 0 and tokens["audio"] > 0  # both stages spoke: the counts are not vacuous
        assert done["usage"] == _expected_usage(tokens)
    # the second prompt holds the first turn (history): more input tokens, as the log says
    assert dones[1]["usage"]["input_tokens"] > dones[0]["usage"]["input_tokens"]


async def test_a_cancelled_response_carries_the_usage_produced_so_far(long_engine, long_state, long_port):
    async with sdk_client(long_port).realtime.connect(
        model="duplex-ledger", extra_query={"session_id": "rt-use-cancel"}
    ) as c:
        wire = await _answering(c)
        await wire.send({"type": "response.cancel"})
        done = (await wire.until("response.done"))["response"]
        assert done["status"] == "cancelled"
        wire.check()
    assert await settled_ledger(long_state, "rt-use-cancel") == ["cancel"]
    tokens = await _ledger_tokens(long_engine, "rt-use-cancel", done["id"])
    assert 0 < tokens["text"] < 2000 and tokens["audio"] == 0  # cut mid-Stage0: the talker never ran
    assert done["usage"] == _expected_usage(tokens)


async def test_an_incomplete_response_carries_its_usage(tmp_path):
    """Cut at the token budget (Stage0 ``length``): GA ``incomplete``, its usage the budget's
    tokens, as the log holds them."""
    engine = await fake_engine(tmp_path, EngineConfig(max_tokens=8, talker_max_tokens=4, flush_interval_s=0.005))
    try:
        app = make_app(engine)
        async with serve_app(engine, app=app) as port:
            async with sdk_client(port).realtime.connect(
                model="duplex-ledger", extra_query={"session_id": "rt-use-len"}
            ) as c:
                wire = await _open(c)
                await wire.send(user_text("Tell me a long story"))
                await wire.send({"type": "response.create"})
                done = (await wire.until("response.done"))["response"]
                assert done["status"] == "incomplete"
                wire.check()
            assert await settled_ledger(app.state.realtime, "rt-use-len") == ["stop"]
        tokens = await _ledger_tokens(engine, "rt-use-len", done["id"])
        assert tokens["text"] == 8  # the budget
        assert done["usage"] == _expected_usage(tokens)
    finally:
        await engine.aclose()


def test_usage_is_gas_shape_and_absent_without_counts():
    usage = response_usage({"stage0_tokens_in": 7, "stage0_tokens_out": 3, "stage1_tokens_out": 4})
    assert usage is not None
    parsed = RealtimeResponseUsage.model_validate(usage, strict=True)
    assert (parsed.total_tokens, parsed.input_tokens, parsed.output_tokens) == (14, 7, 7)
    # no prompt count named (a turn never submitted): no input figures, nothing made up
    partial = response_usage({"stage0_tokens_out": 3, "stage1_tokens_out": 0})
    assert partial == {"output_tokens": 3, "output_token_details": {"text_tokens": 3, "audio_tokens": 0}}
    assert response_usage(None) is None and response_usage({"stage0_tokens_out": "3"}) is None


# ---------------------------------------------------------------------- response.create overrides
async def test_output_modalities_of_response_create_apply_to_that_response(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-mod"}) as c:
        wire = await _open(c)
        assert wire.frames[0]["session"]["output_modalities"] == ["audio"]
        await wire.send(user_text("Hello"))
        await c.response.create(response={"output_modalities": ["text"]})  # the SDK's own call
        created = await wire.until("response.created")
        assert created["response"]["output_modalities"] == ["text"]
        done = await wire.until("response.done")
        assert done["response"]["output_modalities"] == ["text"]
        assert done["response"]["output"][0]["content"][0]["type"] == "output_text"
        assert wire.of_type("response.output_text.delta") and not wire.of_type("response.output_audio.delta")
        # the next response without the field is the session's again
        await wire.send(user_text("Again"))
        await wire.send({"type": "response.create"})
        assert (await wire.until("response.created"))["response"]["output_modalities"] == ["audio"]
        await wire.until("response.done")
        # a value equal to the session's is accepted silently
        await wire.send(user_text("Once more"))
        await wire.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
        assert (await wire.until("response.created"))["response"]["output_modalities"] == ["audio"]
        await wire.until("response.done")
        assert wire.of_type("error") == []
        wire.check()
    assert await settled_ledger(state, "rt-mod") == ["stop", "stop", "stop"]


async def test_instructions_of_response_create_are_told_fixed_by_server(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-ins"}) as c:
        wire = await _open(c)
        session_instructions = wire.frames[0]["session"]["instructions"]
        await wire.send(user_text("Hello"))
        await wire.send(
            {"type": "response.create", "event_id": "r1", "response": {"instructions": "Talk like a pirate."}},
            refused=FIXED_BY_SERVER,
        )
        error = (await wire.error_for("r1"))["error"]
        assert error["param"] == "response.instructions" and "session.instructions" in error["message"]
        done = await wire.until("response.done")  # answered all the same, with the session's
        assert done["response"]["status"] == "completed"
        await wire.send(user_text("Again"))
        pcm = {"type": "audio/pcm", "rate": 24000}
        same = {"instructions": session_instructions, "audio": {"output": {"format": pcm}}}
        await wire.send({"type": "response.create", "response": same})
        await wire.until("response.done")
        assert len(wire.of_type("error")) == 1  # the same values as the session's: no notice
        # a voice: there is none to choose (stand-in audio), told so, answered all the same
        await wire.send(user_text("Once more"))
        voice = {"audio": {"output": {"voice": "marin"}}}
        await wire.send({"type": "response.create", "event_id": "r3", "response": voice}, refused=FIXED_BY_SERVER)
        assert (await wire.error_for("r3"))["error"]["param"] == "response.audio.output.voice"
        assert (await wire.until("response.done"))["response"]["status"] == "completed"
        wire.check()
    assert await settled_ledger(state, "rt-ins") == ["stop", "stop", "stop"]


async def test_a_response_create_the_engine_refuses_gets_that_refusal_alone(long_engine, long_state, long_port):
    """No fixed_by_server notice ("the answer shows the effective value") for a response that
    is never created: one error per refused event, the engine's."""
    async with sdk_client(long_port).realtime.connect(
        model="duplex-ledger", extra_query={"session_id": "rt-busy"}
    ) as c:
        wire = await _answering(c)
        busy = {"instructions": "Talk like a pirate.", "max_output_tokens": 5}
        refusal = "conversation_already_has_active_response"
        await wire.send({"type": "response.create", "event_id": "r2", "response": busy}, refused=refusal)
        assert (await wire.error_for("r2"))["error"]["code"] == refusal
        await wire.send({"type": "response.cancel"})
        assert (await wire.until("response.done"))["response"]["status"] == "cancelled"
        assert [f["error"]["code"] for f in wire.of_type("error")] == [refusal]
        assert len(wire.of_type("response.created")) == 1
        wire.check()
    assert await settled_ledger(long_state, "rt-busy") == ["cancel"]


@pytest.mark.parametrize(
    ("response", "code", "param"),
    [
        ({"conversation": "none"}, "unsupported_response_create", "response.conversation"),
        ({"input": []}, "unsupported_response_create", "response.input"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {}}]},
            "unsupported_response_create",
            "response.tools",
        ),
        ({"tool_choice": "required"}, "unsupported_response_create", "response.tool_choice"),
        ({"prompt": {"id": "pmpt_1"}}, "unsupported_response_create", "response.prompt"),
        ({"output_modalities": ["audio", "text"]}, "invalid_value", "response.output_modalities"),
        ({"output_modalities": "text"}, "invalid_value", "response.output_modalities"),
        ({"instructions": 3}, "invalid_value", "response.instructions"),
        (
            {"audio": {"output": {"format": {"type": "audio/pcmu"}}}},
            "unsupported_audio_format",
            "response.audio.output.format.type",
        ),
        (
            {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "unsupported_audio_format",
            "response.audio.output.format.rate",
        ),
        ({"audio": "pcm"}, "bad_event", "response.audio"),
        # a key GA does not define (a beta-era temperature, a typo): refused as OpenAI does
        ({"temperature": 0.1}, "unknown_parameter", "response.temperature"),
        ({"output_modalities": ["text"], "modalitiez": ["text"]}, "unknown_parameter", "response.modalitiez"),
        # refused as a whole: the valid-but-fixed instructions get no notice of their own
        ({"instructions": "other", "conversation": "none"}, "unsupported_response_create", "response.conversation"),
    ],
)
async def test_what_response_create_cannot_answer_is_refused_with_no_response(
    engine, state, port, response, code, param
):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-ref"}) as c:
        wire = await _open(c)
        await wire.send(user_text("Hello"))
        await wire.send({"type": "response.create", "event_id": "r1", "response": response}, refused=code)
        assert (await wire.error_for("r1"))["error"]["param"] == param
        await wire.send({"type": "response.create", "response": {"conversation": "auto", "tool_choice": "auto"}})
        await wire.until("response.done")  # the committed input is still there, answered now
        assert len(wire.of_type("response.created")) == 1 and len(wire.of_type("error")) == 1
        wire.check()
    assert await settled_ledger(state, "rt-ref") == ["stop"]
    history = [s.event for s in await engine.store.read_stream("rt-ref")]
    assert [e for e in history if e.type == "CommandRejected"] == []  # the front's refusal: not the engine's


# ---------------------------------------------------------------------- max_output_tokens numbers
EFFECTIVE = SHORT.max_tokens


@pytest.mark.parametrize("value", [EFFECTIVE, float(EFFECTIVE), None])
def test_max_output_tokens_equal_to_the_budget_is_accepted_silently(value):
    assert max_output_tokens_notice(value, EFFECTIVE, param="p") is None


@pytest.mark.parametrize(("value", "quoted"), [(EFFECTIVE - 1, "5"), (EFFECTIVE - 1.0, "5.0"), ("inf", '"inf"')])
def test_another_valid_max_output_tokens_is_told_fixed_by_server(value, quoted):
    """``5.0`` is the integer 5 (JSON has one number type), as ``6.0`` equals the budget 6."""
    notice = max_output_tokens_notice(value, EFFECTIVE, param="p")
    assert notice is not None and notice.code == FIXED_BY_SERVER
    assert notice.message.startswith(f"p: {quoted} was not applied")


@pytest.mark.parametrize(
    ("value", "quoted"),
    [(0, "0"), (0.0, "0.0"), (5.5, "5.5"), (4097, "4097"), ("0", '"0"'), (True, "true"), ([6], "[6]")],
)
def test_a_max_output_tokens_ga_refuses_is_invalid_and_quoted_as_json(value, quoted):
    with pytest.raises(ProtocolError) as info:
        max_output_tokens_notice(value, EFFECTIVE, param="p")
    assert info.value.code == "invalid_value" and info.value.param == "p"
    assert info.value.message == f'p: {quoted} is not an integer 1..4096 nor "inf"'


def test_unknown_response_keys_are_refused_before_any_notice_and_reasoning_is_told_fixed():
    from realtime.request_fields import RESPONSE_CREATE_FIELDS, response_overrides

    session = {"output_modality": "text", "instructions": "sys", "max_output_tokens": EFFECTIVE}
    with pytest.raises(ProtocolError) as info:
        response_overrides({"instructions": "other", "k" * 100: 1}, **session)
    assert (info.value.code, info.value.param) == ("unknown_parameter", "response." + "k" * 64 + "…")
    notices = response_overrides({"reasoning": {"effort": "low"}, "parallel_tool_calls": False}, **session).notices
    assert [(n.code, n.param) for n in notices] == [(FIXED_BY_SERVER, "response.reasoning")]
    # every key GA's SDK defines is known (a newer SDK adding one shows up here)
    from openai.types.realtime.realtime_response_create_params_param import RealtimeResponseCreateParamsParam

    assert set(RealtimeResponseCreateParamsParam.__annotations__) == RESPONSE_CREATE_FIELDS
