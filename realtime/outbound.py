"""The outbound path of one Realtime socket: every server event passes here, in order.

What one engine write (or one front answer) produced is ONE item of a bounded queue drained by
one sender task: one wake-up of the sender per write, and while the sender waits on an empty
queue a write goes out in its producer's own step (no wake-up at all). A client too slow to
drain it (``queue_max`` events held) is closed (1008) and its connection stopped as a
disconnect, so it never slows another connection. A failed send is a disconnect (research
§2.1). The socket is closed through here too (:meth:`Outbound.close_after_queued`), after what
was queued before the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from engine_bridge.eager import run_eagerly
from realtime.protocol import dumps

logger = logging.getLogger(__name__)

_CLOSE = object()  # outbound-queue marker: close the socket after what is queued before it

StopConnection = Callable[[str, bool], None]
"""``stop(end_reason, overriding)``: the connection ends with ``end_reason`` (kept when one is
already set, unless ``overriding``) and its receive loop stops."""


@dataclass
class _Sending:
    """Outbound item: a send the producer started that is waiting for the socket (the
    transport paused writing), and the events of its write still to send after it."""

    send: asyncio.Future[None]
    rest: list[dict[str, Any]]


class Outbound:
    """The ordered, bounded outbound queue of one socket (see the module docstring).

    ``queued``: events held (waiting sends and queued writes); ``close_code``: the code the
    socket is closed with (1000; 1001 on server shutdown; 1008 for a slow client);
    ``socket_gone``: the socket is closed or failed (nothing more is sent);
    ``overflowed``: the client was too slow and its socket is being aborted."""

    def __init__(self, ws: WebSocket, *, queue_max: int, connection_id: str, stop: StopConnection) -> None:
        self.ws = ws
        self.queue_max = queue_max
        self.connection_id = connection_id
        self._stop = stop
        # An item: the server events of one write (a list), a _Sending, or _CLOSE. Unbounded as
        # a queue: ``queued`` (events in it) is held to ``queue_max`` by :meth:`send_all`.
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.queued = 0
        self.close_code = 1000
        self.socket_gone = False
        self.overflowed = False
        self.sender_task: asyncio.Task[None] | None = None
        self._sender_idle = False  # the sender waits on an empty queue: a write may go out at once
        self._abort_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the sender task."""
        self.sender_task = asyncio.create_task(self._sender(), name=f"{self.connection_id}-sender")

    def send(self, event: dict[str, Any]) -> None:
        """Queue one server event (:meth:`send_all`)."""
        self.send_all([event])

    def send_all(self, events: list[dict[str, Any]]) -> None:
        """Queue server events as one item (one wake-up of the sender); a queue that would
        hold more than ``queue_max`` events closes the connection (slow client)."""
        if self.overflowed or self.socket_gone or not events:
            return
        if self.queued + len(events) > self.queue_max:
            self.overflowed = True
            self.close_code = 1008
            logger.warning(
                "%s: client too slow (%d events queued): closing as a disconnect", self.connection_id, self.queued
            )
            self._stop("outbound_queue_full", True)
            self._abort_task = asyncio.get_running_loop().create_task(self._abort_socket())
            return
        if self._sender_idle and self.queue.empty():
            self._send_now(events)
            return
        self.queued += len(events)
        self.queue.put_nowait(events)

    def close_after_queued(self) -> None:
        """Close the socket (with ``close_code``) once what is queued before it went out;
        nothing when the socket is gone or being aborted."""
        if not self.socket_gone and not self.overflowed:
            self.queue.put_nowait(_CLOSE)

    async def finish(self) -> None:
        """At the connection's end: let the sender send what is queued and close the socket
        (at most 5 s), then stop it; wait for a slow client's abort."""
        if self.sender_task is not None:
            if not (self.socket_gone or self.overflowed):
                self.queue.put_nowait(_CLOSE)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self.sender_task), 5.0)
            self.sender_task.cancel()
            with contextlib.suppress(BaseException):
                await self.sender_task
        if self._abort_task is not None:
            with contextlib.suppress(Exception):
                await self._abort_task

    def _send_now(self, events: list[dict[str, Any]]) -> None:
        """Send a write in the producer's step while nothing waits before it (the socket's send
        completes without waiting unless the transport paused writing): no wake-up of the
        sender. A send that has to wait is handed to the sender with the rest of the write, so
        the order on the wire stays the order of the writes."""
        send_text = self.ws.send_text
        for i, event in enumerate(events):
            try:
                sending = run_eagerly(send_text(dumps(event)))
            except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                self._send_failed(exc)
                return
            if sending is not None:
                rest = events[i + 1 :]
                self.queued += 1 + len(rest)
                self.queue.put_nowait(_Sending(sending, rest))
                return

    def _send_failed(self, exc: BaseException) -> None:
        """A failed send is a disconnect (research §2.1)."""
        logger.info("%s: send failed: %s", self.connection_id, exc)
        self.socket_gone = True
        self._stop("send_failed", False)

    async def _abort_socket(self) -> None:
        if self.sender_task is not None:
            self.sender_task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(1008), 5.0)
        self.socket_gone = True

    async def _sender(self) -> None:
        """Drain the queue in order; idle (``_sender_idle``) only while it waits on an empty
        queue, so a write may then go out in its producer's step (:meth:`send_all`)."""
        try:
            await self._drain()
        finally:
            self._sender_idle = False

    async def _drain(self) -> None:
        send_text = self.ws.send_text
        while True:
            self._sender_idle = self.queue.empty()
            item = await self.queue.get()
            self._sender_idle = False
            if item is _CLOSE:
                if not self.socket_gone:
                    with contextlib.suppress(Exception):
                        await self.ws.close(self.close_code)
                    self.socket_gone = True
                return
            events = item
            if isinstance(item, _Sending):
                self.queued -= 1
                events = item.rest
                try:
                    await item.send
                except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                    self._send_failed(exc)
            self.queued -= len(events)
            for event in events:
                if self.socket_gone:
                    break
                try:
                    await send_text(dumps(event))
                except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                    self._send_failed(exc)
