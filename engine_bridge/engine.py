"""The session engine: full-duplex sessions in front of live stage engines, every command and
engine interaction recorded in the append-only log.

    async with await SessionEngine.open("sqlite+aiosqlite:///ledger.db", [thinker, talker]) as engine:
        session = await engine.open_session("user-42")
        await session.append_text("What is the capital of France?")
        await session.commit()
        await session.wait_idle()
        await session.close()

``ports[0]`` is Stage0 (thinker), ``ports[1]`` Stage1 (talker); the engine does not own them
(the caller starts and shuts them down). On open, :meth:`SessionEngine.recover` reconciles
the log with the live engines (crash recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from decider.state import next_incarnation
from engine_bridge.messages import EngineConfig, SessionError, StreamTakenOver
from engine_bridge.plugin import ModelPlugin, TextPlugin
from engine_bridge.ports import StagePort
from engine_bridge.prometheus import LedgerMetrics
from engine_bridge.recovery import claimable_history, recover_dead_sessions
from engine_bridge.replicas import Replica, ReplicaConfig, SessionOwnedElsewhere
from engine_bridge.session import Session
from engine_bridge.session_log import FlushTicker, SessionLog
from engine_bridge.takeover import RecoveryReport
from engine_bridge.turn_printer import TurnPrinter
from events.records import StoredEvent
from events.store.backends import Synchronous
from events.store.owners import lifecycle_of
from events.store.store import EventStore
from events.types import SessionOpened
from projections.projector import Projector
from projections.turn_tables import TurnTables

__all__ = ["RecoveryReport", "SessionEngine"]

logger = logging.getLogger(__name__)


def default_model_name(ports: Sequence[StagePort]) -> str | None:
    """The ``model_name`` label of the Prometheus families (recorded in ``SessionOpened.model``):
    the Stage0 port's model directory name, else its name; None without ports."""
    if not ports:
        return None
    model_dir = getattr(ports[0], "model_dir", None)
    return Path(model_dir).name if model_dir else ports[0].name


class SessionEngine:
    """Drives sessions; see the module docstring. Not thread-safe (one event loop)."""

    def __init__(
        self,
        store: EventStore,
        ports: Sequence[StagePort],
        *,
        plugin: ModelPlugin | None = None,
        config: EngineConfig | None = None,
        on_turn: Callable[[Session, TurnTables], None] | None = None,
        owns_store: bool = False,
        model_name: str | None = None,
        replica: ReplicaConfig | None = None,
        stats_renderer: Callable[[TurnTables], list[str]] | None = None,
    ) -> None:
        """``replica``: this engine's identity and lease timing on a shared ledger (issue 14;
        default :class:`ReplicaConfig`: ``<hostname>-<pid>``, 10 s lease). ``model_name``: the
        Prometheus ``model_name`` label (default: the Stage0 model directory's name).
        ``stats_renderer``: the live ``--log-stats`` layout, a turn's tables -> log messages for
        the ``config.stats_logger_name`` logger (``reports.render_text.turn_log_messages`` gives
        vLLM-Omni's; the CLI passes it). None: finalized tables are kept in :attr:`printed` and
        handed to ``on_turn``, and nothing is logged. The engine imports no renderer (layers:
        events < projections < engine_bridge < reports)."""
        self.store = store
        self.ports = list(ports)
        self.plugin = plugin or TextPlugin()
        self.config = config or EngineConfig()
        self.sessions: dict[str, Session] = {}
        # Ids of the sessions that may still be open (a superset: pruned at each open), so the
        # max_sessions check costs O(open sessions), not O(every session this engine served).
        self._maybe_open: set[str] = set()
        self._admitted = 0  # opens past the max_sessions check and not yet in self.sessions
        self._closing = False  # aclose has begun
        self._opening = 0  # open_session calls in flight
        self._opens_done = asyncio.Event()  # set whenever none is in flight
        self.printer = TurnPrinter(
            self.config.printed_turns_kept, self.config.stats_logger_name, on_turn=on_turn, renderer=stats_renderer
        )
        self.printed = self.printer.printed  # the last finalized tables only
        self._owns_store = owns_store
        self._ticker = FlushTicker(self.config.flush_interval_s)
        # Prometheus families (issue 16): one fold fed every event the sessions emit.
        self.model_name = model_name or default_model_name(self.ports)
        self.metrics = LedgerMetrics(self.ports, now=time.time, folded_by=self._session_projectors)
        self.replica = Replica(self, replica or ReplicaConfig())

    @classmethod
    async def open(
        cls,
        url: str | None,
        ports: Sequence[StagePort],
        *,
        recover: bool = True,
        synchronous: Synchronous | None = None,
        **kwargs,
    ) -> SessionEngine:  # type: ignore[no-untyped-def]
        """Open (creating or upgrading) the ledger at ``url``, take this replica's lease, by
        default recover, and start the lease renewal and takeover scans (engine_bridge.replicas).

        ``synchronous`` (SQLite): None (default) takes the URL's ``?synchronous=``, else FULL:
        an acknowledged append survives power loss of the host. NORMAL (WAL) still survives a
        crash or SIGKILL of the process — what crash recovery needs — and costs less per commit
        on a loaded machine (benchmarks/bench_live_overhead.py), but may lose the commits since
        the last WAL checkpoint on power loss or an OS crash."""
        store = await EventStore.open(url, create=True, synchronous=synchronous)
        engine = cls(store, ports, owns_store=True, **kwargs)
        await engine.replica.start()
        if recover:
            await engine.recover()
        engine.replica.start_background()
        return engine

    async def __aenter__(self) -> SessionEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, reason: str = "server_shutdown") -> None:
        """Close every open session (reason ``server_shutdown``), release the replica's lease,
        stop the ``/metrics`` server if one was started, then close the store if owned.

        :meth:`open_session` is refused (``engine_closed``) from the start; calls already in
        flight end first, so the sessions they open are closed too. One session never stops
        the shutdown of the others: a session found taken over at its close (SessionError
        ``session_taken_over``: it is fenced out and another replica's now, issue 14) is
        passed over; any other failure of a session's close is logged, the rest is still shut
        down, and the first such failure is raised at the end."""
        self._closing = True  # open_session refuses from now on
        while self._opening:  # those already past that check end first: the list below is complete
            self._opens_done.clear()
            await self._opens_done.wait()
        failures: list[Exception] = []
        try:
            for session in list(self.sessions.values()):
                if session.closed:
                    continue
                try:
                    await session.close(reason)
                except Exception as exc:  # noqa: BLE001 - raised below, once everything is shut
                    if isinstance(exc, StreamTakenOver):
                        continue  # fenced out: the session is another replica's now
                    logger.warning("shutdown: closing session %r failed: %s", session.session_id, exc)
                    failures.append(exc)
        finally:
            await self.replica.stop()
            await self._ticker.aclose()
            self.metrics.close()
            if self._owns_store:
                await self.store.close()
        if failures:
            raise failures[0]

    # ------------------------------------------------------------------ sessions
    async def open_session(
        self,
        session_id: str,
        *,
        auto_response: bool = False,
        log_stats: bool = True,
        plugin: ModelPlugin | None = None,
        protocol: str | None = None,
        connection_id: str | None = None,
    ) -> Session:
        """Open a session (DOMAIN §2.2 open): admission, capabilities from the plugin, the
        incarnation (+1 over a closed predecessor), then the Stage0 id for fence turn 0 is
        reserved. The session is owned by this replica (``SessionOpened.replica_id``); one left
        open by a dead replica is taken over first. Raises SessionError ``engine_closed`` (once
        :meth:`aclose` has begun), ``session_exists`` / ``max_sessions_reached`` /
        ``replica_superseded``, SessionOwnedElsewhere (code
        ``session_owned_elsewhere``, naming the live owner: issue 14) and RequestIdError for an
        empty session id. ``protocol`` (``realtime``, ...) and ``connection_id``: what front
        the client came through, recorded on ``SessionOpened`` (omitted there while None;
        issue 21, research G9)."""
        if self._closing:
            raise SessionError("engine_closed", "the session engine is shutting down or shut", session_id=session_id)
        self._opening += 1
        try:
            return await self._open_session(session_id, auto_response, log_stats, plugin, protocol, connection_id)
        finally:
            self._opening -= 1
            if not self._opening:
                self._opens_done.set()

    async def _open_session(
        self,
        session_id: str,
        auto_response: bool,
        log_stats: bool,
        plugin: ModelPlugin | None,
        protocol: str | None,
        connection_id: str | None,
    ) -> Session:
        previous = self.sessions.get(session_id)
        if previous is not None and previous.closed and not previous.taken_over:
            # Its close may still be running (SessionClosed is folded before the close's aborts
            # and their results are recorded): the next incarnation starts after that close and
            # its last events are in the log, never beside them (a reconnect right after a drop).
            await previous.settled()
        if session_id in self.sessions and not self.sessions[session_id].closed:
            raise SessionError("session_exists", "session is already open", session_id=session_id)
        with self._admission(session_id):  # this open holds a slot across its awaits
            plugin = plugin or self.plugin
            closed = self.sessions.get(session_id)  # a closed predecessor (the check above), if any
            if closed is not None:
                closed.superseded = True  # before the next incarnation is folded into the fold it shares
            await self.replica.ensure_writable(session_id)
            history = await self._claimable_history(session_id)
            incarnation = next_incarnation(e.event for e in history)
            log = SessionLog(
                self.store,
                session_id,
                len(history),
                projector=self._projector_for(session_id, len(history)),
                ticker=self._ticker,
                on_folded=self.metrics.apply_folded,
            )
            session = Session(
                session_id,
                log=log,
                ports=self.ports,
                plugin=plugin,
                config=self.config,
                auto_response=auto_response,
                log_stats=log_stats,
            )
            if log_stats:  # M14: nothing of a log_stats-off session's tables is printed or held for printing
                log.on_turn = lambda turn: self.printer.print_turn(session, turn)
            log.on_fenced = lambda exc: session.fence_out(f"another replica wrote to the session: {exc}")
            me = self.replica.me
            try:
                # Committed with the reservation start() makes: one append, durable before the
                # client hears ``session.created`` (and before any engine call of the session).
                log.emit_later(
                    SessionOpened(
                        session_id=session_id,
                        ts=time.time(),
                        incarnation=incarnation,
                        capabilities=session.capabilities,
                        auto_response=auto_response,
                        num_stages=len(self.ports),
                        log_stats=log_stats,
                        model=self.model_name,
                        replica_id=me.replica_id,
                        replica_incarnation=me.incarnation,
                        protocol=protocol,
                        connection_id=connection_id,
                    )
                )
                await session.start()
            except StreamTakenOver:  # another replica opened it between our read and our append
                life = lifecycle_of(session_id, (e.event for e in await self.store.read_stream(session_id)))
                if life is None:
                    raise
                if life.owner == me:  # a concurrent open on this very replica won the append
                    raise SessionError("session_exists", "session is already open", session_id=session_id) from None
                raise SessionOwnedElsewhere(session_id, life.owner) from None
            self.sessions[session_id] = session
            self._maybe_open.add(session_id)
            return session

    @contextlib.contextmanager
    def _admission(self, session_id: str) -> Iterator[None]:
        """Admission (``max_sessions``): every session open now and every open past this check
        and not yet in :attr:`sessions` holds a slot (concurrent opens count each other). Raises
        SessionError ``max_sessions_reached``."""
        sessions = self.sessions
        self._maybe_open = {sid for sid in self._maybe_open if not sessions[sid].closed}
        if len(self._maybe_open) + self._admitted >= self.config.max_sessions:
            raise SessionError(
                "max_sessions_reached", f"{self.config.max_sessions} sessions open", session_id=session_id
            )
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    def _projector_for(self, session_id: str, version: int) -> Projector:
        """The fold a (re)opened session continues: its previous incarnation's, when this engine
        served it and nothing was written to the stream since (so a slot a failed close cleanup
        still holds, and a late fact of it, are judged and counted as the offline fold of the
        log does them); else a fresh one. One fold per event feeds the session's decisions, its
        printed tables and the Prometheus families (issue 23)."""
        previous = self.sessions.get(session_id)
        if previous is not None and not previous.taken_over and previous.log.version == version:
            return previous.log.projector
        return Projector()

    def _session_projectors(self) -> list[Projector]:
        """The folds of the sessions this engine serves or served (the audit-read gauges read
        them; a closed session's stays until the id is reopened)."""
        return [session.log.projector for session in list(self.sessions.values())]

    @property
    def closing(self) -> bool:
        """Whether :meth:`aclose` has begun (open_session is refused from then on)."""
        return self._closing

    def session(self, session_id: str) -> Session:
        """The open session; raises SessionError ``unknown_session``."""
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError("unknown_session", "no such session", session_id=session_id)
        return session

    def serves(self, session_id: str) -> bool:
        """Whether this engine still answers for ``session_id``: opened here and not fenced out
        (a session fenced by a takeover or by this replica's own lost lease is left to
        takeover like any other dead owner's, issue 14)."""
        session = self.sessions.get(session_id)
        return session is not None and not session.taken_over

    async def _claimable_history(self, session_id: str) -> list[StoredEvent]:
        """The stream, once it is closed (:func:`claimable_history`)."""
        return await claimable_history(self.store, self.replica, session_id)

    # ------------------------------------------------------------------ crash recovery
    async def recover(self) -> RecoveryReport:
        """Reconcile the log with the live engines after a crash (:func:`recover_dead_sessions`:
        issue 14, only what is dead). Sessions this engine serves are not touched."""
        return await recover_dead_sessions(self.store, self.replica, serves=self.serves)
