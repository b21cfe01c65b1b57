"""The response work of one committed turn, as the turn's task and the session see it, and the
sampling of its stage requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from decider import TurnRef
from engine_bridge.messages import EngineConfig
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.ports import GenerationParams, StageChunk


@dataclass
class TurnRun:
    """The response work of one committed turn (``ref``: its ids and fence)."""

    ref: TurnRef
    user_text: str
    speak: bool
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    # What the resident pump routes to the turn: a chunk, the stream's failure, or None (ended).
    chunks: asyncio.Queue[StageChunk | Exception | None] = field(default_factory=asyncio.Queue)
    text: list[str] = field(default_factory=list)
    outputs: OutputCoalescer | None = None  # the stage currently streaming
    # The Stage0 engine call, started eagerly by TurnRunner.start (inside the command's step):
    # the ephemeral request's output stream and its first item, or the resident open/update.
    stage0: AsyncIterator[list[StageChunk]] | None = None  # one-item lists (SessionLog.gated_batches)
    first: asyncio.Future[Any] | None = None

    @property
    def request_id(self) -> str:
        return self.ref.request_id

    def answer(self) -> str:
        return "".join(self.text)


def generation_params(config: EngineConfig, max_tokens: int, stage_id: int = 0) -> GenerationParams:
    """Sampling of one stage request (Stage1 may override ``ignore_eos``)."""
    ignore_eos = config.ignore_eos
    if stage_id >= 1 and config.talker_ignore_eos is not None:
        ignore_eos = config.talker_ignore_eos
    return GenerationParams(max_tokens=max_tokens, temperature=config.temperature, ignore_eos=ignore_eos)
