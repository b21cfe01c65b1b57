"""Who owns each session, from the log's lifecycle events (issue 14).

A session's owner is the replica named by its last ``SessionOpened`` or ``SessionTakenOver``
(``replica_id``, ``replica_incarnation``); it is open from a ``SessionOpened`` until the next
``SessionClosed``. The query reads only those three event kinds, through the partial index
``ix_events_lifecycle`` (revision ``0004_replica_leases``): one row per open, takeover and
close — not the whole log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.store.store import EventStore

# Must read exactly as the index's WHERE term (SQLite uses a partial index only then).
LIFECYCLE = "type IN ('SessionOpened', 'SessionTakenOver', 'SessionClosed')"


@dataclass(frozen=True, slots=True)
class Owner:
    """A replica incarnation; ``replica_id`` None = written before replicas existed."""

    replica_id: str | None
    incarnation: int | None

    def __str__(self) -> str:
        return "(no replica)" if self.replica_id is None else f"{self.replica_id}#{self.incarnation}"


@dataclass(frozen=True, slots=True)
class SessionLifecycle:
    """``open``: opened and not closed since; ``owner``: the last owner; ``version``: the
    stream version of the last lifecycle event; ``served_by``: the replica that opened the
    session's current incarnation (the one that held its ids, even after a takeover);
    ``taken_over``: a ``SessionTakenOver`` came after the current incarnation's open."""

    session_id: str
    open: bool
    owner: Owner
    version: int
    served_by: Owner = Owner(None, None)
    taken_over: bool = False


async def session_lifecycles(
    store: EventStore, *, stream_ids: Iterable[str] | None = None, until_position: int | None = None
) -> dict[str, SessionLifecycle]:
    """Each session's lifecycle (see the module doc), for ``stream_ids`` (default: every
    session) as of ``until_position`` (inclusive; default: the head)."""
    where = [LIFECYCLE]
    params: dict[str, object] = {}
    wanted = None if stream_ids is None else sorted(set(stream_ids))
    if wanted is not None:
        if not wanted:
            return {}
        where.append("stream_id IN :streams")
        params["streams"] = wanted
    if until_position is not None:
        where.append("position <= :until")
        params["until"] = until_position
    sql = sa.text(f"SELECT stream_id, version, type, data FROM events WHERE {' AND '.join(where)} ORDER BY position")
    if wanted is not None:
        sql = sql.bindparams(sa.bindparam("streams", expanding=True))

    def run(conn: Connection) -> list[tuple[str, int, str, str]]:
        return [tuple(r) for r in conn.execute(sql, params).all()]  # type: ignore[misc]

    out: dict[str, SessionLifecycle] = {}
    for stream_id, version, kind, data in await store.recorder.backend.run_read(run):
        out[stream_id] = _step(
            out.get(stream_id), stream_id, version, kind, {} if kind == "SessionClosed" else json.loads(data)
        )
    return out


def lifecycle_of(session_id: str, events: Iterable[Any]) -> SessionLifecycle | None:
    """The lifecycle from one stream's events (structs or models, in version order); None for a
    stream with no lifecycle event."""
    life: SessionLifecycle | None = None
    for version, event in enumerate(events, start=1):
        kind = event.type
        if kind in ("SessionOpened", "SessionTakenOver", "SessionClosed"):
            fields = (
                {}
                if kind == "SessionClosed"
                else {"replica_id": event.replica_id, "replica_incarnation": event.replica_incarnation}
            )
            life = _step(life, session_id, version, kind, fields)
    return life


def _step(
    before: SessionLifecycle | None, stream_id: str, version: int, kind: str, payload: dict[str, Any]
) -> SessionLifecycle:
    nobody = Owner(None, None)
    if kind == "SessionClosed":
        return SessionLifecycle(
            stream_id, False, before.owner if before else nobody, version, before.served_by if before else nobody
        )
    if kind == "SessionOpened":
        if before is not None and before.open and not before.taken_over:
            return before  # an open of an open session: refused by the fold (open_while_open), changes nothing
        owner = Owner(payload.get("replica_id"), payload.get("replica_incarnation"))
        return SessionLifecycle(stream_id, True, owner, version, owner)
    owner = Owner(payload.get("replica_id"), payload.get("replica_incarnation"))
    return SessionLifecycle(
        stream_id, bool(before and before.open), owner, version, before.served_by if before else nobody, True
    )
