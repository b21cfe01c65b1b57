"""The structs (events.structs, the one runtime shape of every event) decode stored rows to
exactly the models' values, and every row msgspec refuses falls back to the pydantic path with
the model's own error — and still reads back as the struct."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from pydantic import ValidationError

import events.structs
from benchmarks.synthetic import generate
from events.jsonl import parse_lines
from events.records import decode_row, validate_row_json
from events.store.rows import NewRow, StoredRow, decode_rows
from events.structs import STRUCT_TYPES, decode_payload, struct_of, struct_type
from events.types import EVENT_CLASSES, Fence, StageOutput, parse_event

LOGS = Path(__file__).resolve().parents[1] / "cases" / "logs"


def _rows() -> list[NewRow]:
    rows = [NewRow.from_import(r) for path in sorted(LOGS.glob("*.jsonl")) for r in parse_lines(path.open())]
    for ts, type_name, sid, payload in generate(6, 6):
        event = parse_event({"type": type_name, "session_id": sid, "ts": ts, **payload})
        rows.append(NewRow.from_event(event))
    return rows


ROWS = _rows()


def _model_values(row: NewRow) -> dict:
    model = validate_row_json(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
    values = model.model_dump()
    for name in type(model).model_fields:  # the fields a serializer leaves out while unset
        values.setdefault(name, getattr(model, name))
    values["event_id"] = str(values["event_id"])
    return values


def test_rows_cover_most_event_types() -> None:
    assert len({r.type for r in ROWS}) >= 20


def test_struct_has_the_models_values_for_every_case_and_synthetic_row() -> None:
    for row in ROWS:
        struct = decode_payload(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
        assert struct is not None, row
        assert msgspec.to_builtins(struct) == msgspec.to_builtins(_model_values(row)), row
        assert struct.type == row.type and struct.session_id == row.stream_id, row
        # the live hand-off of the validated model gives the very same struct
        model = validate_row_json(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
        assert struct_of(model) == struct and type(struct_of(model)) is type(struct), row


def test_every_event_type_has_one_struct_with_the_same_fields() -> None:
    assert set(STRUCT_TYPES) == set(EVENT_CLASSES)
    assert len(set(STRUCT_TYPES.values())) == len(EVENT_CLASSES)
    for name, cls in EVENT_CLASSES.items():
        assert set(struct_type(cls).__struct_fields__) == set(cls.model_fields), name
        assert STRUCT_TYPES[name] is struct_type(cls)
        assert getattr(events.structs, name) is struct_type(cls), name  # the checkpoint codec's names


def test_struct_keeps_helper_methods() -> None:
    fence = struct_type(Fence)(incarnation=1, epoch=2, turn_id=3)
    assert fence.key() == (1, 2, 3)
    assert struct_of(Fence(incarnation=1, epoch=2, turn_id=3)) == fence
    assert struct_of(fence) is fence
    with pytest.raises(TypeError, match="not an event"):
        struct_of({"type": "StageOutput"})


EID = "00000000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    "data, field",
    [
        ('{"stage_id":-1,"request_id":"x"}', "stage_id"),  # constraint (ge=0)
        ('{"stage_id":0,"request_id":"x","num_new_tokens":"a"}', "num_new_tokens"),  # wrong type
        ('{"stage_id":0,"request_id":"x","bogus":1}', "bogus"),  # unknown field
        ('{"stage_id":0,"request_id":"x"', "EOF"),  # broken JSON
    ],
)
def test_refused_rows_raise_the_models_error(data: str, field: str) -> None:
    assert decode_payload("StageOutput", 1, "S", EID, 1_000_000, data) is None
    with pytest.raises(ValidationError) as info:
        decode_row("StageOutput", 1, "S", EID, 1_000_000, data)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "field, value", [("session_id", '"other"'), ("ts", "5.0"), ("event_id", '"00000000-0000-0000-0000-0000000000ff"')]
)
def test_envelope_field_inside_the_payload_is_refused_on_both_paths(field: str, value: str) -> None:
    data = f'{{"stage_id":0,"request_id":"x","{field}":{value}}}'
    assert decode_payload("StageOutput", 1, "S", EID, 1_000_000, data) is None
    for decode in (decode_row, validate_row_json):
        with pytest.raises(ValueError, match=field):
            decode("StageOutput", 1, "S", EID, 1_000_000, data)


def test_a_row_only_pydantic_accepts_still_reads_back_as_the_struct() -> None:
    """Lax pydantic coercion ("5" -> 5) that msgspec refuses: the model path decides, and the
    reader still gets the struct."""
    data = '{"stage_id":0,"request_id":"x","num_new_tokens":"5"}'
    assert decode_payload("StageOutput", 1, "S", EID, 1_000_000, data) is None
    event = decode_row("StageOutput", 1, "S", EID, 1_000_000, data)
    assert type(event) is struct_type(StageOutput) and event.num_new_tokens == 5 and event.event_id == EID


def test_old_schema_version_rows_are_upcast_to_the_struct() -> None:
    data = '{"stage_id":0,"request_id":"duplex-s.UzE.i.0.e.0.r.stage0_t0","tokens_in":7}'
    event = decode_row("StageRequestSubmitted", 1, "S1", "00000000-0000-0000-0000-000000000002", 2_000_000, data)
    assert type(event) is STRUCT_TYPES["StageRequestSubmitted"]
    assert event.num_tokens_in == 7 and event.schema_version == 2 and event.ts == 2.0


def test_decode_rows_gives_positions_and_structs() -> None:
    row = NewRow.from_event(StageOutput(session_id="S", ts=1.5, stage_id=0, request_id="r", num_new_tokens=2))
    stored = StoredRow(7, row.stream_id, 3, row.event_id, row.type, row.schema_version, row.ts_us, 2_000_000, row.data)
    [decoded] = decode_rows([stored])
    assert (decoded.position, decoded.version, decoded.recorded_at) == (7, 3, 2.0)
    assert type(decoded.event) is struct_type(StageOutput) and not isinstance(decoded.event, StageOutput)
    assert stored.decode() == decoded
    assert decoded.event.ts == 1.5 and decoded.event.num_new_tokens == 2
