"""Property (issue 11 point 1, DOMAIN §5.7 D12): a random value in any field of any event
kind is either refused at the door — by the model (API, live) and by the JSONL import (exit
2), both — or it round-trips exactly: append → read gives the same event, export → import
into another ledger → export gives the same line. SQLite and PostgreSQL (the copy is always
SQLite, so a PostgreSQL example crosses backends)."""

from __future__ import annotations

import asyncio
import json
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from events.jsonl import JsonlError, format_line, parse_line
from events.stats import STAT_FIELDS
from events.store import EventStore
from events.structs import struct_of
from events.types import EVENT_CLASSES, EventBase
from reports.cli_errors import exit_code

ENVELOPE = {"type", "schema_version", "event_id"}
ODD_TEXT = [
    "1969-12-31T23:59:59.5+00:00",
    "9999-12-31T23:59:59.999999+00:00",
    "2025-09-04T23:33:40+08:00",
    "2025-01-01T00:00:00",
    "0001-01-01T00:00:00+00:00",
    "\x00",
    "nan",
    "Infinity",
    "-0",
    "1e400",
    "audio",
    "initial",
    "ok",
    "stop",
    "wall",
    "",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**63) - 2, max_value=-(2**63) + 2),
    st.integers(min_value=2**63 - 2, max_value=2**63 + 2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1.0, max_value=3e11),
    st.text(st.characters(blacklist_categories=()), max_size=6),  # surrogates and NUL included
    st.sampled_from(ODD_TEXT),
)
wild = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(st.characters(blacklist_categories=()), max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
plausible = st.one_of(  # values a field of its kind may well accept, so round trips get exercised
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=1e12),
    st.booleans(),
    st.none(),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8),
    st.lists(st.text(min_size=1, max_size=3) | st.integers(0, 9) | st.floats(0, 1e3), min_size=1, max_size=3),
    st.dictionaries(
        st.text(max_size=3), st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 9), max_size=2
    ),
)
poison = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        2**63,
        -(2**63) - 1,
        2**64,
        "\ud800",
        "x\udfff",
        "S\x00",
        "1969-12-31T23:59:59.5+00:00",
        1e13,
        -0.5,
        [float("inf")],
        {"k": float("nan")},
    ]
)
values = st.one_of(plausible, wild, poison)
NESTED = {
    "fence": st.fixed_dictionaries({"incarnation": values, "epoch": values, "turn_id": values}),
    "capabilities": st.fixed_dictionaries({"supports_barge_in": values}),
    "stats": st.sampled_from([*STAT_FIELDS, "extra"]).flatmap(lambda k: st.fixed_dictionaries({k: values})),
    "engine_submit_ts": st.fixed_dictionaries({"clock": st.sampled_from(["wall", "engine_monotonic"]), "s": values}),
}


def _baseline(cls: type[EventBase]) -> dict[str, Any]:
    """A valid payload: every required field given the first candidate the model accepts."""
    payload: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if name in ENVELOPE | {"session_id", "ts"} or not field.is_required():
            continue
        literal = (
            [a for a in typing.get_args(field.annotation)]
            if typing.get_origin(field.annotation) is typing.Literal
            else []
        )
        for candidate in (*literal, 1, "r1", ["r1"]):
            try:
                cls.model_validate({**payload, name: candidate, "session_id": "S", "ts": 1.0})
            except ValidationError as exc:
                if any(e["loc"][:1] == (name,) for e in exc.errors()):
                    continue
            payload[name] = candidate
            break
    cls.model_validate({**payload, "session_id": "S", "ts": 1.0})
    return payload


BASELINES = {name: _baseline(cls) for name, cls in EVENT_CLASSES.items()}
FIELDS = sorted((name, f) for name, cls in EVENT_CLASSES.items() for f in cls.model_fields if f not in ENVELOPE)


@st.composite
def candidates(draw: st.DrawFn) -> tuple[str, str, Any]:
    type_name, field = draw(st.sampled_from(FIELDS))
    value = draw(NESTED.get(field.replace("first_token_ts", "submit_ts").replace("last_token_ts", "submit_ts"), values))
    return type_name, field, value


class Ledgers:
    """The ledger under test and a SQLite copy, on one event loop kept across examples."""

    def __init__(self, url: str, copy_url: str) -> None:
        self.runner = asyncio.Runner()
        self.source = self.runner.run(EventStore.open(url, create=True))
        self.copy = self.runner.run(EventStore.open(copy_url, create=True, synchronous="NORMAL"))
        self.tried = self.refused = self.round_tripped = 0

    def close(self) -> None:
        self.runner.run(self.source.close())
        self.runner.run(self.copy.close())
        self.runner.close()


@pytest.fixture
def ledgers(db_url: str, tmp_path) -> Iterator[Ledgers]:
    both = Ledgers(db_url, f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}")
    try:
        yield both
    finally:
        both.close()
        print(f"\npoison property: tried {both.tried}, refused {both.refused}, round-tripped {both.round_tripped}")
        assert both.refused > 0 and both.round_tripped > 0, (both.refused, both.round_tripped)


def _line(type_name: str, envelope: dict[str, Any], data: dict[str, Any]) -> str:
    obj = {
        "stream": envelope["session_id"],
        "type": type_name,
        "ts": envelope["ts"],
        "data": data,
        "event_id": str(envelope["event_id"]),
    }
    return json.dumps(obj, allow_nan=True)  # ensure_ascii: a lone surrogate is written as \\udXXX


async def _round_trip(ledgers: Ledgers, event: EventBase) -> None:
    await ledgers.source.append(event.session_id, [event])
    stored = (await ledgers.source.read_stream(event.session_id))[-1]
    assert stored.event == struct_of(event)  # every reader gets the event's struct (issue 23 step 1)
    rows = [r async for r in ledgers.source.read_rows(stored.position, until_position=stored.position)]
    exported = format_line(rows[0])
    await ledgers.copy.append_records([parse_line(exported, 1)])
    again = [r async for r in ledgers.copy.read_rows(stored.position, until_position=stored.position)]
    assert format_line(again[0]) == exported


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(candidates())
def test_every_value_round_trips_or_is_refused_at_the_door(ledgers: Ledgers, candidate: tuple[str, str, Any]) -> None:
    type_name, field, value = candidate
    cls = EVENT_CLASSES[type_name]
    envelope: dict[str, Any] = {"session_id": "S", "ts": 1757000000.25, "event_id": uuid.uuid4()}
    data = dict(BASELINES[type_name])
    (envelope if field in envelope else data)[field] = value
    ledgers.tried += 1
    try:
        event = cls.model_validate({**data, **envelope})
    except ValidationError:
        event = None
    try:
        parse_line(_line(type_name, envelope, data), 1)
        imported = True
    except JsonlError as exc:
        assert exit_code(exc) == 2
        imported = False
    assert imported == (event is not None), (type_name, field, value)
    if event is None:
        ledgers.refused += 1
        return
    ledgers.runner.run(_round_trip(ledgers, event))
    ledgers.round_tripped += 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("overlap_speech_ms", float("inf")),
        ("overlap_speech_ms", float("nan")),
        ("turn_id", 2**63),
        ("ts", "1969-12-31T23:59:59.5+00:00"),
        ("ts", 1e13),
        ("ts", float("-inf")),
        ("session_id", "S\x00"),
        ("response_id", "r\ud800"),
    ],
)
def test_the_issue_examples_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        EVENT_CLASSES["TurnCommitted"].model_validate({"session_id": "S", "ts": 1.0, "turn_id": 0, field: value})
    assert caught.value.errors()[0]["loc"][0] == field
