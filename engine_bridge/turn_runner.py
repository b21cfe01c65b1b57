"""The response work of a session's committed turns: one task per turn that submits nothing
itself (the session does, write-ahead) but pumps Stage0's stream, forwards its text to Stage1
(the talker) and asks the session's rules what each outcome means (end of turn, listen unit,
engine abort, port failure). What streams arrive is recorded as results (outputs, snapshots,
transfers); what they mean is decided by :mod:`decider`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from decider import (
    EndTurn,
    EngineAborted,
    FailTurn,
    FirstOutput,
    Listen,
    Stage0Done,
    TurnRef,
)
from engine_bridge.client_feed import ClientFeed
from engine_bridge.conversation import Conversation
from engine_bridge.eager import start_eagerly
from engine_bridge.messages import EngineConfig
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.ports import StageChunk, StagePort, StagePortError, StreamSegment, port_failure
from engine_bridge.resident_stream import ResidentStream
from engine_bridge.segments import SegmentRecorder
from engine_bridge.session_log import SessionLog
from engine_bridge.stage0_batches import stage0_batches
from engine_bridge.talker import talk
from engine_bridge.turn_run import TurnRun, generation_params

logger = logging.getLogger(__name__)


class TurnRunner:
    """``run(command, turn)``: decide a command of the turn and execute its steps (the
    session's executor); ``on_done``: called when a turn ends uncancelled (deferred input)."""

    def __init__(
        self,
        *,
        log: SessionLog,
        ports: list[StagePort],
        config: EngineConfig,
        feed: ClientFeed,
        conversation: Conversation,
        resident: bool,
        run: Callable[[Any, TurnRun | None], Awaitable[Any]],
        on_done: Callable[[], Awaitable[None]],
    ) -> None:
        self.log = log
        self.ports = ports
        self.config = config
        self.feed = feed
        self.conversation = conversation
        self.resident = resident
        self._run = run
        self._on_done = on_done
        self.active: TurnRun | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self.stream = ResidentStream(ports[0], feed, self._route)

    def _route(self, request_id: str) -> asyncio.Queue[StageChunk | Exception | None] | None:
        turn = self.active
        return turn.chunks if turn is not None and turn.request_id == request_id else None

    # ------------------------------------------------------------------ control
    def start(
        self, ref: TurnRef, kind: str, *, text: str, speak: bool, prompt: str, num_tokens_in: int, submit_ts: float
    ) -> None:
        """Run the submitted turn ``ref`` (``kind``: initial / update of the resident stream).
        The Stage0 engine call is made here, in the caller's step (vLLM's ``add_request`` before
        ``commit()`` returns, issue 15); the turn's task reads its outputs from the next pass."""
        turn = TurnRun(ref, text, speak, stage0_tokens_in=num_tokens_in)
        self.active = turn
        self.idle.clear()
        recorder = SegmentRecorder(
            stage_id=0, submit_ts=submit_ts, num_prompt_tokens=num_tokens_in, resident=self.resident
        )
        self._call_stage0(turn, prompt, kind)
        turn.task = asyncio.get_running_loop().create_task(self._turn(turn, recorder))

    def _call_stage0(self, turn: TurnRun, prompt: str, kind: str) -> None:
        """Make the turn's Stage0 engine call now (:func:`start_eagerly`): the ephemeral
        request's first ``__anext__`` (gated: its output waits for the submit intent), the
        resident stream's open or update. Failures surface where the turn reads them — also a
        port method that raises at once (``open_stream`` of a dead engine): the turn fails
        with it (D14), the command does not raise."""
        try:
            self._stage0_call(turn, prompt, kind)
        except Exception as exc:  # noqa: BLE001 - the turn's task fails the turn with it (D14)
            turn.stage0 = None
            turn.first = asyncio.get_running_loop().create_future()
            turn.first.set_exception(exc)

    def _stage0_call(self, turn: TurnRun, prompt: str, kind: str) -> None:
        port0 = self.ports[0]
        budget = self.config.max_tokens if turn.speak else 1  # a listen unit produces no visible output
        params = generation_params(self.config, budget)
        if not self.resident:
            turn.stage0 = self.log.gated_batches(port0.generate(turn.request_id, prompt, params))
            turn.first = start_eagerly(turn.stage0.__anext__())
        elif kind != "initial":
            turn.first = start_eagerly(port0.update_stream(turn.request_id, segment=StreamSegment(prompt, params)))
        else:
            stream = port0.open_stream(turn.request_id, StreamSegment(prompt, params))
            self.stream.open(turn.request_id, self.log.gated(stream))

    @staticmethod
    def halt(turn: TurnRun | None) -> None:
        """The turn stops producing; what it received so far is in the log (its segment, D1)."""
        if turn is None:
            return
        turn.cancelled = True
        if turn.outputs is not None:
            turn.outputs.flush()

    async def stop(self, turn: TurnRun | None) -> None:
        """End a halted turn's task; the session is idle."""
        if turn is not None:
            turn.chunks.put_nowait(None)
            self._drop_first(turn)
            if turn.task is not None:
                turn.task.cancel()
                await asyncio.gather(turn.task, return_exceptions=True)
        self.release(turn)

    @staticmethod
    def _drop_first(turn: TurnRun) -> None:
        """The turn's task may never await its eagerly started Stage0 step: cancel it (which
        ends the engine iterator) or mark its failure seen."""
        first = turn.first
        if first is None:
            return
        if not first.done():
            first.cancel()
        elif not first.cancelled():
            first.exception()

    def release(self, turn: TurnRun | None) -> None:
        """The turn is no longer the session's (its task may drain silently: a cancel whose
        abort failed must not close vLLM's iterator behind the log's back, R3)."""
        if self.active is turn:
            self.active = None
        self.idle.set()

    def cancel_tasks(self) -> None:
        """Fencing: stop every task of the session without writing (engine requests end with
        their consumers)."""
        current = asyncio.current_task()
        if self.active is not None:
            self._drop_first(self.active)
        for task in (self.active.task if self.active else None, self.stream.task):
            if task is not None and task is not current and not task.done():
                task.cancel()
        self.idle.set()

    # ------------------------------------------------------------------ one turn
    async def _turn(self, turn: TurnRun, recorder: SegmentRecorder) -> None:
        try:
            finish_reason = await self._consume_stage0(turn, recorder)
            if turn.cancelled:
                return
            if finish_reason == "abort":
                await self._run(EngineAborted(time.time(), turn.ref, turn.answer()), turn)
                return
            stats, stamps = recorder.stats(self.ports[0].pop_finished_stats(turn.request_id))
            await self._run(Stage0Done(time.time(), turn.ref, stats, stamps, recorder.submit_ts, finish_reason), turn)
            if not turn.speak:
                await self._run(Listen(time.time(), turn.ref), turn)
                return
            if len(self.ports) >= 2:  # without a Stage1 port the turn ends at Stage0
                await talk(turn, port1=self.ports[1], config=self.config, log=self.log, feed=self.feed, run=self._run)
            self.conversation.remember(turn.user_text, turn.answer())
            await self._run(EndTurn(time.time(), turn.ref, turn.answer(), finish_reason), turn)
        except Exception as exc:  # noqa: BLE001 - any failure ends the turn on D14's error path
            if not turn.cancelled:
                await self._fail(turn, exc)
        finally:
            self.log.release_held()
            if self.active is turn:
                self.active = None
            if not turn.cancelled:
                await self._on_done()
            if self.active is None:
                self.idle.set()

    async def _fail(self, turn: TurnRun, exc: Exception) -> None:
        """The turn failed (a port error, or anything else its task raised): it finishes
        ``error`` in the log and the client gets ``error`` then ``response.done`` (D14). When
        even that cannot be recorded (the log is broken), the client is told all the same."""
        if not isinstance(exc, StagePortError):
            logger.error("session %s: turn %s failed", self.log.session_id, turn.request_id, exc_info=exc)
        try:
            await self._run(FailTurn(time.time(), turn.ref, port_failure(exc), str(exc), turn.answer()), turn)
        except Exception as failure:  # noqa: BLE001 - nothing more can be written: tell the client
            logger.error("session %s: failing turn %s failed", self.log.session_id, turn.request_id, exc_info=failure)
            self.feed.send("error", code="internal_error", message=f"{type(exc).__name__}: {exc}", event_id=None)
            if turn.ref.response_id is not None:
                self.feed.send(
                    "response.done",
                    response_id=turn.ref.response_id,
                    reason="error",
                    finish_reason="error",
                    text=turn.answer(),
                    token_counts=turn.token_counts(),
                )

    def _record(self, turn: TurnRun, recorder: SegmentRecorder, batch: list[StageChunk]) -> None:
        """Record one delivery: the segment's receipts and one coalescer call."""
        for chunk in batch:
            recorder.add(chunk)
        assert turn.outputs is not None
        turn.outputs.add_batch(batch)

    def _send_text(self, turn: TurnRun, batch: list[StageChunk]) -> None:
        """The visible text of one delivery: one client write (its deltas, in order)."""
        response_id, out = turn.ref.response_id, []
        for chunk in batch:
            if chunk.new_token_ids:
                turn.stage0_tokens_out += len(chunk.new_token_ids)
                turn.text.append(chunk.text_delta)
                out.append({"response_id": response_id, "delta": chunk.text_delta})
        self.feed.send_batch("response.text.delta", out)

    async def _consume_stage0(self, turn: TurnRun, recorder: SegmentRecorder) -> str | None:
        finish_reason = None
        turn.outputs = OutputCoalescer(self.log, 0, turn.request_id, window_s=self.config.flush_interval_s)
        async for batch in stage0_batches(turn):
            if turn.cancelled:
                continue
            if turn.speak and turn.ref.response_id is None:
                # auto_response: the response begins at the first visible output, recorded
                # after that output and before its delta (the rest of the delivery follows).
                for k, chunk in enumerate(batch):
                    self._record(turn, recorder, [chunk])
                    finish_reason = chunk.finish_reason
                    if chunk.new_token_ids:
                        response_id = await self._run(
                            FirstOutput(chunk.received_ts, turn.ref, secrets.token_hex(4)), turn
                        )
                        turn.ref = dataclasses.replace(turn.ref, response_id=response_id)
                        self._send_text(turn, [chunk])
                        batch = batch[k + 1 :]
                        break
                else:
                    batch = []
                if not batch or turn.cancelled:
                    continue
            self._record(turn, recorder, batch)
            if turn.speak:
                self._send_text(turn, batch)
            finish_reason = batch[-1].finish_reason
        turn.outputs.flush()
        return finish_reason
