"""Who a session belongs to follows the opens the fold accepts: an open of a session that is
still open (no close or takeover since its open) is refused by the resources fold
(``open_while_open``, DOMAIN §2.1) and changes nothing, its ``replica_id`` included — in
``lifecycle_of`` (the engine's takeover and recovery) and ``session_lifecycles`` (``sessions``,
the audit's owner column) alike (hostile retest of issue 23)."""

from __future__ import annotations

from events.store.owners import Owner, lifecycle_of, session_lifecycles
from events.store.rows import ImportRow
from events.store.store import EventStore
from tests.logbuilder import LogBuilder


def history() -> LogBuilder:
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, model="m", replica_id="r1", replica_incarnation=0)
    b.add("SessionOpened", "s1", 2.0, model="m", incarnation=4, replica_id="r3", replica_incarnation=0)  # refused
    return b


def test_a_refused_open_does_not_change_the_owner() -> None:
    life = lifecycle_of("s1", (s.event for s in history().stored))
    assert life is not None and life.open
    assert life.owner == life.served_by == Owner("r1", 0)
    assert life.version == 1


def test_after_a_takeover_or_a_close_an_open_is_the_new_owner() -> None:
    for end in ("SessionTakenOver", "SessionClosed"):
        b = history()
        if end == "SessionTakenOver":
            b.add(
                end,
                "s1",
                3.0,
                replica_id="r2",
                replica_incarnation=0,
                previous_replica_id="r1",
                previous_incarnation=0,
                detected="lease_expired",
            )
        else:
            b.add(end, "s1", 3.0, reason="session_close")
        b.add("SessionOpened", "s1", 4.0, model="m", incarnation=1, replica_id="r2", replica_incarnation=1)
        life = lifecycle_of("s1", (s.event for s in b.stored))
        assert life is not None and life.open and not life.taken_over, end
        assert life.owner == life.served_by == Owner("r2", 1), end


async def test_the_stored_lifecycles_agree(tmp_path) -> None:
    b = history()
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path / 'l.db'}", create=True)
    try:
        await store.append_records([ImportRow.from_event(e) for e in b.events])
        stored = await session_lifecycles(store)
        assert stored["s1"] == lifecycle_of("s1", (s.event for s in b.stored))
        assert stored["s1"].owner == Owner("r1", 0)
    finally:
        await store.close()
