"""Rows at positions the store never writes, and a hash column emptied, on both backends
(hostile retest of ``verify``): a row forged at position 0 or below is ``inserted`` there
(it was read by no one before: every read started at 1); a row written far past the head is
``inserted`` there, not "rows deleted", unless the rows after the gap chain among themselves;
a hash set to null is ``edited`` when the next row chains from a real hash, ``inserted`` when
the store chained the next row from GENESIS (as it does after a row it did not write)."""

from __future__ import annotations

import pytest

from events.chain import hash_of
from events.chain_walk import ChainFault, chain_fault, walk_log
from events.store import EventStore
from events.types import SessionOpened
from reports.cli_verify import verify_store
from tests.store.test_tamper import CONTENT, _rows, ledger, lift, sql

__all__ = ["ledger"]  # the fixture, shared with test_tamper


async def _every_check(store: EventStore) -> list[ChainFault | None]:
    """The fault as ``verify``, ``digest`` (:func:`walk_log`) and every reader
    (:func:`chain_fault` to the head) see it."""
    head = await store.head_position()
    return [(await verify_store(store)).fault, (await walk_log(store))[1], await chain_fault(store, head)]


def _forge(position: int | str, version: str = "version", source: int = 1, hash_: str = "hash") -> str:
    return (
        f"INSERT INTO events (position, {CONTENT}, hash) SELECT {position}, stream_id, {version}, 'forged', "
        f"type, schema_version, ts_us, recorded_at_us, data, {hash_} FROM events WHERE position = {source}"
    )


@pytest.mark.parametrize("position", [0, -5])
async def test_a_row_forged_below_position_1_is_inserted_there(ledger: EventStore, position: int) -> None:
    assert await _every_check(ledger) == [None, None, None]
    await sql(ledger, _forge(position, "version + 100"))  # the append-only guard lets an insert through
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (position, "inserted"), found
        assert "numbers the log from 1" in found.detail


async def test_a_row_forged_below_1_of_an_otherwise_empty_log_is_inserted(db_url: str) -> None:
    store = await EventStore.open(db_url, create=True)
    try:
        await store.append("S1", [SessionOpened(session_id="S1", ts=1.0)], expected_version=0)
        await sql(store, _forge(0, "version + 1"), *lift(store, "delete"), "DELETE FROM events WHERE position = 1")
        assert await store.head_position() == 0
        for found in await _every_check(store):
            assert found is not None and (found.position, found.kind) == (0, "inserted"), found
    finally:
        await store.close()


async def test_a_row_written_far_past_the_head_is_inserted_there_not_rows_deleted(ledger: EventStore) -> None:
    await sql(ledger, _forge(1000, "version + 500", source=20))  # row 20's hash copied: it links nowhere
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (1000, "inserted"), found
        assert "27..999 deleted" in found.detail and "last row" in found.detail  # the other reading named


async def test_a_row_past_the_head_chained_from_the_head_is_inserted(ledger: EventStore) -> None:
    """Its link holds across the gap: had rows been deleted, it would chain from the last of them."""
    rows = await _rows(ledger)
    head = rows[-1]
    forged = head._replace(position=1000, version=head.version + 1, event_id="forged")
    digest = hash_of(head.hash, forged).hex()
    hex_literal = f"x'{digest}'" if ledger.backend_name == "sqlite" else f"'\\x{digest}'::bytea"
    await sql(ledger, _forge(1000, "version + 1", source=26, hash_=hex_literal))
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (1000, "inserted"), found
        assert "chains from the row at 26" in found.detail


async def test_rows_deleted_before_rows_that_chain_among_themselves_are_missing(ledger: EventStore) -> None:
    await sql(ledger, *lift(ledger, "delete"), "DELETE FROM events WHERE position BETWEEN 10 AND 20")
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (10, "missing"), found
        assert "10..20" in found.detail and "rows deleted" in found.detail


async def test_a_hash_set_to_null_is_edited(ledger: EventStore) -> None:
    await sql(ledger, *lift(ledger, "update"), "UPDATE events SET hash = NULL WHERE position = 12")
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (12, "edited"), found
        assert "hash holds null" in found.detail and "hash was changed" in found.detail


async def test_a_hashless_row_the_store_appended_after_is_inserted(ledger: EventStore) -> None:
    """The store chains the row after a row without a 32-byte hash from GENESIS (``tip_of``)."""
    await sql(ledger, _forge(27, "version + 100", source=26, hash_="NULL"))
    await ledger.append("S9", [SessionOpened(session_id="S9", ts=1.0)], expected_version=0)
    assert await ledger.head_position() == 28
    for found in await _every_check(ledger):
        assert found is not None and (found.position, found.kind) == (27, "inserted"), found
        assert "chains from GENESIS" in found.detail
