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
    # Tokens of the response so far (token_counts): Stage0's prompt, Stage0's tokens sent as
    # text deltas, Stage1's tokens sent as audio deltas.
    stage0_tokens_in: int | None = None
    stage0_tokens_out: int = 0
    stage1_tokens_out: int = 0

    @property
    def request_id(self) -> str:
        return self.ref.request_id

    def answer(self) -> str:
        return "".join(self.text)

    def token_counts(self) -> dict[str, int]:
        """The engine's token counts of this turn's response so far, the ``token_counts`` of
        its terminal client event (``response.done`` / ``response.cancelled``):
        ``stage0_tokens_in`` the Stage0 prompt's tokens as submitted (``StageRequestSubmitted.
        num_tokens_in``: an ephemeral request's whole prompt; a resident stream's update, only
        the update's own tokens — absent when the turn was never submitted),
        ``stage0_tokens_out`` Stage0's tokens sent as text deltas, ``stage1_tokens_out`` the
        talker's (Stage1) tokens sent as audio deltas. A cancelled response counts what it
        sent before the cancel."""
        counts = {"stage0_tokens_out": self.stage0_tokens_out, "stage1_tokens_out": self.stage1_tokens_out}
        if self.stage0_tokens_in is not None:
            counts["stage0_tokens_in"] = self.stage0_tokens_in
        return counts


def generation_params(config: EngineConfig, max_tokens: int, stage_id: int = 0) -> GenerationParams:
    """Sampling of one stage request (Stage1 may override ``ignore_eos``)."""
    ignore_eos = config.ignore_eos
    if stage_id >= 1 and config.talker_ignore_eos is not None:
        ignore_eos = config.talker_ignore_eos
    return GenerationParams(max_tokens=max_tokens, temperature=config.temperature, ignore_eos=ignore_eos)
