"""Recording a stage's outputs in the log without one event per token.

The first token-carrying output of a segment is recorded on its own (its ts is the exact
first-token time, so TTFT re-projects exactly); later outputs are merged per window into one
``StageOutput`` carrying their token count, text and audio frames, stamped with the ts of the
window's last output (so the last-token time is exact too). Token totals and first/last token
stamps are therefore those of a per-output log; the per-output receipt gaps are kept in the
segment's metrics snapshot (``vllm_itls_ms``). A terminal output (``finished``/``finish_reason``)
closes the window at once. What one engine step delivered is recorded by one call
(:meth:`OutputCoalescer.add_batch`: one ``emit_held``). The events are held (``SessionLog.emit_held``): they commit with
the turn's next intent or at its end.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_bridge.ports import StageChunk
from engine_bridge.session_log import SessionLog
from events.types import StageOutput


class OutputCoalescer:
    def __init__(
        self, log: SessionLog, stage_id: int, request_id: str, *, window_s: float, frames_per_token: int = 0
    ) -> None:
        self.log = log
        self.stage_id = stage_id
        self.request_id = request_id
        self.window_s = window_s
        self.frames_per_token = frames_per_token
        self._seen_token = False
        self._tokens = 0
        self._text: list[str] = []
        self._first_ts: float | None = None
        self._last: StageChunk | None = None

    def add(self, chunk: StageChunk) -> None:
        """Record one output (possibly merged into the open window)."""
        events: list[StageOutput] = []
        self._add(chunk, events)
        if events:
            self.log.emit_held(*events)

    def add_batch(self, chunks: Sequence[StageChunk]) -> None:
        """Record what one engine step delivered, in order: the events it closes go to the log
        in ONE ``emit_held`` (issue 23 step 4); the same events, in the same order, as one
        :meth:`add` per chunk."""
        events: list[StageOutput] = []
        for chunk in chunks:
            self._add(chunk, events)
        if events:
            self.log.emit_held(*events)

    def _add(self, chunk: StageChunk, events: list[StageOutput]) -> None:
        n = len(chunk.new_token_ids)
        terminal = chunk.finished or chunk.finish_reason is not None
        if n and not self._seen_token:
            self._close(events)
            self._seen_token = True
            events.append(self._event(n, chunk.text_delta, chunk, chunk))
            return
        if self._first_ts is None:
            self._first_ts = chunk.received_ts
        self._tokens += n
        if chunk.text_delta:
            self._text.append(chunk.text_delta)
        self._last = chunk
        if terminal or chunk.received_ts - self._first_ts >= self.window_s:
            self._close(events)

    def flush(self) -> None:
        """Write the open window (if any) to the log buffer."""
        events: list[StageOutput] = []
        self._close(events)
        if events:
            self.log.emit_held(*events)

    def _close(self, events: list[StageOutput]) -> None:
        if self._last is None:
            return
        events.append(self._event(self._tokens, "".join(self._text), self._last, self._last))
        self._tokens, self._text, self._first_ts, self._last = 0, [], None, None

    def _event(self, n: int, text: str, chunk: StageChunk, last: StageChunk) -> StageOutput:
        return StageOutput(
            session_id=self.log.session_id,
            ts=last.received_ts,
            stage_id=self.stage_id,
            request_id=self.request_id,
            num_new_tokens=n,
            text_delta=text or None,
            audio_frames=n * self.frames_per_token,
            finished=chunk.finished,
            finish_reason=chunk.finish_reason,
        )
