"""The resident Stage0 request of a session (capability ``supports_core_resumable_request``,
DOMAIN §3.4): one open stream per epoch, whose chunks a pump routes to the turn that owns the
current segment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from engine_bridge.client_feed import ClientFeed
from engine_bridge.eager import start_eagerly
from engine_bridge.ports import StageChunk, StagePort


class ResidentStream:
    """``route(request_id)``: the chunk queue of the turn that owns ``request_id``'s current
    segment, or None (the chunk is dropped: no turn reads it). A failure of the stream
    (StagePortError, or any exception) is put on that queue for the turn to fail with; with no turn it is
    sent to the client as ``error`` ``stage_error``."""

    def __init__(
        self,
        port: StagePort,
        feed: ClientFeed,
        route: Callable[[str], asyncio.Queue[StageChunk | Exception | None] | None],
    ) -> None:
        self.port = port
        self.feed = feed
        self.route = route
        self.request_id: str | None = None  # the resident request whose stream is open
        self.task: asyncio.Future[None] | None = None

    def open(self, request_id: str, stream: AsyncIterator[StageChunk]) -> None:
        """Start pumping ``stream``; its first step (the engine call) runs now, in the
        caller's step (:func:`~engine_bridge.eager.start_eagerly`)."""
        self.request_id = request_id
        self.task = start_eagerly(self._pump(request_id, stream))

    def forget(self) -> None:
        """The request is gone (cancel, engine abort): the next turn opens a new stream."""
        self.request_id = None

    async def close(self) -> None:
        """Close the open stream on the engine and stop the pump."""
        if self.request_id is not None:
            await self.port.close_stream(self.request_id)
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _pump(self, request_id: str, stream: AsyncIterator[StageChunk]) -> None:
        try:
            async for chunk in stream:
                queue = self.route(request_id)
                if queue is not None:
                    queue.put_nowait(chunk)
        except Exception as exc:  # noqa: BLE001 - a port error or any other: the turn fails with it
            queue = self.route(request_id)
            if queue is not None:
                queue.put_nowait(exc)  # the turn fails with it: FailTurn (its code, D14, a new epoch)
            else:
                self.feed.send("error", code="stage_error", message=str(exc), event_id=None)
        finally:
            if self.request_id == request_id:
                self.request_id = None
