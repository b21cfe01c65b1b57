"""Replica leases (issue 14): which engine replicas are alive, in a small table of the same
database as the log (``replica_leases``, revision ``0004_replica_leases``).

The table is not the event log: a renewal updates its replica's row in place, so liveness
costs the log nothing. One row per replica id (the *stable* id), holding its current
*incarnation* (0 on first acquire, +1 on every later acquire of the same id: a restart
supersedes the previous incarnation) and the lease's expiry.

Every time is the **database's clock** (integer µs since the epoch: PostgreSQL
``statement_timestamp()``, SQLite ``julianday('now')``, ms precision), so replicas on machines
whose clocks disagree still agree on who expired. Expiry is one-way: :meth:`LeaseTable.renew`
only extends a lease that has not expired yet, so a replica presumed dead (expired) can never
become alive again under the same incarnation — it must :meth:`LeaseTable.acquire` a new one.

Cost per replica: one renewal = one ``UPDATE … RETURNING`` of one ~150-byte row; a scan =
one ``SELECT`` of every row (one per replica id ever started). See docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.store.backends import Backend
from events.store.store import EventStore

_NOW = {
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
    "postgresql": "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)",
}
_COLUMNS = (
    "replica_id, incarnation, engine_pool, host, pid, lease_us, acquired_at_us, renewed_at_us, "
    "expires_at_us, released_at_us, reaped_at_us, reaped_by"
)


@dataclass(frozen=True, slots=True)
class Lease:
    """One replica's row. Times: database clock, integer µs since the epoch. ``host``: the
    replica's host key (hostname and pid namespace), ``pid`` its process id there."""

    replica_id: str
    incarnation: int
    engine_pool: str | None
    host: str
    pid: int
    lease_us: int
    acquired_at_us: int
    renewed_at_us: int
    expires_at_us: int
    released_at_us: int | None = None
    reaped_at_us: int | None = None
    reaped_by: str | None = None

    def live_at(self, now_us: int) -> bool:
        """Not released and not expired at ``now_us`` (database clock)."""
        return self.released_at_us is None and self.expires_at_us > now_us


class LeaseTable:
    """The ``replica_leases`` table of ``store``'s database. Raises what the driver raises
    (SQLAlchemy errors) on a lost connection."""

    def __init__(self, store: EventStore) -> None:
        self._backend: Backend = store.recorder.backend
        self._now = _NOW[self._backend.name]

    async def acquire(self, replica_id: str, *, lease_s: float, engine_pool: str | None, host: str, pid: int) -> Lease:
        """Take the lease of ``replica_id`` for ``lease_s`` seconds under a new incarnation (0
        for a new id, else the previous one + 1, which is thereby superseded). Returns it."""
        sql = sa.text(
            f"INSERT INTO replica_leases ({_COLUMNS}) VALUES (:r, 0, :pool, :host, :pid, :lease, {self._now}, "
            f"{self._now}, {self._now} + :lease, NULL, NULL, NULL) "
            "ON CONFLICT (replica_id) DO UPDATE SET incarnation = replica_leases.incarnation + 1, "
            "engine_pool = excluded.engine_pool, host = excluded.host, pid = excluded.pid, "
            "lease_us = excluded.lease_us, acquired_at_us = excluded.acquired_at_us, "
            "renewed_at_us = excluded.renewed_at_us, expires_at_us = excluded.expires_at_us, "
            f"released_at_us = NULL, reaped_at_us = NULL, reaped_by = NULL RETURNING {_COLUMNS}"
        )
        params = {"r": replica_id, "pool": engine_pool, "host": host, "pid": pid, "lease": round(lease_s * 1e6)}

        def run(conn: Connection) -> Lease:
            return Lease(*conn.execute(sql, params).one())

        return await self._backend.run_write(run)

    async def renew(self, replica_id: str, incarnation: int) -> Lease | None:
        """Extend the lease by its length from now. None when it is lost — expired, released,
        or superseded by a newer incarnation — and then nothing is changed."""
        sql = sa.text(
            f"UPDATE replica_leases SET renewed_at_us = {self._now}, expires_at_us = {self._now} + lease_us "
            f"WHERE replica_id = :r AND incarnation = :i AND released_at_us IS NULL AND expires_at_us > {self._now} "
            f"RETURNING {_COLUMNS}"
        )

        def run(conn: Connection) -> Lease | None:
            row = conn.execute(sql, {"r": replica_id, "i": incarnation}).one_or_none()
            return None if row is None else Lease(*row)

        return await self._backend.run_write(run)

    async def release(self, replica_id: str, incarnation: int) -> bool:
        """End the lease now (clean shutdown): the replica is dead from this moment, and
        whatever it left open may be taken over at once. False when it was already lost."""
        sql = sa.text(
            f"UPDATE replica_leases SET released_at_us = {self._now}, expires_at_us = {self._now} "
            "WHERE replica_id = :r AND incarnation = :i AND released_at_us IS NULL"
        )
        return await self._backend.run_write(
            lambda conn: conn.execute(sql, {"r": replica_id, "i": incarnation}).rowcount == 1
        )

    async def snapshot(self) -> tuple[int, dict[str, Lease]]:
        """(database now in µs, every row by replica id), read together."""

        def run(conn: Connection) -> tuple[int, dict[str, Lease]]:
            now = int(conn.execute(sa.text(f"SELECT {self._now}")).scalar_one())
            rows = conn.execute(sa.text(f"SELECT {_COLUMNS} FROM replica_leases")).all()
            return now, {r[0]: Lease(*r) for r in rows}

        return await self._backend.run_read(run)

    async def mark_reaped(self, replica_id: str, incarnation: int, by: str) -> bool:
        """Record that every open session of this (dead) incarnation was taken over, so scans
        stop looking for them. Only a lease that is not live is marked; False otherwise."""
        sql = sa.text(
            f"UPDATE replica_leases SET reaped_at_us = {self._now}, reaped_by = :by "
            "WHERE replica_id = :r AND incarnation = :i AND reaped_at_us IS NULL "
            f"AND (released_at_us IS NOT NULL OR expires_at_us <= {self._now})"
        )
        return await self._backend.run_write(
            lambda conn: conn.execute(sql, {"r": replica_id, "i": incarnation, "by": by}).rowcount == 1
        )
