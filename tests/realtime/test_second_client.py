"""A second Realtime client nobody here wrote (issue 21): pipecat's own OpenAI Realtime
integration (``pipecat.services.openai.realtime.llm.OpenAIRealtimeLLMService``, pipecat-ai
1.14.0, pinned in the ``test`` extra) pointed at ``/v1/realtime`` on the FAKE engine
(tests/fakes/fake_port.py), driven headless by the frames a pipecat app pushes: no cloud, no
room, no audio device.

The conversation: the service's first context (one user message, sent as a user
``conversation.item.create``) runs turn 1 to its end (``LLMRunFrame`` through the assistant
aggregator, as pipecat's examples start a bot); turn 2 is spoken: an ``InputAudioRawFrame``
(``input_audio_buffer.append``, heard by a FAKE transcriber) and ``UserStoppedSpeakingFrame``
(with turn detection off, pipecat commits and sends ``response.create``), interrupted
mid-answer by an ``InterruptionFrame`` (pipecat sends ``input_audio_buffer.clear``, re-appends
its pre-roll, then ``response.cancel``); an ``EndFrame`` closes the socket (code 1000).

Not the text path for turn 2: pipecat sends an ``LLMMessagesAppendFrame``'s messages as
``system``-role items (``_handle_messages_append``), which this server refuses
(``unsupported_item``: only user messages) and pipecat treats as fatal.

Checked: every frame the server sent validates strictly as a GA server event (the openai SDK's
pydantic types; pipecat's own parse is lenient about extra fields) and none is an ``error``;
pipecat raised nothing (no ``ErrorFrame``, no ERROR log) and received its text deltas; the
server logged no warning or error and its front only the session's end by a normal close
(1000); and the ledger: turn tables ``[stop, cancel]`` (DOMAIN §2.4: a ``response.cancel``
finishes the turn ``cancel``), ``leaks() == []``, the session closed (``disconnect``), no live
request ids on the fake ports.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import typing
from array import array
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("pipecat", reason="pipecat-ai (test extra) drives this test")

from loguru import logger as pipecat_logger  # noqa: E402  (pipecat's logger)
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    LLMTextFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime import events as rt_events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from engine_bridge.engine import SessionEngine  # noqa: E402
from engine_bridge.messages import EngineConfig  # noqa: E402
from projections.shell.runner import project_as_of  # noqa: E402
from realtime.connection import ConnectionOptions  # noqa: E402
from tests.fakes.fake_port import FakeStagePort  # noqa: E402
from tests.realtime.server_fixture import serve_app  # noqa: E402
from tests.waiting import eventually  # noqa: E402

# The thinker's scripted answer: 100 words at 10 ms a word, under the 120-token budget, so turn 1
# ends by itself (``stop``) in about 1 s, and turn 2 is always still answering when the
# interruption lands a few deltas in.
REPLY = " ".join(f"word{i}" for i in range(100))
CONFIG = EngineConfig(max_tokens=120, talker_max_tokens=4, flush_interval_s=0.005)
# Turn 2 is spoken: 1 s of a 440 Hz tone, pcm16 at 24 kHz (GA's only PCM rate, so pipecat sends
# it unresampled), which the FAKE transcriber below hears as SPOKEN. pipecat re-appends the
# last 0.5 s of it after its interruption's buffer clear (its pre-roll): other bytes, no words.
SPEECH = array("h", (int(8000 * math.sin(2 * math.pi * 440 * i / 24_000)) for i in range(24_000))).tobytes()
SPOKEN = "Tell me a long story."


class FakeTranscriber:
    """A FAKE transcriber (realtime.audio.Transcriber): the words of a chunk it knows by its
    sha256 digest, None for any other."""

    def __init__(self, known: dict[bytes, str]) -> None:
        self.known = {hashlib.sha256(pcm).hexdigest(): text for pcm, text in known.items()}
        self.heard: list[str | None] = []

    async def transcribe(self, pcm: bytes, *, sample_rate_hz: int) -> str | None:
        assert sample_rate_hz == 24_000
        self.heard.append(self.known.get(hashlib.sha256(pcm).hexdigest()))
        return self.heard[-1]


def _ga_event_classes() -> dict[str, Any]:
    """GA server event type -> the openai SDK's pydantic class (research §6.1 strict check)."""
    union = typing.get_args(RealtimeServerEvent)[0]
    table: dict[str, Any] = {}
    for cls in typing.get_args(union):
        for name in typing.get_args(cls.model_fields["type"].annotation):
            table[name] = cls
    return table


GA_EVENTS = _ga_event_classes()


class Tap(FrameProcessor):
    """Records the frames that pass one way (pipecat's own test utilities do the same)."""

    def __init__(self, direction: FrameDirection, seen: list[Frame]) -> None:
        super().__init__()
        self.direction, self.seen = direction, seen

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.seen.append(frame)
        await self.push_frame(frame, direction)


@pytest.fixture
async def engine(tmp_path) -> AsyncIterator[SessionEngine]:
    ports = [
        FakeStagePort(0, "thinker", token_delay_s=0.01, reply=REPLY),
        FakeStagePort(1, "talker", token_delay_s=0.002),
    ]
    eng = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=CONFIG)
    yield eng
    await eng.aclose()


@pytest.fixture
def server_frames(monkeypatch) -> list[dict[str, Any]]:
    """Every raw frame the server sent to pipecat, recorded where pipecat parses it."""
    frames: list[dict[str, Any]] = []
    parse = rt_events.parse_server_event

    def recording(message: str) -> Any:
        frames.append(json.loads(message))
        return parse(message)

    monkeypatch.setattr(rt_events, "parse_server_event", recording)
    return frames


@pytest.fixture
def pipecat_errors() -> Iterator[list[str]]:
    """pipecat's ERROR (and worse) log records during the test."""
    records: list[str] = []
    handler = pipecat_logger.add(lambda message: records.append(str(message)), level="ERROR")
    yield records
    pipecat_logger.remove(handler)


def _sent(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f.get("type") == kind]


def _texts(frames: list[Frame]) -> list[str]:
    return [f.text for f in frames if isinstance(f, LLMTextFrame)]


async def _converse(port: int, server_frames: list[dict[str, Any]]) -> tuple[list[Frame], list[Frame], str]:
    """pipecat's realtime service against the server: turn 1 to its end, turn 2 interrupted,
    then the pipeline ends. Returns (frames seen upstream of the service, downstream of it,
    the text pipecat received in turn 1)."""
    context = LLMContext(messages=[{"role": "user", "content": "Hello, who are you?"}])
    llm = OpenAIRealtimeLLMService(
        api_key="local-test-key",
        base_url=f"ws://127.0.0.1:{port}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            model="duplex-ledger",
            session_properties=rt_events.SessionProperties(
                output_modalities=["text"],
                audio=rt_events.AudioConfiguration(input=rt_events.AudioInput(turn_detection=False)),
            ),
        ),
    )
    up: list[Frame] = []
    down: list[Frame] = []
    # The assistant half of pipecat's aggregator pair turns LLMRunFrame into the context frame
    # the realtime service answers (no user aggregator: no microphone, frames are pushed).
    assistant = LLMContextAggregatorPair(context, realtime_service_mode=False).assistant()
    pipeline = Pipeline([Tap(FrameDirection.UPSTREAM, up), llm, Tap(FrameDirection.DOWNSTREAM, down), assistant])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await eventually(lambda: bool(_sent(server_frames, "session.updated")), timeout_s=15)
        # turn 1: runs to its end
        await worker.queue_frame(LLMRunFrame())
        await eventually(lambda: len(_sent(server_frames, "response.done")) == 1, timeout_s=20)
        await eventually(lambda: any(isinstance(f, LLMFullResponseEndFrame) for f in down), timeout_s=5)
        turn1_text = "".join(_texts(down))
        mark = len(down)
        # turn 2: spoken (pipecat appends the audio, then commits and asks for the response when
        # the user stops speaking), interrupted a few deltas in
        await worker.queue_frame(InputAudioRawFrame(audio=SPEECH, sample_rate=24_000, num_channels=1))
        await worker.queue_frame(UserStoppedSpeakingFrame())
        await eventually(lambda: len(_texts(down[mark:])) >= 3, timeout_s=20)
        await worker.queue_frame(InterruptionFrame())
        await eventually(lambda: len(_sent(server_frames, "response.done")) == 2, timeout_s=20)
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            await worker.cancel()
            await asyncio.wait_for(running, 20)
    return up, down, turn1_text


async def test_pipecat_realtime_service_two_turns_and_an_interruption(
    engine, server_frames, pipecat_errors, caplog
) -> None:
    caplog.set_level(logging.INFO)
    transcriber = FakeTranscriber({SPEECH: SPOKEN})
    async with serve_app(engine, ConnectionOptions(transcriber=transcriber)) as port:
        up, down, turn1_text = await _converse(port, server_frames)
        # the ledger's session: found by listing what the engine opened (pipecat's service
        # takes no query parameters but ``model``, so it cannot name its session)
        assert len(engine.sessions) == 1
        (session,) = engine.sessions.values()
        await eventually(lambda: session.closed, timeout_s=10)

    # what the server sent: GA-valid, no error, one response.done per response.created
    assert _sent(server_frames, "error") == []
    for frame in server_frames:
        assert frame.get("type") in GA_EVENTS, f"not a GA server event: {frame.get('type')!r}"
        GA_EVENTS[frame["type"]].model_validate(frame)  # raises on a missing or mistyped field
    created = [f["response"]["id"] for f in _sent(server_frames, "response.created")]
    done = [(f["response"]["id"], f["response"]["status"]) for f in _sent(server_frames, "response.done")]
    assert len(created) == 2 and [rid for rid, _ in done] == created
    assert [status for _, status in done] == ["completed", "cancelled"]
    first_text = [f["text"] for f in _sent(server_frames, "response.output_text.done")]
    assert first_text and first_text[0] == turn1_text == REPLY  # pipecat got every delta of turn 1
    turn2_deltas = [f for f in _sent(server_frames, "response.output_text.delta") if f["response_id"] == created[1]]
    assert 3 <= len(turn2_deltas) < len(REPLY.split())  # cut mid-answer

    assert transcriber.heard == [SPOKEN, None]  # the speech, then the re-appended pre-roll
    # pipecat: nothing raised, nothing logged as an error
    assert [f for f in up + down if isinstance(f, ErrorFrame)] == []
    assert pipecat_errors == []
    # the server: nothing logged at WARNING or above; the front logged only the session's end,
    # by the client's normal close (no receive or send failure, no refused close)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    front_log = [r.getMessage() for r in caplog.records if r.name.startswith("realtime")]
    assert len(front_log) == 1 and front_log[0].endswith(f"session {session.session_id} ends: client_closed_1000")

    # the ledger
    p = await project_as_of(engine.store)
    assert [t.finished_reason for t in p.turn_tables if t.session_id == session.session_id] == ["stop", "cancel"]
    assert p.leaks() == []
    assert all(port.live_request_ids() == set() for port in engine.ports)
    history = await engine.store.read_stream(session.session_id)
    # pipecat's normal close (1000) ends the session: session_close, not a dropped transport
    assert [h.event.reason for h in history if h.event.type == "SessionClosed"] == ["session_close"]
