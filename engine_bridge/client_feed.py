"""What one session's client receives: an ordered queue of :class:`ClientEvent` (fan-out of
the engine's notifications; ``None`` ends the stream). ``session.closed`` is the stream's last
event: nothing is queued after it (a command refused after a takeover or a close raises
SessionError to its caller; its client was already told, CASE-35)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from engine_bridge.messages import ClientEvent


class ClientFeed:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.queue: asyncio.Queue[ClientEvent | None] = asyncio.Queue()
        self.closed = False  # session.closed was queued: the stream takes nothing more

    def send(self, type_: str, **data: Any) -> None:
        """Queue one event, stamped with the wall clock (s); dropped once ``session.closed``
        was queued."""
        if self.closed:
            return
        self.closed = type_ == "session.closed"
        self.queue.put_nowait(ClientEvent(type_, self.session_id, time.time(), data))

    def end(self) -> None:
        """End the stream (after ``session.closed``)."""
        self.queue.put_nowait(None)

    async def events(self) -> AsyncIterator[ClientEvent]:
        """What the client receives, in order, until the stream ends."""
        while True:
            event = await self.queue.get()
            if event is None:
                return
            yield event

    def drain(self) -> list[ClientEvent]:
        """Events received so far (non-blocking)."""
        out = []
        while not self.queue.empty():
            event = self.queue.get_nowait()
            if event is not None:
                out.append(event)
        return out
