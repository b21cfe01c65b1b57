"""Models built from twins without a second validation (events.model_rows) equal the validated
models for every case and synthetic row, and every row that validation refuses — D12 values
included — takes the validating path and raises the model's own error."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from events.model_rows import model_from_row, plan_of
from events.records import from_row_json, validate_row_json
from events.types import EventBase
from tests.events.test_structs import ROWS

EID = "00000000-0000-0000-0000-000000000001"


def _shape(value: Any) -> Any:
    """The value with every leaf's type spelled out (1 and 1.0, "1" and 1 differ)."""
    if isinstance(value, BaseModel):
        return (type(value).__name__, {k: _shape(v) for k, v in value.__dict__.items()})
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shape(v) for v in value]
    return (type(value).__name__, value)


def test_built_model_equals_the_validated_model_for_every_case_and_synthetic_row() -> None:
    built = 0
    for row in ROWS:
        args = (row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
        reference = validate_row_json(*args)
        fast = model_from_row(*args)
        if fast is None:
            continue
        built += 1
        assert fast == reference, row
        assert _shape(fast) == _shape(reference), row
        assert fast.model_dump_json() == reference.model_dump_json(), row
    assert built >= len(ROWS) * 0.95


def test_fields_set_is_every_field_but_schema_version_for_a_row_the_store_wrote() -> None:
    row = next(r for r in ROWS if r.type == "StageMetricsReported" and '"stats"' in r.data)
    args = (row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
    fast, reference = model_from_row(*args), validate_row_json(*args)
    assert fast is not None
    assert fast.model_fields_set == reference.model_fields_set == set(type(fast).model_fields) - {"schema_version"}
    assert fast.stats.model_fields_set == reference.stats.model_fields_set  # type: ignore[attr-defined]
    copied = fast.model_copy(update={"stage_id": 3})  # the shared set is not changed by a copy
    assert copied.stage_id == 3 and fast.stage_id != 3  # type: ignore[attr-defined]
    assert model_from_row(*args).model_fields_set == reference.model_fields_set  # type: ignore[union-attr]


OUTPUT = '{"stage_id":0,"request_id":"x","text_delta":%s}'
METRICS = '{"stage_id":0,"request_id":"x","stats":{"extra":{"k":%s}}}'


@pytest.mark.parametrize(
    "type_name, data, ts_us, stream, event_id, words",
    [
        ("StageMetricsReported", METRICS % "9223372036854775808", 1, "S", EID, "64 bits"),  # D12: int
        ("StageMetricsReported", METRICS % "-9223372036854775809", 1, "S", EID, "64 bits"),
        ("StageOutput", '{"stage_id":0,"request_id":"x","num_new_tokens":9223372036854775808}', 1, "S", EID, "64 bits"),
        ("AbortRequested", '{"stage_ids":[1,-9223372036854775809]}', 1, "S", EID, "64 bits"),
        ("StageMetricsReported", METRICS % "1e400", 1, "S", EID, "finite"),  # D12: inf
        ("StageOutput", OUTPUT % '"\\ud800"', 1, "S", EID, "escape"),  # D12: UTF-8
        ("StageMetricsReported", METRICS % ("[" * 40 + "]" * 40), 1, "S", EID, "nested"),  # D12: depth
        ("StageOutput", OUTPUT % '"a"', -1, "S", EID, "ts"),  # D12: ts range
        ("StageOutput", OUTPUT % '"a"', 1, "", EID, "session_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S\x00", EID, "NUL"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "not-a-uuid", "event_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "0000000A-0000-0000-0000-000000000001", "event_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "0000_000-0000-0000-0000-000000000001", "event_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "0x000000-0000-0000-0000-000000000001", "event_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "0000000g-0000-0000-0000-000000000001", "event_id"),
        ("StageOutput", OUTPUT % '"a"', 1, "S", "00000000000000000000-0000-0000000001", "event_id"),
        ("StageRequestForwarded", '{"stage_id":0,"request_id":"x"}', 1, "S", EID, "stage_id >= 1"),
        ("ResponseBegun", '{"response_id":"r","commit_ts":-5.0}', 1, "S", EID, "outside"),
    ],
)
def test_rows_validation_refuses_take_the_validating_path(
    type_name: str, data: str, ts_us: int, stream: str, event_id: str, words: str
) -> None:
    args = (type_name, 1, stream, event_id, ts_us, data)
    assert model_from_row(*args) is None
    with pytest.raises((ValidationError, ValueError)) as info:
        from_row_json(*args)
    assert words.lower() in str(info.value).lower()


def test_replayed_ts_validator_normalises_like_the_model() -> None:
    data = '{"response_id":"r","commit_ts":12}'
    args = ("ResponseBegun", 1, "S", EID, 5, data)
    fast = model_from_row(*args)
    assert fast is not None and _shape(fast) == _shape(validate_row_json(*args))
    assert type(fast.commit_ts) is float  # type: ignore[attr-defined]


def test_a_model_with_a_validator_not_replayed_takes_the_pydantic_path() -> None:
    class Checked(EventBase):
        note: str = ""

        @field_validator("note")
        @classmethod
        def _upper(cls, v: str) -> str:
            return v.upper()

    assert plan_of(Checked) is None
    assert plan_of(type("Plain", (EventBase,), {"__annotations__": {"note": str}, "note": ""})) is not None


def test_event_id_is_the_same_uuid_as_validation_gives() -> None:
    for row in ROWS[:50]:
        args = (row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
        fast, reference = model_from_row(*args), validate_row_json(*args)
        assert fast is not None
        assert fast.event_id == reference.event_id and str(fast.event_id) == row.event_id
        assert hash(fast.event_id) == hash(reference.event_id) and fast.event_id.is_safe == reference.event_id.is_safe


@pytest.mark.parametrize("ts", [72057594038.625, 9007199254.740993, 1757000000.123456, 253402300799.99997])
def test_a_late_ts_reads_back_exactly(ts: float) -> None:
    """ts_to_us is exact (round(ts * 1e6) lost the last digits past 2**53 µs: 72057594038.625
    was stored as ...624992 µs and read back as 72057594038.62498)."""
    from events.store.rows import NewRow
    from events.types import EpochAdvanced, ts_to_us

    event = EpochAdvanced(session_id="S", ts=ts, old_epoch=0, new_epoch=1)
    row = NewRow.from_event(event)
    assert row.ts_us / 1_000_000 == event.ts == ts and ts_to_us(ts) == row.ts_us
    back = from_row_json(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
    assert back == event


def test_the_bracket_count_is_skipped_only_where_no_value_can_nest() -> None:
    """A model of scalars only (StageOutput) cannot hold a nested value, so brackets inside
    its text fields do not send it to validation; a model with a free-form or list field
    (StageMetricsReported, AbortRequested) still counts them."""
    from events.model_rows import _PLANS

    assert _PLANS[("StageOutput", 1)].flat
    assert not _PLANS[("StageMetricsReported", 1)].flat and not _PLANS[("AbortRequested", 1)].flat
    args = ("StageOutput", 1, "S", EID, 1, OUTPUT % ('"' + "[{" * 40 + '"'))
    fast = model_from_row(*args)
    assert fast is not None and _shape(fast) == _shape(validate_row_json(*args))
    assert model_from_row("AbortRequested", 1, "S", EID, 1, '{"stage_ids":' + "[" * 40 + "]" * 40 + "}") is None
