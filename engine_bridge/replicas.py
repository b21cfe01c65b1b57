"""Several engine replicas on one ledger (issue 14): identity, lease, takeover, fencing.

Every :class:`~engine_bridge.engine.SessionEngine` is a **replica**: a stable ``replica_id``
(:class:`ReplicaConfig`; default ``$DUPLEX_LEDGER_REPLICA_ID``, else ``<hostname>-<pid>``)
and an **incarnation** handed out by the lease table (:mod:`events.store.leases`; +1 each
time the id starts again). A session is owned by the replica that opened it — recorded in
the log: ``SessionOpened.replica_id``/``replica_incarnation``, then ``SessionTakenOver``.

* **Lease** — renewed every ``renew_every_s`` in the lease table (not the log). A replica
  whose renewal finds the lease lost (expired, released, superseded) is *fenced*: it drops
  every session it serves with the client error ``session_taken_over`` and writes nothing
  more to them; an expired one then starts a new incarnation and takes over its own old
  sessions like any other replica would; a superseded one (another process started with its
  id) stops serving.
* **Takeover** — every ``scan_every_s`` (and at start, :meth:`SessionEngine.recover`) a
  replica looks for open sessions whose owner is dead (:class:`OwnerJudge`) and takes them
  over (:mod:`engine_bridge.takeover`). It never writes to a session whose owner is live.
  The lifecycle query runs only while some dead lease is not yet reaped, and every
  ``full_scan_every_s``.
* **Fencing** — the takeover's first append moves the stream past the version the old owner
  holds, so the old owner's next append raises ``ConcurrencyError`` and nothing lands
  (:mod:`engine_bridge.session_log` turns it into SessionError ``session_taken_over``).

Which ids are aborted and which recorded lost: ``engine_pool`` names the engines a replica
uses when several replicas share them (None: its own engines, which die with it). A dead
owner's ids are aborted when its pool equals this replica's, else recorded lost (unless one
runs on this replica's engines, which is then aborted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine_bridge.messages import SessionError
from engine_bridge.takeover import RecoveryReport, take_over_session
from events.store.leases import Lease, LeaseTable
from events.store.owners import Owner, session_lifecycles

if TYPE_CHECKING:  # pragma: no cover
    from engine_bridge.engine import SessionEngine

log = logging.getLogger("duplex_ledger.replicas")


def default_replica_id() -> str:
    """``$DUPLEX_LEDGER_REPLICA_ID``, else ``<hostname>-<pid>`` (one replica per process)."""
    return os.environ.get("DUPLEX_LEDGER_REPLICA_ID") or f"{socket.gethostname()}-{os.getpid()}"


def host_key() -> str:
    """This host's key: hostname and pid namespace. Two replicas with the same key see each
    other's process ids, so a dead one can be told at once (``probe_local_processes``)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{socket.gethostname()}|{ns}"


def process_exists(pid: int) -> bool:
    """True unless no process ``pid`` exists here (a process of another user counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ReplicaConfig:
    """A replica's identity and timing (seconds).

    * ``replica_id`` — stable id (default :func:`default_replica_id`); two live processes
      must not share one (the later start supersedes the earlier);
    * ``lease_s`` — a replica that has not renewed for this long is dead; its sessions are
      taken over within about ``lease_s + scan_every_s`` of its last renewal;
    * ``renew_every_s`` (default ``lease_s / 3``), ``scan_every_s`` (default ``lease_s / 2``),
      ``full_scan_every_s`` (lifecycle query even with no dead lease pending);
    * ``engine_pool`` — name of engines shared with other replicas (None: own engines);
    * ``probe_local_processes`` — a lease on this host (same pid namespace) whose process is
      gone counts as dead at once, without waiting for its expiry.
    """

    replica_id: str = field(default_factory=default_replica_id)
    lease_s: float = 10.0
    renew_every_s: float | None = None
    scan_every_s: float | None = None
    full_scan_every_s: float = 300.0
    engine_pool: str | None = None
    probe_local_processes: bool = True

    @property
    def renew_s(self) -> float:
        return self.renew_every_s if self.renew_every_s is not None else self.lease_s / 3

    @property
    def scan_s(self) -> float:
        return self.scan_every_s if self.scan_every_s is not None else self.lease_s / 2


class SessionOwnedElsewhere(SessionError):
    """open_session of a session that a live replica owns (code ``session_owned_elsewhere``);
    ``owner`` names it."""

    def __init__(self, session_id: str, owner: Owner) -> None:
        super().__init__("session_owned_elsewhere", f"session is open on live replica {owner}", session_id=session_id)
        self.owner = owner


@dataclass(frozen=True)
class OwnerJudge:
    """Who is alive, as of one read of the lease table (database clock ``now_us``)."""

    now_us: int
    leases: dict[str, Lease]
    me: Owner
    engine_pool: str | None
    host: str
    probe: bool

    def dead_lease(self, lease: Lease) -> str | None:
        """Why this lease's replica is dead, or None while it is alive."""
        if lease.released_at_us is not None:
            return "lease_released"
        if lease.expires_at_us <= self.now_us:
            return "lease_expired"
        if self.probe and lease.host == self.host and not process_exists(lease.pid):
            return "process_gone"
        return None

    def dead_reason(self, owner: Owner) -> str | None:
        """Why ``owner`` is dead (``SessionTakenOver.detected``), or None while it is alive
        (this replica itself included)."""
        if owner.replica_id is None:
            return "unowned"
        if owner == self.me:
            return None
        lease = self.leases.get(owner.replica_id)
        if lease is None:
            return "lease_expired"
        if lease.incarnation != owner.incarnation:
            return "superseded"
        return self.dead_lease(lease)

    def shared(self, owner: Owner) -> bool:
        """The owner's engines are this replica's too (same non-None ``engine_pool``)."""
        lease = self.leases.get(owner.replica_id or "")
        return self.engine_pool is not None and lease is not None and lease.engine_pool == self.engine_pool


class Replica:
    """The lease and the takeover scans of one engine (see the module doc)."""

    def __init__(self, engine: SessionEngine, config: ReplicaConfig) -> None:
        self.engine = engine
        self.config = config
        self.host = host_key()
        self.lease: Lease | None = None
        self.superseded = False
        self.reports: list[RecoveryReport] = []
        self.stats = {"renewals": 0, "scans": 0, "lifecycle_queries": 0, "fenced_sessions": 0, "lease_lost": 0}
        self._table: LeaseTable | None = None
        self._last_ok = 0.0  # monotonic time the last successful renewal was sent
        self._last_full = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def me(self) -> Owner:
        return Owner(self.config.replica_id, self.lease.incarnation if self.lease else None)

    @property
    def table(self) -> LeaseTable:
        if self._table is None:
            self._table = LeaseTable(self.engine.store)
        return self._table

    # ------------------------------------------------------------------ lease
    async def start(self) -> None:
        """Acquire the lease under a new incarnation (idempotent)."""
        if self.lease is None:
            sent = time.monotonic()
            self.lease = await self.table.acquire(
                self.config.replica_id,
                lease_s=self.config.lease_s,
                engine_pool=self.config.engine_pool,
                host=self.host,
                pid=os.getpid(),
            )
            self._last_ok = self._last_full = sent  # start-up recovery is the first full scan

    def start_background(self) -> None:
        """Start the renewal and takeover-scan tasks (idempotent)."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._every(self.config.renew_s, self.renew)),
                loop.create_task(self._every(self.config.scan_s, self.scan)),
            ]

    def valid(self) -> bool:
        """The lease is held and, by this process's monotonic clock, cannot have expired."""
        return self.lease is not None and not self.superseded and time.monotonic() - self._last_ok < self.config.lease_s

    async def ensure_writable(self, session_id: str) -> None:
        """Before opening a session: hold a lease that is surely live (renewing first when in
        doubt). Raises SessionError ``replica_superseded`` when another process took this id."""
        await self.start()
        self.start_background()  # an engine built without SessionEngine.open renews too
        if not self.valid() or time.monotonic() - self._last_ok > self.config.renew_s:
            await self.renew()
        if self.superseded or self.lease is None:
            raise SessionError(
                "replica_superseded",
                f"replica {self.config.replica_id!r} was started again elsewhere",
                session_id=session_id,
            )

    async def renew(self) -> None:
        """Renew once; on a lost lease fence every session and (unless superseded) start a new
        incarnation and take over what the old one left."""
        if self.lease is None or self.superseded:
            return
        sent = time.monotonic()
        lease = await self.table.renew(self.config.replica_id, self.lease.incarnation)
        self.stats["renewals"] += 1
        if lease is not None:
            self.lease, self._last_ok = lease, sent
            return
        await self._lost()

    async def _lost(self) -> None:
        old = self.me
        # Fenced before anything is awaited: a session of the dead incarnation flushes nothing more.
        self.fence_all(f"replica {old} lost its lease; the session is taken over")
        self.stats["lease_lost"] += 1
        _, leases = await self.table.snapshot()
        row = leases.get(self.config.replica_id)
        self.superseded = row is not None and row.incarnation != old.incarnation
        log.warning("replica %s lost its lease%s", old, " (superseded)" if self.superseded else "")
        if self.superseded:
            return
        self.lease = None
        await self.start()
        await self.scan(full=True)  # take over what the old incarnation left open

    def fence_all(self, message: str) -> None:
        """Drop every session this replica serves (client error ``session_taken_over``)."""
        for session in list(self.engine.sessions.values()):
            if not session.closed:
                session.fence_out(message)
                self.stats["fenced_sessions"] += 1

    async def stop(self) -> None:
        """Stop the background tasks and release the lease (its leftovers may be taken over
        at once)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.lease is not None and not self.superseded:
            try:
                await self.table.release(self.config.replica_id, self.lease.incarnation)
            except Exception as exc:  # noqa: BLE001 - shutdown: the lease then simply expires
                log.warning("replica %s: release failed: %s", self.me, exc)

    async def _every(self, period_s: float, step) -> None:  # type: ignore[no-untyped-def]
        while True:
            await asyncio.sleep(period_s)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a background loop logs and carries on
                log.warning(
                    "replica %s: %s failed: %s: %s", self.me, getattr(step, "__name__", step), type(exc).__name__, exc
                )
                if self.lease is not None and not self.valid() and not self.superseded:
                    self.fence_all(f"replica {self.me} could not renew its lease")

    # ------------------------------------------------------------------ takeover
    async def judge(self) -> OwnerJudge:
        now, leases = await self.table.snapshot()
        return OwnerJudge(now, leases, self.me, self.config.engine_pool, self.host, self.config.probe_local_processes)

    async def scan(self, full: bool = False) -> RecoveryReport | None:
        """One takeover scan: take over every open session whose owner is dead. Skipped (None)
        while this replica's own lease is not surely live — a paused replica must not act on
        what it saw before the pause."""
        if not self.valid():
            return None
        self.stats["scans"] += 1
        judge = await self.judge()
        pending = [
            lease
            for lease in judge.leases.values()
            if lease.reaped_at_us is None and judge.dead_lease(lease) is not None
        ]
        due = time.monotonic() - self._last_full >= self.config.full_scan_every_s
        if not (pending or full or due):
            return None
        self._last_full = time.monotonic()
        self.stats["lifecycle_queries"] += 1
        report = RecoveryReport()
        ok = True
        for sid, life in sorted((await session_lifecycles(self.engine.store)).items()):
            if not life.open or self.engine.serves(sid) or judge.dead_reason(life.owner) is None:
                continue
            try:
                await self.take_over(sid, judge, report)
            except Exception as exc:  # noqa: BLE001 - one session's failure does not stop the scan
                ok = False
                report.failed.append(f"{sid}: {type(exc).__name__}: {exc}")
        if ok and self.valid():
            for lease in pending:
                await self.table.mark_reaped(lease.replica_id, lease.incarnation, str(self.me))
        if report.closed_sessions or report.failed:
            log.info("replica %s took over %d session(s): %s", self.me, len(report.closed_sessions), report)
            self.reports.append(report)
        return report

    async def take_over(self, session_id: str, judge: OwnerJudge, report: RecoveryReport) -> bool:
        """Take over one session if its owner is dead (see :mod:`engine_bridge.takeover`)."""
        return await take_over_session(
            self.engine.store,
            self.engine.ports,
            session_id,
            me=self.me,
            judge=judge.dead_reason,
            shared=judge.shared,
            ticker=self.engine._ticker,
            report=report,
            on_applied=self.engine.metrics.apply,
        )
