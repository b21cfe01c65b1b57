"""Malformed JSONL corpus: every bad line is refused with exit 2 naming its line, and the
ledger's data is unchanged (issue 11 points 1, 4, 7; DOMAIN §5.7 D12). SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest

from tests.reliability.support import LOG, cli, export, refused_cleanly

STORED_ID = "00000000-0000-0000-0000-000000000001"  # first event of case-12-arrival (stream S1)
GOOD = '{"stream":"N1","type":"SessionClosed","ts":1757000000,"data":{}}'


def line(data: object = None, **envelope: object) -> str:
    obj = {"stream": "N1", "type": "TurnCommitted", "ts": 1757000001, "data": {"turn_id": 0}}
    obj.update(envelope)
    if data is not None:
        obj["data"] = data
    return json.dumps(obj, allow_nan=True)


def stats(**fields: object) -> str:
    return line({"stage_id": 0, "request_id": "r", **fields}, type="StageMetricsReported")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


STORED = json.loads(LOG.read_text().splitlines()[0])
CORPUS: dict[str, str | bytes] = {
    "not json": "this is not json",
    "truncated": GOOD[:-3],
    "array": "[1, 2]",
    "number": "42",
    "null": "null",
    "string": '"x"',
    "missing stream": line(stream=None).replace('"stream": null, ', ""),
    "missing data": '{"stream":"N1","type":"SessionClosed","ts":1}',
    "missing ts": '{"stream":"N1","type":"SessionClosed","data":{}}',
    "missing type": '{"stream":"N1","ts":1,"data":{}}',
    "unknown field": line(colour="red"),
    "data not object": line(data=[1]),
    "envelope in data": line({"turn_id": 0, "ts": 5}),
    "type not string": line(type=7),
    "unknown type": line(type="Nope"),
    "stream not string": line(stream=["S"]),
    "stream empty": line(stream=""),
    "stream with NUL": line(stream="S\u0000x"),
    "stream lone surrogate": line(stream="S\ud800"),
    "ts NaN": line(ts=float("nan")),
    "ts Infinity": line(ts=float("inf")),
    "ts -Infinity": line(ts=float("-inf")),
    "ts 1e400": line().replace('"ts": 1757000001', '"ts": 1e400'),
    "ts negative": line(ts=-0.5),
    "ts 1e13": line(ts=1e13),
    "ts 10**30": line(ts=10**30),
    "ts ISO before 1970": line(ts="1969-12-31T23:59:59.5+00:00"),
    "ts ISO year 10000": line(ts="10000-01-01T00:00:00+00:00"),
    "ts ISO naive": line(ts="2025-01-01T00:00:00"),
    "ts bool": line(ts=True),
    "ts text": line(ts="soon"),
    "float Infinity": line({"turn_id": 0, "overlap_speech_ms": float("inf")}),
    "float 1e400": line().replace('"turn_id": 0}', '"turn_id": 0, "overlap_speech_ms": 1e400}'),
    "engine stamp NaN": stats(engine_first_token_ts={"clock": "engine_monotonic", "s": float("nan")}),
    "stats NaN": stats(stats={"vllm_ttft_ms": float("nan")}),
    "stats list inf": stats(stats={"vllm_itls_ms": [1.0, float("inf")]}),
    "extra NaN": stats(stats={"extra": {"k": float("nan")}}),
    "extra int 2**64": stats(stats={"extra": {"k": 2**64}}),
    "extra nested 40": stats(stats={"extra": {"k": json.loads(nested(40))}}),
    "int 2**63": line({"turn_id": 2**63}),
    "int -2**63-1 in list": line({"request_ids": ["x"], "stage_ids": [-(2**63) - 1]}, type="AbortRequested"),
    "text lone surrogate": line({"command": "c\udc80", "error_code": "e", "message": "m"}, type="CommandRejected"),
    "surrogate data key": line({"turn_id": 0, "\ud800": 1}),
    "nested 3000 deep": '{"stream":"N1","type":"SessionClosed","ts":1,"data":{"x":' + nested(3000) + "}}",
    "integer of 5000 digits": '{"stream":"N1","type":"SessionClosed","ts":1,"data":{},"version":' + "9" * 5000 + "}",
    "non-UTF-8 byte": b'{"stream":"N1","type":"SessionClosed","ts":1,"data":{"reason":"\xff"}}',
    "version 0": line(version=0),
    "version 2**63": line(version=2**63),
    "version text": line(version="1"),
    "version bool": line(version=True),
    "schema_version future": line(schema_version=99),
    "schema_version 0": line(schema_version=0),
    "recorded_at NaN": line(recorded_at=float("nan")),
    "recorded_at negative": line(recorded_at=-1),
    "event_id not uuid": line(event_id="not-a-uuid"),
    "event_id stored with other ts": json.dumps({**STORED, "ts": STORED["ts"] + 1}),
    "event_id stored with other data": json.dumps({**STORED, "data": {**STORED["data"], "size_bytes": 1}}),
    "event_id stored in another stream": json.dumps({**STORED, "stream": "OTHER"}),
    "version conflict": json.dumps({**STORED, "event_id": None, "version": 1}),
}


@pytest.fixture
def ledger(db_url: str) -> str:
    assert cli("db", "upgrade", "--db", db_url).exit_code == 0
    assert cli("events", "import", str(LOG), "--db", db_url).exit_code == 0
    return db_url


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_bad_line_is_refused_naming_it_and_nothing_changes(ledger: str, tmp_path, name: str) -> None:
    bad = CORPUS[name]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        GOOD.encode() + b"\n" + (bad if isinstance(bad, bytes) else bad.encode("utf-8", "surrogatepass")) + b"\n"
    )
    before = export(ledger)
    result = cli("events", "import", str(path), "--db", ledger)
    refused_cleanly(result, 2, max_lines=4)
    assert "line 2" in result.output and "line 1" not in result.output, result.output
    assert export(ledger) == before


def test_corpus_covers_the_issue() -> None:
    """The corpus holds the issue's examples and stays large enough to mean something."""
    assert len(CORPUS) >= 55
    assert {
        "float Infinity",
        "float 1e400",
        "engine stamp NaN",
        "ts ISO before 1970",
        "nested 3000 deep",
        "non-UTF-8 byte",
        "text lone surrogate",
        "event_id stored with other data",
    } <= CORPUS.keys()


def test_same_id_same_content_is_a_no_op(ledger: str, tmp_path) -> None:
    """Re-importing an export is harmless; only *different* content is a conflict (point 4)."""
    path = tmp_path / "again.jsonl"
    path.write_text(export(ledger))
    before = export(ledger)
    result = cli("events", "import", str(path), "--db", ledger)
    assert result.exit_code == 0 and "imported 0 event(s)" in result.output
    assert export(ledger) == before
