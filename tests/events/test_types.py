"""Typed events: validation errors name the type and the field; ts normalisation (CASE-08);
schema versions and upcasting; the JSON Schema of every kind."""

import json

import pytest
from pydantic import ValidationError

from events.records import from_record, to_record
from events.types import EVENT_CLASSES, UnknownEventType, json_schema, parse_event, ts_from_any, ts_to_datetime
from events.upcasting import FutureSchemaVersion

DOMAIN_KINDS = {
    "SessionOpened",
    "InputAppended",
    "TurnCommitted",
    "StageRequestReserved",
    "StageRequestSubmitted",
    "StageRequestForwarded",
    "StageOutput",
    "StageRequestFinished",
    "StageMetricsReported",
    "TransferTx",
    "ActiveRequestBound",
    "ResponseBegun",
    "ResponseEnded",
    "TurnCompleted",
    "CancelRequested",
    "EpochAdvanced",
    "StageRequestReleased",
    "StageRequestRestored",
    "AbortRequested",
    "AbortResult",
    "ReleaseRequested",
    "ReleaseResult",
    "TurnFinalized",
    "SessionClosed",
}


def test_every_domain_kind_exists():
    assert DOMAIN_KINDS <= set(EVENT_CLASSES)


def test_events_are_frozen():
    e = parse_event({"type": "SessionClosed", "session_id": "s1", "ts": 1.0})
    with pytest.raises(ValidationError):
        e.reason = "x"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"type": "StageOutput", "session_id": "s", "ts": 1, "stage_id": "x", "request_id": "r"}, "stage_id"),
        ({"type": "StageOutput", "session_id": "s", "ts": 1, "stage_id": 0}, "request_id"),
        ({"type": "StageOutput", "session_id": "s", "ts": 1, "stage_id": 0, "request_id": "r", "bogus": 1}, "bogus"),
        ({"type": "SessionClosed", "session_id": "", "ts": 1}, "session_id"),
        ({"type": "SessionClosed", "session_id": "s", "ts": "yesterday"}, "ts"),
    ],
)
def test_validation_error_names_type_and_field(data, field):
    with pytest.raises(ValidationError) as err:
        parse_event(data)
    text = str(err.value)
    assert data["type"] in text and field in text


def test_unknown_type():
    with pytest.raises(UnknownEventType, match="Bogus"):
        parse_event({"type": "Bogus", "session_id": "s", "ts": 1})


def test_ts_normalised_to_utc_microseconds():
    assert ts_from_any("2025-09-04T15:33:40+00:00") == 1757000020.0
    assert ts_from_any("2025-09-04T23:33:40+08:00") == 1757000020.0
    assert ts_from_any("2025-09-04T15:33:40.850001Z") == 1757000020.850001
    assert ts_to_datetime(1757000020.850001).isoformat() == "2025-09-04T15:33:40.850001+00:00"
    assert ts_to_datetime(1757000020.0).isoformat() == "2025-09-04T15:33:40+00:00"
    with pytest.raises(ValueError, match="timezone"):
        ts_from_any("2025-09-04T15:33:40")


def test_record_round_trip_is_exact():
    e = parse_event({"type": "ResponseEnded", "session_id": "s", "ts": 1757000020.850001, "response_id": "r"})
    r = to_record(e)
    assert r.ts_us == 1757000020850001
    back = from_record(r.type, r.schema_version, r.stream_id, r.event_id, r.ts_us, r.data)
    assert back == e


def test_v1_submitted_row_upcasts_to_current():
    back = from_record(
        "StageRequestSubmitted",
        1,
        "s1",
        "00000000-0000-0000-0000-000000000001",
        1_000_000,
        {"stage_id": 0, "request_id": "x", "tokens_in": 64},
    )
    assert back.num_tokens_in == 64 and back.schema_version == 2


def test_future_version_is_refused():
    with pytest.raises(FutureSchemaVersion, match="upgrade"):
        from_record("SessionClosed", 9, "s1", "00000000-0000-0000-0000-000000000001", 1, {"reason": "x"})


def test_json_schema_covers_all_kinds():
    schema = json_schema()
    text = json.dumps(schema)
    for kind in EVENT_CLASSES:
        assert kind in text
    assert "discriminator" in text


def test_unstorable_values_are_refused_naming_each_field():
    """DOMAIN §5.7 D12 (issue 23: one check of the whole model): every field that cannot be
    stored is named, with check_value's reason; a nested model's field carries its path;
    storable values in range pass, and a big value in a free-form field is found inside it."""
    from events.types import StageMetricsReported, StageOutput, StageRequestReserved

    with pytest.raises(ValidationError) as caught:
        StageOutput(session_id="s", ts=1.0, stage_id=2**63, request_id="r", num_new_tokens=1, text_delta="a\ud800")
    errors = [(e["type"], e["loc"], e["msg"]) for e in caught.value.errors()]
    assert errors == [
        ("value_error", ("stage_id",), "Value error, integer 9223372036854775808 does not fit in 64 bits (signed)"),
        (
            "value_error",
            ("text_delta",),
            "Value error, text cannot be stored as UTF-8 (surrogates not allowed at index 1)",
        ),
    ]
    assert "1 validation error for StageRequestReserved\nfence.epoch" in str(
        pytest.raises(
            ValidationError,
            StageRequestReserved,
            session_id="s",
            ts=1.0,
            stage_id=0,
            request_id="r",
            fence={"epoch": -(2**63) - 1},
        ).value
    )
    with pytest.raises(ValidationError, match=r"stats\n.*number at extra\['k'\]\[1\] nan is not finite"):
        StageMetricsReported(
            session_id="s", ts=1.0, stage_id=0, request_id="r", stats={"extra": {"k": [1.0, float("nan")]}}
        )
    ok = StageOutput(session_id="s", ts=1.0, stage_id=2**63 - 1, request_id="ré", num_new_tokens=0, text_delta="日本")
    assert ok.stage_id == 2**63 - 1 and ok.text_delta == "日本"
