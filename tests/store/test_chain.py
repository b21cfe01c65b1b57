"""The hash chain (events.chain): written by the store in position order on both backends,
backfilled by revision 0003, carried by JSONL (an edited export is refused at import)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import jsonl
from events.chain import GENESIS, canonical_bytes, hash_of, link, row_hash, row_pieces
from events.store import EventStore, ImportRow, migrate
from events.store.rows import StoredRow
from reports.cli_verify import head_digest, verify_store
from tests.store.helpers import turns


def test_canonical_bytes_are_length_prefixed_and_fixed() -> None:
    b = canonical_bytes(1, "S", 2, "e", "T", 1, -5, 7, '{"ü":1}')
    assert b == (
        b"\x00" * 7
        + b"\x01"
        + b"\x00\x00\x00\x01S"
        + b"\x00" * 7
        + b"\x02"
        + b"\x00\x00\x00\x01e"
        + b"\x00\x00\x00\x01T"
        + b"\x00" * 7
        + b"\x01"
        + b"\xff" * 7
        + b"\xfb"
        + b"\x00" * 7
        + b"\x07"
        + b"\x00\x00\x00\x08"
        + '{"ü":1}'.encode()
    )
    # a field boundary cannot move: ("ab", "c") and ("a", "bc") differ
    assert canonical_bytes(1, "ab", 1, "c", "T", 1, 0, 0, "") != canonical_bytes(1, "a", 1, "bc", "T", 1, 0, 0, "")


@pytest.mark.parametrize(
    "row",
    [
        (1, "S", 2, "e", "T", 1, -5, 7, '{"ü":1}'),
        (2**62, "sessiön-\U0001f600", 2**63 - 1, "00000000-0000-0000-0000-000000000001", "StageOutput", 2, 0, -1, ""),
        (3, "", 1, "", "", 0, 2**63 - 1, -(2**63), '{"a":[1,2.5,null]}' * 50),
    ],
)
def test_pieces_linked_under_the_lock_give_the_row_hash(row: tuple) -> None:
    """The writer links pieces encoded before the lock: the same bytes as canonical_bytes."""
    position, stream, version, event_id, type_, schema_version, ts_us, recorded_at_us, data = row
    pieces = row_pieces(stream, event_id, type_, schema_version, ts_us, data)
    for previous in (GENESIS, bytes(range(32))):
        assert link(previous, position, version, recorded_at_us, pieces) == row_hash(previous, *row)


async def _rows(store: EventStore) -> list[StoredRow]:
    return [r async for r in store.read_rows(1)]


def _recomputed(rows: list[StoredRow]) -> list[bytes]:
    out, previous = [], GENESIS
    for r in rows:
        previous = hash_of(previous, r)
        out.append(previous)
    return out


async def test_every_append_path_extends_the_chain(store: EventStore) -> None:
    await store.append("S1", turns("S1", 3))
    await store.append_records([ImportRow.from_event(e) for e in turns("S2", 2)])
    await store.append("S1", turns("S1", 1, start=3))
    rows = await _rows(store)
    assert [r.hash for r in rows] == _recomputed(rows) and len(rows) == 6
    assert (await head_digest(store))[0].hash == rows[-1].hash


async def test_revision_0003_backfills_existing_logs(db_url: str) -> None:
    await migrate.upgrade(db_url, "0002_read_models")
    store = await EventStore.open(db_url, create=True)  # to head (the writer of the rows)
    await store.append("S1", turns("S1", 4))
    expected = [r.hash for r in await _rows(store)]
    await store.close()
    assert await migrate.downgrade(db_url, "0002_read_models") == "0002_read_models"
    assert await migrate.upgrade(db_url) == migrate.head_revision()
    store = await EventStore.open(db_url)
    try:
        assert [r.hash for r in await _rows(store)] == expected
        v = await verify_store(store)
        assert (v.fault, v.events) == (None, 4)
    finally:
        await store.close()


async def test_an_edited_export_is_refused_at_import(store: EventStore, tmp_path) -> None:
    await store.append("S1", turns("S1", 4))
    lines = [line async for line in jsonl.export_lines(store)]
    assert all('"hash":"' in line for line in lines)
    edited = list(lines)
    edited[2] = edited[2].replace('"turn_id":2', '"turn_id":7')
    with pytest.raises(jsonl.JsonlError) as caught:
        jsonl.parse_lines(edited)
    assert [str(e).split(":")[0:2] for e in caught.value.errors] == [["line 3", " hash"]]
    dropped = lines[:1] + lines[2:]  # line 2 removed: a gap that is not a --stream export's
    with pytest.raises(jsonl.JsonlError, match="line 2: position: 3 after 1 on the line before: position 2 is missing"):
        jsonl.parse_lines(dropped)
    swapped = [lines[0], lines[2], lines[1], lines[3]]
    with pytest.raises(jsonl.JsonlError, match="line 3: position: 2 after 3"):
        jsonl.parse_lines(swapped)
    no_fields = lines[0].replace('"position":1,', "")
    with pytest.raises(jsonl.JsonlError, match="hash: given without position"):
        jsonl.parse_lines([no_fields])
    assert len(jsonl.parse_lines(lines)) == 4


def _chained_export(events: int = 8) -> list[str]:
    """The lines of an export of a small SQLite log (every line carries its hash)."""

    async def export(path: str) -> list[str]:
        store = await EventStore.open(f"sqlite+aiosqlite:///{path}", create=True)
        try:
            await store.append("S1", turns("S1", events // 2))
            await store.append("S2", turns("S2", events - events // 2))
            return [line async for line in jsonl.export_lines(store)]
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(export(os.path.join(tmp, "l.db")))


EXPORT = _chained_export()
EDITS = {
    "none": lambda o: None,
    "ts": lambda o: o.update(ts=round(o["ts"] + 0.000001, 6)),
    "recorded_at": lambda o: o.update(recorded_at=round(o["recorded_at"] + 1, 6)),
    "stream": lambda o: o.update(stream=o["stream"] + "x"),
    "version": lambda o: o.update(version=o["version"] + 1),
    "event_id": lambda o: o.update(event_id=str(uuid.UUID(int=o["position"]))),
    "data": lambda o: (
        o["data"].update(turn_id=o["data"].get("turn_id", 0) + 1)
        if "turn_id" in o["data"]
        else o.update(ts=round(o["ts"] + 1, 6))
    ),
}


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(EXPORT) - 1), edit=st.sampled_from(sorted(EDITS)))
def test_a_line_whose_hash_key_is_dropped_is_refused_and_its_edit_caught_at_the_next(index: int, edit: str) -> None:
    """Dropping the ``hash`` key of a line (edited or not) in a chained export: the line is
    refused as hashless, and its hash is still recomputed, so an edit of it breaks the next
    line's link (issue 12: it used to make the next line uncheckable)."""
    obj = json.loads(EXPORT[index])
    del obj["hash"]
    EDITS[edit](obj)
    lines = list(EXPORT)
    lines[index] = json.dumps(obj, separators=(",", ":"))
    with pytest.raises(jsonl.JsonlError) as caught:
        jsonl.parse_lines(lines)
    faults = {(e.line, e.field, e.message.split(",")[0].split(" (")[0]) for e in caught.value.errors}
    expected = {(index + 1, "hash", "missing")}
    if edit != "none" and index + 1 < len(EXPORT):
        expected.add((index + 2, "hash", "does not match the line and the chain before it"))
    assert faults == expected


def test_a_file_without_any_hash_imports_unverified_and_one_with_a_single_hash_is_chained() -> None:
    bare = [json.dumps({k: v for k, v in json.loads(line).items() if k != "hash"}) for line in EXPORT]
    assert len(jsonl.parse_lines(bare)) == len(EXPORT)
    mixed = [EXPORT[0], *bare[1:]]
    with pytest.raises(jsonl.JsonlError) as caught:
        jsonl.parse_lines(mixed)
    assert [e.line for e in caught.value.errors] == list(range(2, len(EXPORT) + 1))


@pytest.mark.parametrize("index", range(1, len(EXPORT) - 1))
def test_a_line_dropped_from_inside_an_export_is_refused_naming_the_next_line(index: int) -> None:
    """Issue M12: a dropped line left the next one uncheckable and the import passed. Every
    interior line of a whole-log export (two streams) dropped: the line after it is named."""
    lines = EXPORT[:index] + EXPORT[index + 1 :]
    with pytest.raises(jsonl.JsonlError) as caught:
        jsonl.parse_lines(lines)
    assert [(e.line, e.field) for e in caught.value.errors] == [(index + 1, "position")]
    assert f"position {index + 1} is missing" in str(caught.value.errors[0])


def _interleaved_exports() -> dict[str, list[str]]:
    """Exports of a log whose two streams alternate: whole, each --stream, --from-position."""

    async def export(path: str) -> dict[str, list[str]]:
        store = await EventStore.open(f"sqlite+aiosqlite:///{path}", create=True)
        try:
            for a, b in zip(turns("S1", 4), turns("S2", 4), strict=True):
                await store.append("S1", [a])
                await store.append("S2", [b])
            return {
                name: [line async for line in jsonl.export_lines(store, stream_id=stream, from_position=start)]
                for name, stream, start in (
                    ("whole", None, 0),
                    ("S1", "S1", 0),
                    ("S2", "S2", 0),
                    ("S2 from 3", "S2", 3),
                    ("from 4", None, 4),
                )
            }
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(export(os.path.join(tmp, "l.db")))


INTERLEAVED = _interleaved_exports()


@pytest.mark.parametrize("name", sorted(INTERLEAVED))
def test_partial_exports_still_import_and_a_line_dropped_from_a_stream_export_is_refused(name: str) -> None:
    """A --stream export skips other streams' positions (not a gap); --from-position starts
    anywhere. Dropping an interior line of either is refused."""
    lines = INTERLEAVED[name]
    assert len(lines) >= 3 and len(jsonl.parse_lines(lines)) == len(lines)
    with pytest.raises(jsonl.JsonlError, match="line 2: position: .* missing"):
        jsonl.parse_lines(lines[:1] + lines[2:])
