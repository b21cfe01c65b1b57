"""One session's writer to the append-only log, and the session's own projector.

Every event the engine records goes through :class:`SessionLog`: it is appended to the
session's stream (optimistic concurrency on the stream version), then applied to the
session's :class:`projections.projector.Projector` — the same folds the offline audit and
tables use, so live decisions and offline re-projection cannot disagree. Turn tables the fold
finalizes are handed to ``on_turn`` (live ``--log-stats`` printing).

* :meth:`emit` — durable: returns once the events (and every buffered one before them) are
  committed. Intents (submit, update, abort, release) use it before the engine call.
* :meth:`emit_later` — buffered: output events are batched to the log within
  ``flush_interval_s`` (or by the next :meth:`emit`), in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from events.records import StoredEvent
from events.store.store import EventStore
from events.types import EventBase
from projections.projector import Projector
from projections.turn_tables import TurnTables


class SessionLog:
    def __init__(self, store: EventStore, session_id: str, version: int, *, flush_interval_s: float = 0.02,
                 on_turn: Callable[[TurnTables], None] | None = None, projector: Projector | None = None) -> None:
        self.store = store
        self.session_id = session_id
        self.version = version
        self.projector = projector or Projector()
        self.flush_interval_s = flush_interval_s
        self.on_turn = on_turn
        self.events_written = 0
        self._pending: list[EventBase] = []
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None

    async def emit(self, *events: EventBase) -> list[StoredEvent]:
        """Append ``events`` after everything buffered, durably. Raises what the store raises
        (ConcurrencyError when another writer touched the stream)."""
        async with self._lock:
            return await self._write(list(events))

    def emit_later(self, *events: EventBase) -> None:
        """Buffer ``events`` (in order) for the next flush."""
        self._pending.extend(events)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def flush(self) -> None:
        async with self._lock:
            await self._write([])

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.flush_interval_s)
        await self.flush()

    async def _write(self, events: list[EventBase]) -> list[StoredEvent]:
        batch = self._pending + events
        self._pending = []
        if not batch:
            return []
        positions = await self.store.append(self.session_id, batch, expected_version=self.version)
        now = time.time()
        stored = []
        for offset, (position, event) in enumerate(zip(positions, batch), 1):
            st = StoredEvent(position, self.session_id, self.version + offset, now, event)
            self.projector.apply(st)
            stored.append(st)
        self.version += len(batch)
        self.events_written += len(batch)
        for turn in self.projector.turns.take_finalized():
            self.projector.turn_tables.append(turn)
            if self.on_turn is not None:
                try:
                    self.on_turn(turn)
                except Exception:  # noqa: BLE001 - DOMAIN §5.5: printing failures never block
                    pass
        return stored[-len(events):] if events else []

    async def close(self) -> None:
        await self.flush()
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
