"""The pure parts of the front: frame parsing, pcm16 validation, the stand-in renderer, the
session config and the projection's id and terminal rules (no server)."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_bridge.messages import ClientEvent
from realtime.audio import decode_pcm16, render_output_audio
from realtime.projection import CommitCause, Projection
from realtime.protocol import ProtocolError, dumps, error_event, error_type_for, parse_client_event
from realtime.session_config import SessionConfig, apply_update, session_object
from tests.realtime.wire import validate_frame

CONFIG = SessionConfig("s1", "duplex-ledger", "response_required", False, "Be brief.", 32)


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_frame_is_an_event_or_a_named_refusal(frame):
    try:
        event = parse_client_event(frame)
    except ProtocolError as exc:
        assert exc.code in {"invalid_json", "bad_event"}
        validate_frame(error_event(exc.code, exc.message, param=exc.param))
    else:
        assert isinstance(event, dict) and isinstance(event["type"], str)


_STDLIB_FRAME = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=6))
def test_server_frames_are_ascii_json_of_the_same_event(event):
    """issue 23: the fast encoder changes no frame's content; a frame with any non-ASCII
    text (a lone surrogate included) is byte for byte the stdlib's."""
    frame = dumps(event)
    assert frame.isascii()
    assert json.loads(frame) == event
    if not _texts_ascii(event):
        assert frame == _STDLIB_FRAME.encode(event)


def _texts_ascii(value: object) -> bool:
    if isinstance(value, str):
        return value.isascii()
    if isinstance(value, dict):
        return all(_texts_ascii(k) and _texts_ascii(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_texts_ascii(v) for v in value)
    return True


@given(st.binary(max_size=64))
def test_pcm16_round_trip_or_invalid_audio(pcm):
    encoded = base64.b64encode(pcm).decode()
    if pcm and len(pcm) % 2 == 0:
        assert decode_pcm16(encoded) == pcm
    else:
        with pytest.raises(ProtocolError) as info:
            decode_pcm16(encoded)
        assert (info.value.code, info.value.param) == ("invalid_audio", "audio")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e309", "-1e400"])
def test_non_finite_numbers_are_invalid_json_not_values(token):
    """RFC 8259 §6 has no NaN/Infinity; Python's parser takes them (and reads 1e309 as inf)."""
    with pytest.raises(ProtocolError) as info:
        parse_client_event(f'{{"type": "response.create", "response": {{"max_output_tokens": {token}}}}}')
    assert info.value.code == "invalid_json" and token in info.value.message
    assert parse_client_event('{"type": "x", "v": 1.5e3}')["v"] == 1500.0


def test_deeply_nested_json_is_invalid_json_not_a_crash():
    with pytest.raises(ProtocolError) as info:
        parse_client_event("[" * 100_000 + "]" * 100_000)
    assert info.value.code == "invalid_json"


def test_oversized_frame_and_audio():
    with pytest.raises(ProtocolError, match="over the limit") as info:
        parse_client_event(json.dumps({"type": "x", "audio": "A" * 100}), max_bytes=50)
    assert info.value.code == "event_too_large"
    with pytest.raises(ProtocolError, match="over 4 bytes"):
        decode_pcm16(base64.b64encode(b"\0" * 6).decode(), max_bytes=4)


def test_stand_in_audio_is_real_pcm16_of_the_recorded_frames():
    pcm = render_output_audio(480)
    assert len(pcm) == 960  # one talker token: 480 frames at 24 kHz = 20 ms
    samples = struct.unpack("<480h", pcm)
    assert max(samples) > 0 > min(samples) and samples[0] == 0
    assert render_output_audio(960) == pcm + pcm  # whole periods: chunks join without a click
    assert render_output_audio(0) == b""


def test_error_buckets():
    assert error_type_for("max_sessions_reached") == "rate_limit_error"
    assert error_type_for("stage_error") == "server_error"
    assert error_type_for("input_audio_buffer_empty") == "invalid_request_error"


def test_session_update_is_transactional_and_effective():
    assert apply_update(CONFIG, {"type": "realtime", "output_modalities": ["text"]}).output_modality == "text"
    with pytest.raises(ProtocolError) as info:  # a good field before a bad one changes nothing
        apply_update(CONFIG, {"output_modalities": ["text"], "audio": {"input": {"format": {"type": "audio/pcma"}}}})
    assert info.value.param == "session.audio.input.format.type"
    assert CONFIG.output_modality == "audio"
    for bad in ("nope", None, 3):
        with pytest.raises(ProtocolError):
            apply_update(CONFIG, {"audio": bad} if bad is not None else None)
    obj = session_object(CONFIG)
    validate_frame({"type": "session.updated", "event_id": "e", "session": obj})
    assert obj["instructions"] == "Be brief." and obj["x_duplex_ledger"]["output_audio"] == "stand_in"


def event(type_, **data):
    return ClientEvent(type_, "s1", 0.0, data)


def test_projection_ids_are_derived_and_one_terminal_per_response():
    p = Projection(CONFIG)
    p.project(event("session.created", incarnation=2))
    p.causes.append(CommitCause("buffer", [{"type": "input_audio", "transcript": "hi"}], True, "hi", 0.1))
    committed = p.project(event("input_audio_buffer.committed", action="COMMIT_ONLY"))
    assert committed[0]["item_id"] == "item_s1_i2_u1"
    opened = p.project(event("response.created", response_id="resp-s1-0-aa"))
    assert opened[1]["item"]["id"] == "item_resp-s1-0-aa"
    p.project(event("response.text.delta", response_id="resp-s1-0-aa", delta="Hel"))
    p.project(event("response.text.delta", response_id="resp-s1-0-aa", delta="lo"))
    frames = p.project(
        event("response.cancelled", response_id="resp-s1-0-aa", reason="barge_in", finished_reason="cancel")
    )
    assert frames[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}  # M17
    assert frames[0]["transcript"] == "Hello"
    for f in (*committed, *opened, *frames):
        validate_frame(f)
    late = [
        event("response.text.delta", response_id="resp-s1-0-aa", delta="x"),
        event("response.audio.delta", response_id="resp-s1-0-aa", frames=480),
        event("response.done", response_id="resp-s1-0-aa", reason="stop", finish_reason="stop", text="Hello"),
    ]
    assert [p.project(e) for e in late] == [[], [], []]


def test_projection_without_the_dialect_sends_no_extension_event():
    ga, dialect = Projection(CONFIG), Projection(CONFIG, duplex_dialect=True)
    for e in (event("response.listen", turn_id=0), event("session.closed", reason="disconnect")):
        assert ga.project(e) == []
        (frame,) = dialect.project(e)
        validate_frame(frame, duplex=True)


def test_server_event_ids_are_event_and_32_random_hex_digits() -> None:
    """A server ``event_id`` is ``event_`` + 32 lowercase hex digits, never repeated (issue 23:
    made from 16 random bytes)."""
    import re

    from realtime.protocol import new_event_id, server_event

    ids = {new_event_id() for _ in range(5000)}
    assert len(ids) == 5000
    assert all(re.fullmatch(r"event_[0-9a-f]{32}", i) for i in ids)
    assert {c for i in ids for c in i[6:]} == set("0123456789abcdef")
    assert re.fullmatch(r"event_[0-9a-f]{32}", server_event("x")["event_id"])
