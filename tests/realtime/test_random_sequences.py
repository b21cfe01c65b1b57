"""Seeded random client-event sequences (good and bad events interleaved, sent without waiting
for answers) against the FAKE engine: whatever the order, every frame is strictly GA, the wire
invariants hold, every refused event is answered with its event_id, the socket stays open
until the client closes it, and the ledger audits clean with no live id on any port."""

from __future__ import annotations

import base64
import random

import pytest

from tests.realtime.conftest import sdk_client
from tests.realtime.fakes import tone_chunk
from tests.realtime.ledger import settled_ledger
from tests.realtime.test_conformance import user_text
from tests.realtime.wire import Wire

AUDIO = base64.b64encode(tone_chunk(5, ms=40)).decode()
MENU = [
    lambda: user_text("Tell me something"),
    lambda: {"type": "input_audio_buffer.append", "audio": AUDIO, "transcript": "hello there"},
    lambda: {"type": "input_audio_buffer.append", "audio": AUDIO},
    lambda: {"type": "input_audio_buffer.commit"},
    lambda: {"type": "input_audio_buffer.clear"},
    lambda: {"type": "response.create"},
    lambda: {"type": "response.create"},
    lambda: {"type": "response.cancel"},
    lambda: {"type": "output_audio_buffer.clear"},
    lambda: {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}},
    lambda: {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}},
]
ALWAYS_REFUSED = [  # (event, the error code it always gets)
    ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_audio"),
    ({"type": "conversation.item.retrieve", "item_id": "x"}, "unsupported_event"),
    ({"type": "what.is.this"}, "unknown_event"),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_sequence_keeps_the_wire_and_the_ledger_sound(long_engine, long_state, long_port, seed):
    rng = random.Random(seed)
    sid = f"rt-rand-{seed}"
    async with sdk_client(long_port).realtime.connect(model="duplex-ledger", extra_query={"session_id": sid}) as c:
        wire = Wire(c)
        await wire.recv()
        for n in range(40):
            if rng.random() < 0.2:
                event, code = rng.choice(ALWAYS_REFUSED)
                await wire.send({**event, "event_id": f"ev-{n}"}, refused=code)
            else:
                await wire.send({**rng.choice(MENU)(), "event_id": f"ev-{n}"})
            if rng.random() < 0.3:  # sometimes let the server catch up a little
                await wire.recv()
        await wire.send({"type": "end.of.test", "event_id": "last"}, refused="unknown_event")
        while (await wire.until("error"))["error"]["event_id"] != "last":  # answered in order, socket open
            pass
        assert wire.refused_ids
        wire.check(all_done=False)  # includes: each always-refused event got its error code
    reasons = await settled_ledger(long_state, sid)
    assert set(reasons) <= {"stop", "cancel", "close"}
