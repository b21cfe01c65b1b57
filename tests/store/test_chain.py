"""The hash chain (events.chain): written by the store in position order on both backends,
backfilled by revision 0003, carried by JSONL (an edited export is refused at import)."""

from __future__ import annotations

import pytest

from events import jsonl
from events.chain import GENESIS, canonical_bytes, hash_of, link, row_hash, row_pieces
from events.store import EventStore, ImportRow, migrate
from events.store.rows import StoredRow
from reports.cli_verify import head_digest, verify_store
from tests.store.helpers import turns


def test_canonical_bytes_are_length_prefixed_and_fixed() -> None:
    b = canonical_bytes(1, "S", 2, "e", "T", 1, -5, 7, '{"ü":1}')
    assert b == (b"\x00" * 7 + b"\x01" + b"\x00\x00\x00\x01S" + b"\x00" * 7 + b"\x02" + b"\x00\x00\x00\x01e"
                 + b"\x00\x00\x00\x01T" + b"\x00" * 7 + b"\x01" + b"\xff" * 7 + b"\xfb" + b"\x00" * 7 + b"\x07"
                 + b"\x00\x00\x00\x08" + '{"ü":1}'.encode())
    # a field boundary cannot move: ("ab", "c") and ("a", "bc") differ
    assert canonical_bytes(1, "ab", 1, "c", "T", 1, 0, 0, "") != canonical_bytes(1, "a", 1, "bc", "T", 1, 0, 0, "")


@pytest.mark.parametrize("row", [
    (1, "S", 2, "e", "T", 1, -5, 7, '{"ü":1}'),
    (2**62, "sessiön-\U0001f600", 2**63 - 1, "00000000-0000-0000-0000-000000000001", "StageOutput", 2, 0, -1, ""),
    (3, "", 1, "", "", 0, 2**63 - 1, -(2**63), '{"a":[1,2.5,null]}' * 50),
])
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
    dropped = lines[:1] + lines[2:]  # line 2 removed: line 3's predecessor is not in the file
    assert len(jsonl.parse_lines(dropped)) == 3
    swapped = [lines[0], lines[2], lines[1], lines[3]]
    with pytest.raises(jsonl.JsonlError, match="line 3: position: 2 after 3"):
        jsonl.parse_lines(swapped)
    no_fields = lines[0].replace('"position":1,', "")
    with pytest.raises(jsonl.JsonlError, match="hash: given without position"):
        jsonl.parse_lines([no_fields])
    assert len(jsonl.parse_lines(lines)) == 4
