"""What one session's client receives: an ordered queue of :class:`ClientEvent` (fan-out of
the engine's notifications; ``None`` ends the stream). What one engine step delivers is one
queue item (:meth:`ClientFeed.send_batch`, issue 23 step 4): one client write, one wake-up of
the reader, however many events it carries; the reader sees them one by one, in order.
``session.closed`` is the stream's last event: nothing is queued after it (a command refused
after a takeover or a close raises SessionError to its caller; its client was already told,
CASE-35)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine_bridge.messages import ClientEvent


class ClientFeed:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        # An item: one event, a batch of events (one engine step's), or None (the end).
        self.queue: asyncio.Queue[ClientEvent | list[ClientEvent] | None] = asyncio.Queue()
        self.writes = 0  # queue items put (events or batches): client writes
        self.closed = False  # session.closed was queued: the stream takes nothing more

    def send(self, type_: str, **data: Any) -> None:
        """Queue one event, stamped with the wall clock (s); dropped once ``session.closed``
        was queued."""
        if self.closed:
            return
        self.closed = type_ == "session.closed"
        self.writes += 1
        self.queue.put_nowait(ClientEvent(type_, self.session_id, time.time(), data))

    def send_batch(self, type_: str, batch: Sequence[dict[str, Any]]) -> None:
        """Queue one event of type ``type_`` per data dict of ``batch``, in order, as ONE
        queue item (nothing when ``batch`` is empty or the stream was closed); all stamped with
        the same wall clock (s)."""
        if not batch or self.closed:
            return
        self.writes += 1
        now, sid = time.time(), self.session_id
        if len(batch) == 1:
            self.queue.put_nowait(ClientEvent(type_, sid, now, batch[0]))
        else:
            self.queue.put_nowait([ClientEvent(type_, sid, now, data) for data in batch])

    def end(self) -> None:
        """End the stream (after ``session.closed``)."""
        self.queue.put_nowait(None)

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
