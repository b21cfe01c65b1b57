"""One session's writer to the append-only log, and the session's own projector.

Every event the engine records goes through :class:`SessionLog`. It is applied at once to the
session's :class:`projections.projector.Projector` — the same folds the offline audit and
tables use, so live decisions and offline re-projection cannot disagree — and appended to the
session's stream in order (optimistic concurrency on the stream version). Turn tables the
fold finalizes are handed to ``on_turn`` (live ``--log-stats`` printing) once the events that
finalized them are durable, so a crash cannot leave a printed table the log does not hold;
they are not kept. The same fold feeds the engine's Prometheus families (``on_folded``: its
verdict, finalized turns and resources state per event), so every event is folded once; it
builds every session's turn tables (the families count them whatever ``log_stats`` says) and
only the printer skips a session with log_stats off (M14: nothing printed or kept).

* :meth:`emit` — durable: returns once the events, and every buffered one before them, are
  committed. Intents that precede an engine call without outputs (abort) use it: the intent is
  in the log before the engine acts (write-ahead).
* :meth:`emit_ahead` — pipelined intent (issue 15): the events are applied and their commit
  is started at once, but the caller does not wait for it; it makes its engine call (submit,
  forward) at once and reads the call's outputs through :meth:`gated`, which hands on no
  output before every intent started so far is committed. So nothing the engine produced for
  a request reaches the client or the log before the request's intent is durable; what the
  engine may hold without a durable intent is a request begun in the last commit's time, of an
  engine that dies with this process (docs/design.md, "Pipelined intents"). A failed intent
  commit ends the request (:meth:`gated` closes its iterator: vLLM aborts it) and raises.
* :meth:`emit_later` — buffered: everything else (commands without an engine call, results)
  is committed within ``flush_interval_s`` or by the next :meth:`emit`, in order. A crash can
  lose at most that window: the log stays a prefix of what happened. The engine's sessions
  share one :class:`FlushTicker`, so their buffered events commit together.
* :meth:`emit_held` — held (issue 15): what a running turn records (its outputs, results and
  rules' events) commits with the turn's next intent (the Stage1 forward), at the turn's end
  (:meth:`release_held`, then within ``flush_interval_s``) or once :attr:`max_held` events
  wait — not on every tick of the clock while the turn streams (each tick cost the session a
  task, a lock, an append and a writer round trip). A crash loses at most the running turn's
  held results (docs/design.md, "Pipelined intents"); the log stays a prefix.

Live folds see provisional positions (the stream version); findings' positions offline are the
log's. A failed write leaves the projector ahead of the log: the log is then marked broken and
every later emit raises :class:`SessionLogBroken`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from engine_bridge.messages import StreamTakenOver
from events.records import StoredEvent
from events.store.errors import ConcurrencyError
from events.store.store import EventStore
from events.structs import struct_of
from events.types import EventBase
from projections.projector import Projector
from projections.resources import SessionResources
from projections.turn_tables import TurnTables

logger = logging.getLogger(__name__)
T = TypeVar("T")
OnFolded = Callable[[StoredEvent, bool, Sequence[TurnTables], SessionResources | None], None]
"""What :class:`SessionLog` hands on per event: (the event, its resources verdict, the turn
tables it finalized, the session's resources state after it)."""
_NO_TURNS: list[TurnTables] = []  # never appended to: the turns of an event that finalized none


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a pipelined commit's failure as seen: the log is broken by it and the next emit
    or :meth:`SessionLog.durable` raises it."""
    if not task.cancelled():
        task.exception()


def _release(waiter: asyncio.Future[None], _done: asyncio.Future[None]) -> None:
    """Wake a :meth:`SessionLog.durable` reader (nothing when it was cancelled meanwhile)."""
    if not waiter.done():
        waiter.set_result(None)


def _chain(done: asyncio.Future[None], source: asyncio.Future[None]) -> None:
    """Settle ``done`` as ``source`` settled (a callback of ``source``); nothing when ``done``
    is settled already (its awaiter was cancelled)."""
    if done.done():
        return
    if source.cancelled():
        done.cancel()
    elif source.exception() is not None:
        done.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        done.set_result(None)


class _Gated:
    """The async iterator of :meth:`SessionLog.gated`."""

    def __init__(self, log: SessionLog, stream: AsyncIterator[T], *, wait_first: bool, batched: bool = False) -> None:
        self._log = log
        self._stream = stream
        self._wait_first = wait_first
        self._batched = batched  # each item handed on as a one-item list (SessionLog.gated_batches)

    def __aiter__(self) -> _Gated:
        return self

    async def __anext__(self) -> Any:
        if self._wait_first:  # strict: the engine call (first item) waits for the intent
            self._wait_first = False
            await self._durable()
        item = await self._stream.__anext__()
        # Checked when the item is about to be handed on, not when it was asked for: a reader
        # parked in the engine's stream (the resident pump) waits through intents started
        # meanwhile (the next turn's update), so every intent started before it is in.
        if self._log._ahead is not None:
            await self._durable()
        return [item] if self._batched else item

    async def _durable(self) -> None:
        try:
            await self._log.durable()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


class SessionLogBroken(RuntimeError):
    """An earlier append of this session failed; nothing more is written for it."""


class FlushTicker:
    """One clock for the buffered events of many sessions. A log with buffered events is
    flushed at the next tick (at most ``interval_s`` after it asked), together with every
    other log due then: the store's group-commit writer turns them into one transaction and
    one thread hop, where a timer per session cost one each (bench_live_overhead)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._due: dict[int, SessionLog] = {}
        self._task: asyncio.Task[None] | None = None

    def schedule(self, log: SessionLog) -> None:
        self._due[id(log)] = log
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        await asyncio.sleep(self.interval_s)
        due, self._due = list(self._due.values()), {}
        # A failed flush marks its own log broken (SessionLogBroken on its next emit). Each
        # log's write is a future (no task per log, issue 23), all started in this step.
        await asyncio.gather(*[log.write_soon() for log in due], return_exceptions=True)

    async def aclose(self) -> None:
        """Flush what is due now and stop the clock."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        due, self._due = list(self._due.values()), {}
        await asyncio.gather(*[log.write_soon() for log in due], return_exceptions=True)


class SessionLog:
    #: False: strict write-ahead for the pipelined paths too — :meth:`gated` waits for the
    #: intents before it starts the engine call (the first item of an ephemeral or forwarded
    #: request). For comparisons (bench_live_overhead ``ledger-strict`` arm); a resident
    #: ``update_stream`` is sent at once either way.
    pipelined = True
    #: Held events after which :meth:`emit_held` asks for a flush (~6 s of coalesced outputs
    #: of one stage at 0.1 s windows): bounds what a crash can lose of a long turn.
    max_held = 64

    def __init__(
        self,
        store: EventStore,
        session_id: str,
        version: int,
        *,
        flush_interval_s: float = 0.02,
        on_turn: Callable[[TurnTables], None] | None = None,
        projector: Projector | None = None,
        ticker: FlushTicker | None = None,
        on_applied: Callable[[StoredEvent], None] | None = None,
        on_folded: OnFolded | None = None,
    ) -> None:
        """``ticker``: the clock shared by the engine's sessions (a private one by default,
        ticking every ``flush_interval_s``). ``on_folded``: called with every event as it is
        applied, with what this log's projector made of it — ``(stored, accepted, finalized
        turn tables, the session's resources state)`` — so the engine's Prometheus families
        count the session's own fold, never a second one (issue 23;
        ``engine_bridge.prometheus.LedgerMetrics.apply_folded``). ``on_applied``: called with
        every event as it is applied, for a consumer that folds it itself (a takeover's events,
        whose projector started from the stream's history). Their failures are swallowed
        (DOMAIN §5.5). ``projector``: default a fresh :class:`Projector`: with ``on_folded`` one
        that builds every session's turn tables (the Prometheus families count them, log_stats
        on or off; with log_stats off none is printed or kept, M14), without it the live one
        (``Projector(live=True)``: a session with log_stats off builds no turn state at all)."""
        self.store = store
        self.session_id = session_id
        self.version = version
        self.projector = projector or Projector(live=on_folded is None)
        self.ticker = ticker or FlushTicker(flush_interval_s)
        self.on_turn = on_turn
        self.on_applied = on_applied
        self.on_folded = on_folded
        self.on_fenced: Callable[[ConcurrencyError], None] | None = None  # another writer moved the stream
        self.events_written = 0
        self.appends = 0  # store appends (transactions' shares) this log made
        self.durable_emits = 0
        self.durable_wait_s = 0.0  # wall seconds callers spent awaiting durable emits (perf_counter)
        self.ahead_emits = 0  # pipelined intents (emit_ahead)
        self.ahead_commit_s = 0.0  # wall seconds pipelined intents took to commit, not waited on
        self._pending: list[EventBase] = []
        self._held = 0  # events of _pending recorded by emit_held
        self._unprinted: list[TurnTables] = []  # finalized by events of _pending: printed once durable
        self._applied = version  # provisional positions for the live fold
        self._broken: BaseException | None = None
        self._writing = False  # an append of this log is committing: the next write starts after it
        self._queued: list[asyncio.Future[None]] = []  # writes asked for meanwhile: served by the next one
        self._ahead: asyncio.Future[None] | None = None  # the latest pipelined intent's commit

    async def emit(self, *events: EventBase) -> None:
        """Apply ``events`` and append them after everything buffered, durably. Raises what the
        store raises (then SessionLogBroken on later calls); a stream another writer moved on
        (ConcurrencyError: the session was taken over) raises SessionError
        ``session_taken_over`` after calling ``on_fenced``."""
        self._apply(events)
        start = time.perf_counter()
        try:
            await self.write_soon()
        finally:
            self.durable_emits += 1
            self.durable_wait_s += time.perf_counter() - start

    def emit_ahead(self, *events: EventBase) -> None:
        """Apply ``events`` and start committing them (after everything buffered) without
        waiting: a pipelined intent. The caller's engine call follows at once; its outputs must
        be read through :meth:`gated`. Raises SessionLogBroken after an earlier failure."""
        self._apply(events)
        self.ahead_emits += 1
        loop = asyncio.get_running_loop()
        self._ahead = done = loop.create_future()
        done.add_done_callback(_retrieve)
        # Started on the next tick: the engine call the caller schedules now goes first.
        loop.call_soon(self._start_ahead, done)

    def _start_ahead(self, done: asyncio.Future[None]) -> None:
        """The pipelined intent's commit: a write (no task, issue 23) whose end settles ``done``."""
        start = time.perf_counter()
        written = self.write_soon()
        written.add_done_callback(partial(self._ahead_written, done, start))

    def _ahead_written(self, done: asyncio.Future[None], start: float, written: asyncio.Future[None]) -> None:
        self.ahead_commit_s += time.perf_counter() - start
        _chain(done, written)

    async def durable(self) -> None:
        """Until every intent started by :meth:`emit_ahead` is committed (at once when none is
        pending). Raises SessionLogBroken from what its commit raised (SessionError
        ``session_taken_over`` when the stream was fenced, else the store's error)."""
        ahead = self._ahead
        if ahead is None:
            return
        if not ahead.done():
            start = time.perf_counter()
            try:
                # A waiter of its own: a cancelled reader does not cancel the commit (as with
                # asyncio.wait, without its set, counter and callback bookkeeping).
                waiter = asyncio.get_running_loop().create_future()
                ahead.add_done_callback(partial(_release, waiter))
                await waiter
            finally:
                self.durable_wait_s += time.perf_counter() - start
        failure = ahead.exception()
        if failure is not None:  # a new error each time: the commit's own is raised nowhere twice
            raise SessionLogBroken(
                f"session {self.session_id!r}: a pipelined intent was not committed: {failure}"
            ) from failure
        if self._ahead is ahead:
            self._ahead = None  # commits run in order: every earlier intent is in too

    def gated(self, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """``stream`` (an engine call's outputs), each item handed on only once every intent
        started so far is durable (:meth:`durable`). When that commit fails, ``stream`` is
        closed (vLLM aborts the request) and SessionLogBroken raised. The test is made when an
        item has arrived (after the wait), so intents started while the reader waited count."""
        return _Gated(self, stream, wait_first=not self.pipelined)

    def gated_batches(self, stream: AsyncIterator[T]) -> AsyncIterator[list[T]]:
        """:meth:`gated`, each item handed on as a one-item list: one engine step's delivery
        of an ephemeral request (vLLM merges what queued for a lagging reader into one
        output), read as a batch without a layer of its own per output (issue 23 step 4)."""
        return _Gated(self, stream, wait_first=not self.pipelined, batched=True)

    def emit_later(self, *events: EventBase) -> None:
        """Apply ``events`` now; append them (in order) at the next flush."""
        self._apply(events)
        self.ticker.schedule(self)

    def emit_held(self, *events: EventBase) -> None:
        """Apply ``events`` now; append them (in order) with the next intent or flush, at the
        latest once :attr:`max_held` events are held or :meth:`release_held` is called."""
        self._apply(events)
        self._held += len(events)
        if self._held >= self.max_held:
            self.ticker.schedule(self)

    def release_held(self) -> None:
        """The turn ended: what it holds is committed at the next flush."""
        if self._pending:
            self.ticker.schedule(self)

    async def flush(self) -> None:
        """Until everything applied so far is committed (or its append failed: raised here)."""
        await self.write_soon()

    def write_soon(self) -> asyncio.Future[None]:
        """Start committing everything applied so far, after the append of this log that is
        committing (one at a time, in order: each append expects the version the one before it
        left); returns a future settled when it is committed, with what the append raised (a
        fenced stream: :class:`StreamTakenOver`) when it fails. No task: the store's append
        future is followed by a callback (issue 23: one task less per intent and per tick).
        Cancelling the returned future does not stop the write."""
        loop = asyncio.get_running_loop()
        if self._writing:  # served by the write that starts once this one has committed
            queued: asyncio.Future[None] = loop.create_future()
            self._queued.append(queued)
            return queued
        return self._start_write(loop)

    def _start_write(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        written: asyncio.Future[None] = loop.create_future()
        batch, self._pending, self._held = self._pending, [], 0
        printable, self._unprinted = self._unprinted, []
        if not batch:
            self._print(printable)
            written.set_result(None)
            return written
        try:
            commit = asyncio.ensure_future(self.store.append(self.session_id, batch, expected_version=self.version))
        except BaseException as exc:  # noqa: BLE001 - as the append's own failure (broken, raised to the waiter)
            self._failed(exc, written)
            return written
        self._writing = True
        commit.add_done_callback(partial(self._committed, batch, printable, written))
        return written

    def _committed(
        self,
        batch: list[EventBase],
        printable: list[TurnTables],
        written: asyncio.Future[None],
        commit: asyncio.Future[Any],
    ) -> None:
        """The append of ``batch`` ended: bookkeeping, then the writes asked for meanwhile."""
        self._writing = False
        if commit.cancelled():  # the store's close cancelled it: nothing more is written
            self._broken = asyncio.CancelledError()
            written.cancel()
        elif (failure := commit.exception()) is not None:
            self._failed(failure, written)
        else:
            self.version += len(batch)
            self.events_written += len(batch)
            self.appends += 1
            self._print(printable)
            if not written.done():  # (cancelled by its awaiter: the write stands all the same)
                written.set_result(None)
        if self._queued:
            queued, self._queued = self._queued, []
            nxt = self._start_write(asyncio.get_running_loop())
            for waiter in queued:
                nxt.add_done_callback(partial(_chain, waiter))

    def _failed(self, exc: BaseException, written: asyncio.Future[None]) -> None:
        """An append failed: the log is broken by it; a stream another writer moved on (fenced:
        the session was taken over, issue 14) is told to ``on_fenced`` and raised as
        :class:`StreamTakenOver`."""
        self._broken = exc
        failure = exc
        try:
            if isinstance(exc, ConcurrencyError):
                failure = StreamTakenOver(f"another writer appended to the stream: {exc}", session_id=self.session_id)
                failure.__cause__ = exc
                if self.on_fenced is not None:
                    self.on_fenced(exc)
        finally:
            if not written.done():
                written.set_exception(failure)

    def fence(self, reason: str) -> None:
        """Write nothing more (issue 14 fencing): what is buffered is dropped, as a crash would
        lose it, and every later emit raises SessionLogBroken. An append already committing
        still lands or is refused by its expected version."""
        if self._broken is None:
            self._broken = SessionLogBroken(f"session {self.session_id!r} fenced out: {reason}")
        self._pending, self._held, self._unprinted = [], 0, []

    def _apply(self, events: tuple[EventBase, ...]) -> None:
        if self._broken is not None:
            raise SessionLogBroken(
                f"session {self.session_id!r}: an earlier append failed: {self._broken}"
            ) from self._broken
        now = time.time()
        projector, sid, on_folded = self.projector, self.session_id, self.on_folded
        turns_fold, pending = projector.turns, self._pending
        for event in events:
            self._applied += 1
            stored = StoredEvent(self._applied, sid, self._applied, now, struct_of(event))
            accepted = projector.apply(stored)
            pending.append(event)
            turns = turns_fold.take_finalized() if turns_fold.finalized else _NO_TURNS
            if on_folded is not None:
                try:  # the session's resources state: Projector.session_resources, inline
                    on_folded(stored, accepted, turns, projector.resources.sessions.get(sid))
                except Exception:  # noqa: BLE001 - metrics never block the session (DOMAIN §5.5)
                    logger.exception("session %s: metrics hook failed on %s", sid, event.type)
            if self.on_applied is not None:
                try:
                    self.on_applied(stored)
                except Exception:  # noqa: BLE001 - metrics never block the session (DOMAIN §5.5)
                    logger.exception("session %s: metrics hook failed on %s", sid, event.type)
            if turns and self.on_turn is not None:  # handed on once durable, not kept: a long-lived session stays flat
                self._unprinted.extend(turns)

    def _print(self, turns: list[TurnTables]) -> None:
        """Hand turns whose finalizing events are now durable to ``on_turn``: what the live
        engine prints is what an offline re-projection of the log prints, even after a crash."""
        on_turn = self.on_turn
        if on_turn is None:
            return
        for turn in turns:
            try:
                on_turn(turn)
            except Exception:  # noqa: BLE001 - DOMAIN §5.5: printing failures never block
                logger.exception("session %s: printing the tables of %s failed", self.session_id, turn.response_id)

    async def close(self) -> None:
        await self.flush()
