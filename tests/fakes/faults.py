"""Fault injection around any :class:`~engine_bridge.ports.StagePort` (test support).

``FlakyAbortPort(inner)`` delegates everything to ``inner``; after
``fail_next_aborts(n, error=...)`` the next ``n`` calls of :meth:`abort` raise
:class:`~engine_bridge.ports.AbortFailed` WITHOUT reaching the inner engine, so the requests
keep running there (R3: the caller must restore the keys and fail the operation).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine_bridge.ports import AbortFailed, FinishedStats, GenerationParams, StageChunk, StagePort, StreamSegment

__all__ = ["FlakyAbortPort"]


class FlakyAbortPort:
    """A StagePort wrapper whose ``abort`` fails on demand. ``failed_aborts`` lists the id
    lists of the aborts it refused (in order); ``inner`` is the wrapped port."""

    def __init__(self, inner: StagePort) -> None:
        self.inner = inner
        self._fail_left = 0
        self._error = "injected abort failure"
        self.failed_aborts: list[list[str]] = []

    @property
    def stage_id(self) -> int:
        return self.inner.stage_id

    @property
    def name(self) -> str:
        return self.inner.name

    def fail_next_aborts(self, n: int = 1, error: str = "injected abort failure") -> None:
        """Make the next ``n`` abort() calls raise AbortFailed(``error``); n=0 disarms."""
        if n < 0:
            raise ValueError("n must be >= 0")
        self._fail_left, self._error = n, error

    async def abort(self, request_ids: Sequence[str]) -> None:
        if self._fail_left > 0:
            self._fail_left -= 1
            ids = list(request_ids)
            self.failed_aborts.append(ids)
            raise AbortFailed(
                f"stage {self.stage_id} ({self.name}): abort {ids} failed: {self._error}", ids[0] if ids else None
            )
        await self.inner.abort(request_ids)

    def generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        return self.inner.generate(request_id, prompt, params)

    def open_stream(self, request_id: str, first: StreamSegment) -> AsyncIterator[StageChunk]:
        return self.inner.open_stream(request_id, first)

    async def update_stream(self, request_id: str, segment: StreamSegment) -> None:
        await self.inner.update_stream(request_id, segment)

    async def close_stream(self, request_id: str) -> None:
        await self.inner.close_stream(request_id)

    def live_request_ids(self) -> set[str]:
        return self.inner.live_request_ids()

    def pop_finished_stats(self, request_id: str) -> FinishedStats | None:
        return self.inner.pop_finished_stats(request_id)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.inner.chat_prompt(messages)

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    def __getattr__(self, name: str) -> Any:  # anything else (max_model_len, …) from the inner port
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
