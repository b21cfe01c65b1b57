"""The door is strict, and the same on both backends (issue 22).

Event fields are validated in pydantic's strict mode when an event is built or imported:
``"3"`` is not ``3``, ``true`` is not ``1``, ``"yes"`` is not ``true``; an import names the
line, the field and the value. Stream (session) ids longer than ``MAX_STREAM_ID_BYTES`` and
request ids longer than ``MAX_REQUEST_ID_BYTES`` (bytes of UTF-8) are refused at the door on
SQLite and PostgreSQL alike, naming the line, before anything is written. Committed logs
(``tests/cases/logs``, the examples' traces) still import and read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from events.limits import MAX_REQUEST_ID_BYTES, MAX_STREAM_ID_BYTES
from events.store import EventStore, InvalidRow
from events.structs import struct_of
from events.types import ResponseBegun, SessionOpened, StageRequestSubmitted, TurnCommitted, parse_event
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli

ROOT = Path(__file__).resolve().parents[2]

LINE = {
    "stream": "S1",
    "type": "TurnCommitted",
    "ts": 110.9,
    "event_id": "00000000-0000-0000-0000-000000000006",
    "data": {"turn_id": 1, "create_response": True, "action": "COMMIT_ONLY", "response_id": "r1"},
}
SUBMIT = {
    "stream": "S1",
    "type": "StageRequestSubmitted",
    "ts": 111.0,
    "data": {"stage_id": 0, "request_id": "duplex-s.UzE.i.0.e.0.r.stage0_t1", "num_tokens_in": 80},
}
# (field, lax value pydantic would have coerced, how the error names it)
LAX = [
    ("turn_id", "3", "'3'"),
    ("turn_id", True, "True"),
    ("turn_id", 3.0, "3.0"),
    ("create_response", 1, "1"),
    ("create_response", "yes", "'yes'"),
    ("create_response", "true", "'true'"),
    ("response_id", 7, "7"),
]


@pytest.fixture
def cli(db_url: str) -> Cli:
    return Cli(db_url)


@pytest.fixture
def sqlite_cli(sqlite_url: str) -> Cli:
    return Cli(sqlite_url)


def _write(tmp_path: Path, *lines: dict) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _with(line: dict, **data: object) -> dict:
    return {**line, "data": {**line["data"], **data}}


@pytest.mark.parametrize(("field", "value", "shown"), LAX, ids=[f"{f}={v!r}" for f, v, _ in LAX])
def test_import_refuses_a_lax_value_naming_line_field_and_value(
    cli: Cli, tmp_path: Path, field: str, value: object, shown: str
) -> None:
    assert cli("db", "upgrade").exit_code == 0
    path = _write(tmp_path, LINE | {"event_id": "00000000-0000-0000-0000-000000000001"}, _with(LINE, **{field: value}))
    result = cli("events", "import", str(path))
    assert result.exit_code == 2, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"line 2: TurnCommitted.{field}: ") and shown in first, first
    assert "line 1" not in result.output
    assert cli("events", "export").output == ""  # nothing imported


@pytest.mark.parametrize(("field", "value"), [("turn_id", "3"), ("create_response", 1), ("create_response", "yes")])
def test_building_an_event_is_strict(field: str, value: object) -> None:
    """The append path's door: a model built from lax values is refused."""
    fields = {"turn_id": 1, "create_response": True, field: value}
    with pytest.raises(ValidationError, match=field):
        TurnCommitted(session_id="S1", ts=1.0, **fields)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=field):
        parse_event({"type": "TurnCommitted", "session_id": "S1", "ts": 1.0, **fields})


def test_event_id_text_ts_spellings_and_int_for_float_still_pass() -> None:
    """What is no type confusion stays accepted: a UUID's text, ISO-8601 ``ts``, an int where a
    float is declared."""
    event = parse_event(
        {"type": "SessionOpened", "session_id": "S", "ts": "2025-09-04T23:33:40+08:00", "event_id": LINE["event_id"]}
    )
    assert str(event.event_id) == LINE["event_id"] and event.ts == 1757000020.0
    assert TurnCommitted(session_id="S", ts=5, turn_id=1, overlap_speech_ms=2).overlap_speech_ms == 2.0


COMMITTED = sorted(
    [*LOG_DIR.glob("*.jsonl"), *(LOG_DIR.parent / "field").glob("*.jsonl"), ROOT / "tests/cli/data/overflow.jsonl"]
)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_logs_still_import(tmp_path: Path, path: Path) -> None:
    result = Cli(f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}")("events", "import", str(path))
    assert result.exit_code == 0, result.output


def test_the_examples_still_parse() -> None:
    from reports.traces import parse_trace

    examples = sorted((ROOT / "examples").glob("*.jsonl"))
    assert len(examples) == 3
    for path in examples:
        assert parse_trace(path).lines, path


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ({**SUBMIT, "stream": "s" * (MAX_STREAM_ID_BYTES + 1)}, "stream"),
        ({**SUBMIT, "stream": "é" * (MAX_STREAM_ID_BYTES // 2 + 1)}, "stream"),  # bytes, not characters
        ({**SUBMIT, "stream": "s" * 10_000_000}, "stream"),
        (_with(SUBMIT, request_id="r" * (MAX_REQUEST_ID_BYTES + 1)), "data.request_id"),
        (
            {
                "stream": "S1",
                "type": "AbortRequested",
                "ts": 112.0,
                "data": {"request_ids": ["ok", "r" * (MAX_REQUEST_ID_BYTES + 1)]},
            },
            "data.request_ids[1]",
        ),
    ],
    ids=["stream", "stream-utf8", "stream-10MB", "request_id", "request_ids"],
)
def test_a_too_long_id_is_refused_at_the_door_naming_the_line(cli: Cli, tmp_path: Path, line: dict, field: str) -> None:
    assert cli("db", "upgrade").exit_code == 0
    path = _write(tmp_path, _with(SUBMIT, request_id="fine"), line)
    result = cli("events", "import", str(path))
    assert result.exit_code == 2, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"line 2: {field}: ") and "bytes of UTF-8, longer than" in first, first[:300]
    assert cli("events", "export").output == ""


async def test_the_longest_ids_are_stored_and_read_back_and_one_more_byte_is_refused(db_url: str) -> None:
    url = db_url
    longest_stream, longest_request = "s" * MAX_STREAM_ID_BYTES, "é" * (MAX_REQUEST_ID_BYTES // 2)
    store = await EventStore.open(url, create=True)
    try:
        await store.append(longest_stream, [SessionOpened(session_id=longest_stream, ts=1.0)], expected_version=0)
        submit = StageRequestSubmitted(session_id=longest_stream, ts=2.0, stage_id=0, request_id=longest_request)
        await store.append(longest_stream, [submit], expected_version=1)
        back = await store.read_stream(longest_stream)
        assert [e.event for e in back][1] == struct_of(submit)
        over = "s" * (MAX_STREAM_ID_BYTES + 1)
        with pytest.raises(InvalidRow, match="session_id: stream .session. id is 257 bytes"):
            await store.append(over, [SessionOpened(session_id=over, ts=1.0)], expected_version=0)
        begun = ResponseBegun(session_id=longest_stream, ts=3.0, response_id="r", request_id=longest_request + "x")
        with pytest.raises(InvalidRow, match="request_id: request id is 513 bytes"):
            await store.append(longest_stream, [begun])
        assert await store.head_position() == 2
    finally:
        await store.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
async def test_a_non_finite_number_past_validation_is_refused_naming_the_field(store: EventStore, bad: float) -> None:
    """An event built around validation (``model_copy(update=…)``) with a NaN/inf: pydantic
    wrote it as ``null``, which the store took and could not read back (every later read of
    the log failed naming no position; hostile retest of issue 23). The models now write the
    token, and the append refuses it naming the field (DOMAIN §5.7 D12); nothing is written."""
    await store.append("S1", [SessionOpened(session_id="S1", ts=1.0)], expected_version=0)
    turn = TurnCommitted(session_id="S1", ts=2.0, turn_id=0, response_id="r1", create_response=True)
    for many in (False, True):  # the one-event call and the several-event call
        events = [turn.model_copy(update={"overlap_speech_ms": bad})]
        if many:
            events.insert(0, turn.model_copy(update={"turn_id": 1, "response_id": "r0"}))
        with pytest.raises(InvalidRow, match=r"number at overlap_speech_ms -?(nan|inf) is not finite"):
            await store.append("S1", events, expected_version=1)
    text = turn.model_copy(update={"response_id": "NaN-Infinity"})  # a text that spells the tokens
    await store.append("S1", [text], expected_version=1)
    assert [s.event.type for s in await store.read_stream("S1")] == ["SessionOpened", "TurnCommitted"]
