"""What a turn's Stage0 call delivers, one batch per delivery (issue 23 step 4)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from engine_bridge.ports import StageChunk
from engine_bridge.turn_run import TurnRun


async def stage0_batches(turn: TurnRun) -> AsyncIterator[list[StageChunk]]:
    """The outputs of the Stage0 call ``TurnRunner._call_stage0`` made, one list per delivery
    (issue 23 step 4): an ephemeral request's item is one engine step's output (vLLM merges
    what queued for a lagging reader into one); the resident pump's chunks waiting in the
    turn's queue travel together, up to the segment's end or the stream's failure."""
    if turn.stage0 is not None and turn.first is not None:
        try:
            first = await turn.first
        except StopAsyncIteration:
            return
        yield [first]
        async for chunk in turn.stage0:
            yield [chunk]
        return
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
