"""What a turn's Stage0 call delivers, one batch per delivery (issue 23 step 4)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from engine_bridge.ports import StageChunk
from engine_bridge.turn_run import TurnRun


def stage0_batches(turn: TurnRun) -> AsyncIterator[list[StageChunk]]:
    """The outputs of the Stage0 call ``TurnRunner._call_stage0`` made, one list per delivery
    (issue 23 step 4): an ephemeral request's item is one engine step's output (vLLM merges
    what queued for a lagging reader into one), read straight from its gated stream (no layer
    of its own per output); the resident pump's chunks waiting in the turn's queue travel
    together, up to the segment's end or the stream's failure."""
    if turn.stage0 is not None and turn.first is not None:
        return _Deliveries(turn.first, turn.stage0)
    return _resident_batches(turn)


class _Deliveries:
    """An ephemeral request's deliveries: the eagerly started first one (``first``: a future of
    a one-item list, or of StopAsyncIteration), then the rest of the stream (one-item lists,
    ``SessionLog.gated_batches``). ``__anext__`` hands back their own awaitables."""

    def __init__(self, first: asyncio.Future[Any], rest: AsyncIterator[list[StageChunk]]) -> None:
        self._first: asyncio.Future[Any] | None = first
        self._rest = rest

    def __aiter__(self) -> _Deliveries:
        return self

    def __anext__(self) -> Awaitable[list[StageChunk]]:
        first, self._first = self._first, None
        return first if first is not None else self._rest.__anext__()


async def _resident_batches(turn: TurnRun) -> AsyncIterator[list[StageChunk]]:
    if turn.first is not None:
        await turn.first  # the resident update (raises what update_stream raised)
    while True:
        routed = await turn.chunks.get()
        batch: list[StageChunk] = []
        failure: Exception | None = None
        ended = False
        while True:
            if routed is None:
                ended = True
                break
            if isinstance(routed, Exception):
                failure = routed  # the resident stream failed (prompt too long, engine dead)
                break
            batch.append(routed)
            if routed.segment_done or routed.finished:
                ended = True
                break
            if turn.chunks.empty():
                break
            routed = turn.chunks.get_nowait()
        if batch:
            yield batch
        if failure is not None:
            raise failure
        if ended:
            return
