"""What one session's client receives: an ordered queue of :class:`ClientEvent` (fan-out of
the engine's notifications; ``None`` ends the stream). What one engine step delivers is one
queue item (:meth:`ClientFeed.send_batch`, issue 23 step 4): one client write, one wake-up of
the reader, however many events it carries; the reader sees them one by one, in order.
``session.closed`` is the stream's last event: nothing is queued after it (a command refused
after a takeover or a close raises SessionError to its caller; its client was already told,
CASE-35).

A front that projects every event at once (the Realtime connection) :meth:`subscribes
<ClientFeed.subscribe>` instead of reading: each write is then handed to its sink in the
sender's own step, in order — no queue, no task hop per write (issue 23's live CPU budget).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from engine_bridge.messages import ClientEvent


class ClientFeed:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        # An item: one event, a batch of events (one engine step's), or None (the end).
        self.queue: asyncio.Queue[ClientEvent | list[ClientEvent] | None] = asyncio.Queue()
        self.writes = 0  # queue items put (events or batches): client writes
        self.closed = False  # session.closed was queued: the stream takes nothing more
        self._sink: Callable[[Sequence[ClientEvent] | None], None] | None = None

    def send(self, type_: str, **data: Any) -> None:
        """Queue one event, stamped with the wall clock (s); dropped once ``session.closed``
        was queued."""
        if self.closed:
            return
        self.closed = type_ == "session.closed"
        self.writes += 1
        event = ClientEvent(type_, self.session_id, time.time(), data)
        if self._sink is not None:
            self._sink((event,))
        else:
            self.queue.put_nowait(event)

    def send_batch(self, type_: str, batch: Sequence[dict[str, Any]]) -> None:
        """Queue one event of type ``type_`` per data dict of ``batch``, in order, as ONE
        queue item (nothing when ``batch`` is empty or the stream was closed); all stamped with
        the same wall clock (s)."""
        if not batch or self.closed:
            return
        self.writes += 1
        now, sid = time.time(), self.session_id
        if self._sink is not None:
            if len(batch) == 1:  # the common delivery: one output (no comprehension frame)
                self._sink([ClientEvent(type_, sid, now, batch[0])])
            else:
                self._sink([ClientEvent(type_, sid, now, data) for data in batch])
        elif len(batch) == 1:
            self.queue.put_nowait(ClientEvent(type_, sid, now, batch[0]))
        else:
            self.queue.put_nowait([ClientEvent(type_, sid, now, data) for data in batch])

    def end(self) -> None:
        """End the stream (after ``session.closed``)."""
        if self._sink is not None:
            self._sink(None)
        else:
            self.queue.put_nowait(None)

    def subscribe(self, sink: Callable[[Sequence[ClientEvent] | None], None]) -> None:
        """From now on hand every write to ``sink`` at once, in the writer's step: the events
        of one write (in order), or None for the end of the stream. What was queued before is
        handed on first, one call per queued write. ``sink`` must not raise (a front catches
        its own failures) nor await; :meth:`events` and :meth:`drain` then see nothing more.
        Raises RuntimeError when a sink is already subscribed."""
        if self._sink is not None:
            raise RuntimeError(f"session {self.session_id!r}: the client feed already has a subscriber")
        while not self.queue.empty():
            item = self.queue.get_nowait()
            sink(None if item is None else item if isinstance(item, list) else (item,))
        self._sink = sink

    async def events(self) -> AsyncIterator[ClientEvent]:
        """What the client receives, in order, until the stream ends."""
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, list):
                for event in item:
                    yield event
            else:
                yield item

    def drain(self) -> list[ClientEvent]:
        """Events received so far (non-blocking)."""
        out: list[ClientEvent] = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, list):
                out.extend(item)
            elif item is not None:
                out.append(item)
        return out
