"""The read-side twins (events.structs) decode stored rows to exactly the models' values, and
every row a twin refuses falls back to the pydantic path with the model's own error."""

from __future__ import annotations

import pickle
from pathlib import Path

import msgspec
import pytest
from pydantic import ValidationError

from benchmarks.synthetic import generate
from events.jsonl import parse_lines
from events.records import from_row_json, struct_from_row_json
from events.store.rows import NewRow, StoredRow, decode_rows
from events.structs import decode_payload, twin_of
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
    model = from_row_json(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
    values = model.model_dump()
    values["event_id"] = str(values["event_id"])
    return values


def test_rows_cover_most_event_types() -> None:
    assert len({r.type for r in ROWS}) >= 20


def test_twin_has_the_models_values_for_every_case_and_synthetic_row() -> None:
    for row in ROWS:
        twin = decode_payload(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
        assert twin is not None, row
        assert msgspec.to_builtins(twin) == msgspec.to_builtins(_model_values(row)), row
        assert twin.type == row.type and twin.session_id == row.stream_id, row


def test_every_event_type_has_a_twin_with_the_same_fields() -> None:
    for name, cls in EVENT_CLASSES.items():
        assert set(twin_of(cls).__struct_fields__) == set(cls.model_fields), name


def test_twin_keeps_helper_methods_and_pickles() -> None:
    fence = twin_of(Fence)(incarnation=1, epoch=2, turn_id=3)
    assert fence.key() == (1, 2, 3)
    assert pickle.loads(pickle.dumps(fence)) == fence
    row = next(r for r in ROWS if r.type == "StageOutput")
    twin = decode_payload(row.type, row.schema_version, row.stream_id, row.event_id, row.ts_us, row.data)
    assert pickle.loads(pickle.dumps(twin)) == twin


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
        struct_from_row_json("StageOutput", 1, "S", EID, 1_000_000, data)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "field, value", [("session_id", '"other"'), ("ts", "5.0"), ("event_id", '"00000000-0000-0000-0000-0000000000ff"')]
)
def test_envelope_field_inside_the_payload_is_refused_on_both_paths(field: str, value: str) -> None:
    data = f'{{"stage_id":0,"request_id":"x","{field}":{value}}}'
    assert decode_payload("StageOutput", 1, "S", EID, 1_000_000, data) is None
    for decode in (struct_from_row_json, from_row_json):
        with pytest.raises(ValueError, match=field):
            decode("StageOutput", 1, "S", EID, 1_000_000, data)


def test_a_row_only_pydantic_accepts_decodes_to_the_model() -> None:
    """Lax pydantic coercion ("5" -> 5) that msgspec refuses: the model path decides."""
    data = '{"stage_id":0,"request_id":"x","num_new_tokens":"5"}'
    assert decode_payload("StageOutput", 1, "S", EID, 1_000_000, data) is None
    assert struct_from_row_json("StageOutput", 1, "S", EID, 1_000_000, data).num_new_tokens == 5


def test_old_schema_version_rows_are_upcast_to_models() -> None:
    data = '{"stage_id":0,"request_id":"duplex-s.UzE.i.0.e.0.r.stage0_t0","tokens_in":7}'
    event = struct_from_row_json(
        "StageRequestSubmitted", 1, "S1", "00000000-0000-0000-0000-000000000002", 2_000_000, data
    )
    assert event.num_tokens_in == 7 and event.schema_version == 2


def test_decode_rows_gives_positions_and_twins() -> None:
    row = NewRow.from_event(StageOutput(session_id="S", ts=1.5, stage_id=0, request_id="r", num_new_tokens=2))
    stored = StoredRow(7, row.stream_id, 3, row.event_id, row.type, row.schema_version, row.ts_us, 2_000_000, row.data)
    [as_struct] = decode_rows([stored], as_struct=True)
    [as_model] = decode_rows([stored])
    assert (as_struct.position, as_struct.version, as_struct.recorded_at) == (7, 3, 2.0)
    assert isinstance(as_model.event, StageOutput) and not isinstance(as_struct.event, StageOutput)
    assert as_struct.event.ts == as_model.event.ts == 1.5
    assert as_struct.event.num_new_tokens == as_model.event.num_new_tokens == 2
