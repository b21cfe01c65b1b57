"""One runtime shape per event (issue 23 step 1): the pydantic models validate at the door, and
every reader — the live session's fold, history reads, the folds' dispatch — gets the one
msgspec struct of each event kind, with the same values whichever way it came."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_bridge.session_log import SessionLog
from events.jsonl import JsonlError, parse_lines
from events.records import StoredEvent
from events.stats import EngineStamp, StageRequestStats
from events.store.store import EventStore
from events.structs import STRUCT_TYPES, struct_of, struct_type
from events.types import EVENT_CLASSES, Capabilities, EventBase, Fence, parse_event
from projections.dispatch import dispatch_table
from projections.projector import Projector
from tests.logbuilder import eph

SID = "one-shape"
RID = eph(SID, 0)
FENCE = Fence(incarnation=0, epoch=1, turn_id=2)
# One event of every kind, with nested models, lists, optional and free-form values set.
FIELDS: dict[str, dict[str, Any]] = {
    "SessionOpened": {
        "capabilities": Capabilities(supports_core_resumable_request=True),
        "model": "m",
        "replica_id": "A",
        "replica_incarnation": 3,
        "protocol": "realtime",
        "connection_id": "c1",
    },
    "InputAppended": {
        "input_kind": "audio",
        "audio_format": "pcm16",
        "sample_rate_hz": 24000,
        "duration_ms": 20.0,
        "size_bytes": 960,
        "fence": FENCE,
    },
    "InputCleared": {"dropped_chunks": 2, "fence": FENCE},
    "TurnCommitted": {"turn_id": 0, "action": "START_AUTO_RESPONSE", "response_id": "r0", "overlap_speech_ms": 1.5},
    "ResponseListened": {"turn_id": 0, "request_id": RID},
    "StageRequestReserved": {"stage_id": 0, "request_id": RID, "fence": FENCE},
    "StageRequestSubmitted": {"stage_id": 0, "request_id": RID, "fence": FENCE, "num_tokens_in": 12},
    "StageRequestForwarded": {"stage_id": 1, "request_id": RID, "fence": FENCE},
    "StageOutput": {"stage_id": 0, "request_id": RID, "num_new_tokens": 3, "text_delta": "hé", "model_turn_id": 0},
    "StageRequestFinished": {"stage_id": 0, "request_id": RID, "finish_reason": "stop", "end_of_turn": True},
    "StageMetricsReported": {
        "stage_id": 0,
        "request_id": RID,
        "stats": StageRequestStats(num_tokens_out=3, vllm_itls_ms=[1.0, 2.5], extra={"k": [1, {"x": 2.5}]}),
        "stage_submit_ts": 1.25,
        "engine_submit_ts": EngineStamp(clock="engine_monotonic", s=5.0),
        "engine_first_token_ts": EngineStamp(clock="wall", s=1.5),
    },
    "TransferTx": {"from_stage": 0, "to_stage": 1, "request_id": RID, "size_bytes": 10, "tx_time_ms": 0.5},
    "ActiveRequestBound": {"request_id": RID},
    "ResponseBegun": {"response_id": "r0", "request_id": RID, "commit_ts": 1.000001},
    "ResponseEnded": {"response_id": "r0", "status": "completed", "cause": "model"},
    "TurnCompleted": {"completed_turn_id": 0, "new_turn_id": 1},
    "CancelRequested": {"source": "barge_in", "wire_reason": "turn_detected", "response_id": "r0"},
    "EpochAdvanced": {"old_epoch": 1, "new_epoch": 2},
    "StageRequestReleased": {"stage_id": 0, "request_id": RID},
    "StageRequestRestored": {"stage_id": 0, "request_id": RID, "fence": FENCE},
    "StageRequestLost": {"stage_id": 1, "request_id": RID},
    "AbortRequested": {"request_ids": [RID], "stage_ids": [0, 1], "reason": "barge_in"},
    "AbortResult": {"request_ids": [RID], "stage_id": 0, "outcome": "failed", "error": "boom"},
    "ReleaseRequested": {"request_ids": [RID]},
    "ReleaseResult": {"request_ids": [RID], "outcome": "ok"},
    "TurnFinalized": {"response_id": "r0", "finished_reason": "barge_in"},
    "CommandRejected": {"command": "commit", "error_code": "input_audio_buffer_empty", "message": "empty"},
    "SessionTakenOver": {"replica_id": "B", "replica_incarnation": 1, "previous_replica_id": "A"},
    "SessionClosed": {"reason": "session_close"},
}


def every_kind() -> list[EventBase]:
    order = ["SessionOpened", *(k for k in FIELDS if k not in ("SessionOpened", "SessionClosed")), "SessionClosed"]
    return [EVENT_CLASSES[k](session_id=SID, ts=1.0 + i / 1000 + 1e-6, **FIELDS[k]) for i, k in enumerate(order)]


def test_the_samples_cover_every_kind() -> None:
    assert set(FIELDS) == set(EVENT_CLASSES)


async def test_every_kind_written_live_reads_back_as_the_same_struct(sqlite_url: str) -> None:
    """What the live fold is handed (SessionLog) equals, type and values, what every history
    read gives back from the store."""
    store = await EventStore.open(sqlite_url, create=True)
    live: list[StoredEvent] = []
    try:
        log = SessionLog(store, SID, 0, on_applied=live.append)
        events = every_kind()
        for event in events[:-1]:
            log.emit_later(event)
        await log.emit(events[-1])
        read = [s.event for s in await store.read_stream(SID)]
        read_all = [s.event async for s in store.read_all()]
    finally:
        await store.close()
    assert len(live) == len(read) == len(EVENT_CLASSES)
    for handed, back, again, model in zip((s.event for s in live), read, read_all, events, strict=True):
        kind = model.type
        assert type(handed) is type(back) is type(again) is STRUCT_TYPES[kind], kind
        assert handed == back == again, kind
        assert not isinstance(handed, EventBase)
        assert handed.event_id == str(model.event_id) and handed.ts == model.ts, kind
    # the live fold saw the very structs it was handed: its state equals the read path's
    assert (
        log.projector.findings()
        == Projector().apply_all(StoredEvent(i, SID, i, 0.0, e) for i, e in enumerate(read, 1)).findings()
    )


def test_dispatch_tables_have_one_struct_entry_per_kind() -> None:
    from events.types import StageOutput, TurnCommitted

    table = dispatch_table({StageOutput: print, TurnCommitted: repr})
    assert table == {struct_type(StageOutput): print, struct_type(TurnCommitted): repr}
    from projections.metrics import MetricsFold, TallySink

    folds = [Projector(live=False).resources, Projector(live=False).turns, MetricsFold(TallySink())]
    structs = set(STRUCT_TYPES.values())
    seen = 0
    import sys

    for fold in folds:
        # a fold's table is an attribute of the fold or of its module (a module-level table keeps
        # the fold's state free of wiring: issue 23 step 2)
        places = [*vars(fold).values(), *vars(sys.modules[type(fold).__module__]).values()]
        for value in places:
            if isinstance(value, dict) and value and all(isinstance(k, type) and k in structs for k in value):
                seen += 1
                assert set(value) <= structs, (type(fold).__name__, set(value) - structs)
                names = [k.__name__ for k in value]
                assert len(names) == len(set(names))  # one entry per kind
    assert seen >= 3  # each fold has its table
    from reports.timeline import _MARKS

    assert set(_MARKS) <= structs


def test_a_model_never_reaches_a_fold_on_the_live_path() -> None:
    """struct_of is the hand-off: a model gives its struct, a struct is kept, nothing else."""
    event = every_kind()[6]
    struct = struct_of(event)
    assert type(struct) is struct_type(type(event)) and struct_of(struct) is struct
    assert struct.fence == struct_of(FENCE) and struct.fence.key() == FENCE.key()
    with pytest.raises(TypeError):
        struct_of(object())


def test_an_import_with_a_bad_field_still_names_field_value_and_line() -> None:
    good = json.dumps({"stream": SID, "type": "SessionOpened", "ts": 1.0, "data": {}})
    bad = json.dumps(
        {
            "stream": SID,
            "type": "StageOutput",
            "ts": 1.1,
            "data": {"stage_id": 0, "request_id": RID, "num_new_tokens": -4},
        }
    )
    with pytest.raises(JsonlError) as info:
        parse_lines([good, bad, bad.replace("-4", '"x"')])
    assert [str(e) for e in info.value.errors] == [
        "line 2: StageOutput.num_new_tokens: Input should be greater than or equal to 0 (got -4)",
        "line 3: StageOutput.num_new_tokens: Input should be a valid integer (got 'x')",
    ]


def test_the_door_still_refuses_what_it_refused() -> None:
    with pytest.raises(ValueError, match="stage_id"):
        parse_event({"type": "StageRequestForwarded", "session_id": SID, "ts": 1.0, "stage_id": 0, "request_id": RID})


def test_a_live_session_opened_stores_what_an_import_stores():
    """The row text the store builds (pydantic's serializer, issue 23 step 6) leaves out the
    unset owner and front fields exactly as ``payload()`` does (a live append stored them as
    null from d0ec87c on; an import and older logs leave them out)."""
    import json

    from events.store.rows import NewRow, dump_data
    from events.types import SessionOpened

    plain = SessionOpened(session_id="s", ts=1.0)
    row = NewRow.checked(plain)
    text = next(v for v in row if isinstance(v, str) and v.startswith("{"))
    assert text == dump_data(plain.payload())
    assert not {"replica_id", "replica_incarnation", "protocol", "connection_id"} & set(json.loads(text))
    owned = SessionOpened(session_id="s", ts=1.0, replica_id="r", replica_incarnation=0, protocol="realtime")
    assert json.loads(next(v for v in NewRow.checked(owned) if isinstance(v, str) and v.startswith("{"))) == {
        **json.loads(text),
        "replica_id": "r",
        "replica_incarnation": 0,
        "protocol": "realtime",
    }
