"""events.types.new_event_id: the fast fresh id is exactly ``UUID(int=bits, version=4)`` of the
same random bits (variant, version, text, hash, pickling), its text formatted once."""

from __future__ import annotations

import pickle
import uuid

import events.types as types_module
from events.types import StageOutput, new_event_id


def test_a_fresh_id_is_the_version_4_uuid_of_its_bits():
    for _ in range(2000):
        state = types_module._rng.getstate()
        fresh = new_event_id()
        types_module._rng.setstate(state)
        reference = uuid.UUID(int=types_module._rng.getrandbits(128), version=4)
        assert fresh == reference and fresh.int == reference.int
        assert (fresh.version, fresh.variant) == (4, uuid.RFC_4122)
        assert str(fresh) == str(reference) == str(fresh)  # the cached text is the same text
        assert hash(fresh) == hash(reference) and repr(fresh) == repr(reference)
        assert pickle.loads(pickle.dumps(fresh)) == reference


def test_an_event_carries_and_writes_its_fresh_id_as_uuid_text():
    event = StageOutput(session_id="s", ts=1.0, stage_id=0, request_id="r")
    assert isinstance(event.event_id, uuid.UUID)
    assert f'"event_id":"{uuid.UUID(int=event.event_id.int)}"' in event.model_dump_json()
