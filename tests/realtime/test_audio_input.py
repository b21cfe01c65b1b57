"""Audio in (research §6.2 scenario 2): pcm16 24 kHz appends, commit, input transcripts, on the
FAKE engine; the ledger records each append by rate, duration and digest, never the payload."""

from __future__ import annotations

import base64
import hashlib

import pytest

from realtime.connection import ConnectionOptions
from tests.realtime.conftest import sdk_client
from tests.realtime.fakes import FakeTranscriber, tone_chunk
from tests.realtime.ledger import settled_ledger
from tests.realtime.wire import Wire

CHUNKS = [tone_chunk(i) for i in range(15)]  # 1.5 s in 100 ms chunks


@pytest.fixture
def options() -> ConnectionOptions:
    table = {CHUNKS[0]: "What is", CHUNKS[1]: "the weather", **{c: "" for c in CHUNKS[2:]}}
    return ConnectionOptions(transcriber=FakeTranscriber(table))


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def test_append_commit_with_transcript(engine, state, port, options):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-in"}) as conn:
        wire = Wire(conn)
        await wire.recv()
        await wire.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}})
        await wire.until("session.updated")
        for chunk in CHUNKS:
            await wire.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
        await wire.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
        committed = await wire.recv()
        assert committed["type"] == "input_audio_buffer.committed"  # nothing came back for the appends
        item_id = committed["item_id"]
        assert item_id == "item_rt-in_i0_u1"
        added = await wire.recv()
        assert added["type"] == "conversation.item.added" and added["item"]["id"] == item_id
        await wire.until("conversation.item.done")
        heard = await wire.until("conversation.item.input_audio_transcription.completed")
        assert heard["item_id"] == item_id and heard["transcript"] == "What is the weather"
        assert heard["usage"] == {"type": "duration", "seconds": 1.5}
        await wire.send({"type": "response.create"})
        done = await wire.until("response.done")
        assert done["response"]["status"] == "completed"
        assert not wire.of_type("response.created")[0].get("error")
        wire.check()
    assert options.transcriber.calls == 15
    assert await settled_ledger(state, "rt-in") == ["stop"]
    appended = [s.event for s in await engine.store.read_stream("rt-in") if s.event.type == "InputAppended"]
    assert len(appended) == 15
    assert all(a.sample_rate_hz == 24_000 and a.audio_format == "pcm16" for a in appended)
    assert sum(a.duration_ms for a in appended) == pytest.approx(1500.0)
    assert [a.digest_sha256 for a in appended] == [hashlib.sha256(c).hexdigest() for c in CHUNKS]
    assert all(a.payload_b64 is None for a in appended)


async def test_item_input_audio_transcript_is_what_the_thinker_hears(engine, state, port):
    pcm = tone_chunk(40, ms=200)
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": b64(pcm), "transcript": "Say something nice"}],
    }
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-item"}) as c:
        wire = Wire(c)
        await wire.recv()
        await wire.send({"type": "conversation.item.create", "item": item})
        added = await wire.until("conversation.item.added")
        assert added["item"]["content"] == [{"type": "input_audio", "transcript": "Say something nice"}]
        heard = await wire.until("conversation.item.input_audio_transcription.completed")
        assert heard["transcript"] == "Say something nice"
        assert not wire.of_type("input_audio_buffer.committed")  # an item, not a buffer commit
        await wire.send({"type": "response.create"})
        assert (await wire.until("response.done"))["response"]["status"] == "completed"
        wire.check()
    assert await settled_ledger(state, "rt-item") == ["stop"]
    appended = [s.event for s in await engine.store.read_stream("rt-item") if s.event.type == "InputAppended"]
    assert [(a.text, a.duration_ms) for a in appended] == [("Say something nice", pytest.approx(200.0))]


async def test_append_transcript_extension_key(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-ext"}) as c:
        wire = Wire(c)
        await wire.recv()
        await wire.send({"type": "input_audio_buffer.append", "audio": b64(tone_chunk(30)), "transcript": "Hi you"})
        await wire.send({"type": "input_audio_buffer.commit"})
        heard = await wire.until("conversation.item.input_audio_transcription.completed")
        assert heard["transcript"] == "Hi you"
        await wire.send({"type": "response.create"})
        await wire.until("response.done")
        wire.check()
    assert await settled_ledger(state, "rt-ext") == ["stop"]


async def test_no_transcript_is_a_failed_transcription_and_no_response(engine, state, port):
    async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-mute"}) as c:
        wire = Wire(c)
        await wire.recv()
        await wire.send({"type": "input_audio_buffer.append", "audio": b64(tone_chunk(31))})
        await wire.send({"type": "input_audio_buffer.commit"})
        failed = await wire.until("conversation.item.input_audio_transcription.failed")
        assert failed["item_id"] == "item_rt-mute_i0_u1"
        await wire.send({"type": "response.create", "event_id": "r1"}, refused="input_audio_buffer_empty")
        await wire.error_for("r1")
        # the session is still usable
        await wire.send({"type": "input_audio_buffer.append", "audio": b64(tone_chunk(31)), "transcript": "Hello"})
        await wire.send({"type": "input_audio_buffer.commit"})
        await wire.send({"type": "response.create"})
        assert (await wire.until("response.done"))["response"]["status"] == "completed"
        wire.check()
    assert await settled_ledger(state, "rt-mute") == ["stop"]
    history = [s.event for s in await engine.store.read_stream("rt-mute")]
    appended = [e for e in history if e.type == "InputAppended"]
    assert [(a.text, a.is_speech) for a in appended] == [(None, False), ("Hello", True)]
    assert [e.error_code for e in history if e.type == "CommandRejected"] == ["input_audio_buffer_empty"]
