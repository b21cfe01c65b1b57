"""A checked partition fold (``verify`` on a large SQLite log) reads its rows once: the chain
links of its range are checked from the scan it folds from. What it gives equals the fold and
the chain check read apart (``folded_partition`` without a range, then
``check_sqlite_segment_plain``), on an intact log and on edited ones."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from events.chain_walk import check_sqlite_segment_plain
from events.store.rows import ImportRow
from events.store.store import EventStore
from projections.shell import parallel
from tests.projections.test_parallel_rebuild import EVENTS


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("checked") / "l.db"

    async def write() -> None:
        store = await EventStore.open(f"sqlite+aiosqlite:///{path}", create=True)
        try:
            await store.append_records([ImportRow.from_event(e) for e in EVENTS])
        finally:
            await store.close()

    import asyncio

    asyncio.run(write())
    return path


def _edited(ledger: Path, tmp_path: Path, *statements: str) -> str:
    """A copy of ``ledger`` with ``statements`` run on it (the guard triggers dropped first)."""
    copy = tmp_path / "edited.db"
    shutil.copy(ledger, copy)
    conn = sqlite3.connect(copy)
    for trigger in ("events_no_update", "events_no_delete", "events_no_replace"):
        conn.execute(f"DROP TRIGGER {trigger}")
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return str(copy)


def _turns(path: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT * FROM turns").fetchall()
    finally:
        conn.close()


def _both(path: str, part: int, until: int, chain: tuple[int, int], watch: list[int], tmp_path: Path):
    """(one scan, read apart) for partition ``part`` of a two-partition plan of ``path``."""
    plan = parallel.plan_partitions(parallel.session_sizes(path), 2)
    one, apart = tmp_path / f"a-{part}-{until}", tmp_path / f"b-{part}-{until}"  # names of one length
    one.mkdir()
    apart.mkdir()
    checked = parallel.folded_partition(path, part, plan[part], until, str(one), chain=chain, watch=watch)
    plain = parallel.folded_partition(path, part, plan[part], until, str(apart))
    segment = check_sqlite_segment_plain(path, *chain, watch)
    return checked, plain, segment, (str(one), str(apart))


def _assert_same(checked, plain, segment, folders) -> None:
    assert checked.segment == segment
    assert (checked.events, checked.turns) == (plain.events, plain.turns)
    one, apart = (
        parallel.encode_result(r).replace(folder.encode(), b"spool") for r, folder in zip((checked, plain), folders)
    )
    assert one == apart
    assert _turns(checked.turns_path) == _turns(plain.turns_path)


def _head(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT max(position) FROM events").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("part", [0, 1])
@pytest.mark.parametrize("until_share", [1.0, 0.4])
def test_one_scan_equals_the_fold_and_the_chain_check_apart(ledger, tmp_path, part, until_share) -> None:
    path = str(ledger)
    head = _head(path)
    until = int(head * until_share)  # a checkpoint below the head: the range reaches past the fold
    chain = parallel.chain_ranges(head, 2)[part]
    found = _both(path, part, until, chain, [until, chain[0], chain[1]], tmp_path)
    assert found[0].segment[2] is True and found[0].segment[3] == chain[1] - chain[0] + 1
    assert found[0].events > 0
    _assert_same(*found)


@pytest.mark.parametrize(
    ("edit", "in_range", "at"),
    [
        ("UPDATE events SET ts_us = ts_us + 1 WHERE position = {p}", 0, -3),  # an edited row
        ("UPDATE events SET hash = NULL WHERE position = {p}", 0, -3),  # a row without its hash
        ("UPDATE events SET data = CAST(x'ff' AS TEXT) WHERE position = {p}", 0, -3),  # not UTF-8: read apart
        ("UPDATE events SET position = 0 WHERE position = 1", 0, -3),  # a row below 1, then a gap
        ("DELETE FROM events WHERE position = {p}", 1, -1),  # the row the range starts from is gone
        ("UPDATE events SET hash = x'00' WHERE position = {p}", 1, -1),  # it has no 32-byte hash
    ],
    ids=["edited", "hashless", "not-utf8", "below-1", "anchor-deleted", "anchor-hashless"],
)
def test_one_scan_on_an_edited_log_says_what_the_reads_apart_say(ledger, tmp_path, edit, in_range, at) -> None:
    head = _head(str(ledger))
    chain = parallel.chain_ranges(head, 2)[in_range]
    p = chain[0] + at if at < 0 and in_range else chain[1] + at  # before the range, or in it
    conn = sqlite3.connect(ledger)
    owner = conn.execute("SELECT stream_id FROM events WHERE position = ?", (p,)).fetchone()[0]
    conn.close()
    edited = _edited(ledger, tmp_path, edit.format(p=p))
    plan = parallel.plan_partitions(parallel.session_sizes(edited), 2)
    # The partition whose sessions the edited row is not of (its fold never decodes the row).
    part = 1 if owner in plan[0] else 0
    found = _both(edited, part, head, chain, [], tmp_path)
    assert found[0].segment[2] is False
    _assert_same(*found)
