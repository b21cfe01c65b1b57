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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from decider import (
    EndTurn,
    EngineAborted,
    FailTurn,
    FirstOutput,
    Forward,
    Listen,
    Stage0Done,
    TurnRef,
)
from engine_bridge.client_feed import ClientFeed
from engine_bridge.conversation import Conversation
from engine_bridge.eager import start_eagerly
from engine_bridge.messages import EngineConfig
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.ports import GenerationParams, StageChunk, StagePort, StagePortError, StreamSegment, port_failure
from engine_bridge.resident_stream import ResidentStream
from engine_bridge.segments import SegmentRecorder
from engine_bridge.session_log import SessionLog
from events.types import StageMetricsReported, StageRequestFinished, TransferTx

logger = logging.getLogger(__name__)


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
    stage0: AsyncIterator[StageChunk] | None = None
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
        turn = TurnRun(ref, text, speak)
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
            turn.stage0 = self.log.gated(port0.generate(turn.request_id, prompt, params))
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
            await self._talk(turn)
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
                )

    async def _stage0_batches(self, turn: TurnRun) -> AsyncIterator[list[StageChunk]]:
        """The outputs of the Stage0 call :meth:`_call_stage0` made, one list per delivery
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
                turn.text.append(chunk.text_delta)
                out.append({"response_id": response_id, "delta": chunk.text_delta})
        self.feed.send_batch("response.text.delta", out)

    async def _consume_stage0(self, turn: TurnRun, recorder: SegmentRecorder) -> str | None:
        finish_reason = None
        turn.outputs = OutputCoalescer(self.log, 0, turn.request_id, window_s=self.config.flush_interval_s)
        async for batch in self._stage0_batches(turn):
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

    async def _talk(self, turn: TurnRun) -> None:
        """Forward Stage0's text to Stage1 under the same id (key (1, X)); its tokens stand for
        audio codec frames. Without a Stage1 port the turn ends at Stage0."""
        if len(self.ports) < 2:
            return
        port1, config, sid = self.ports[1], self.config, self.log.session_id
        text = turn.answer()
        payload_bytes = len(text.encode())
        n_text_tokens = max(1, port1.count_tokens(text) if text else 1)
        budget = max(1, min(config.talker_max_tokens, round(n_text_tokens * config.talker_tokens_per_text_token)))
        if turn.cancelled:
            raise asyncio.CancelledError  # a cancel won the race: nothing is forwarded for a cancelled turn
        tx_start = time.perf_counter()
        forwarded_ts = time.time()
        await self._run(Forward(forwarded_ts, turn.ref), turn)
        stream = self.log.gated(
            port1.generate(turn.request_id, text or " ", generation_params(config, budget, stage_id=1))
        )
        tx_ms = (time.perf_counter() - tx_start) * 1000.0
        self.log.emit_held(
            TransferTx(
                session_id=sid,
                ts=time.time(),
                from_stage=0,
                to_stage=1,
                request_id=turn.request_id,
                size_bytes=payload_bytes,
                tx_time_ms=tx_ms,
            )
        )
        recorder = SegmentRecorder(
            stage_id=1,
            submit_ts=forwarded_ts,
            num_prompt_tokens=n_text_tokens,
            frames_per_token=config.frames_per_talker_token,
            sample_rate_hz=config.audio_sample_rate_hz,
            rx_bytes=payload_bytes,
        )
        last: StageChunk | None = None
        turn.outputs = OutputCoalescer(
            self.log,
            1,
            turn.request_id,
            window_s=config.flush_interval_s,
            frames_per_token=config.frames_per_talker_token,
        )
        async for chunk in stream:  # one engine step's output per item: a batch of one
            if turn.cancelled:
                continue
            recorder.add(chunk)
            turn.outputs.add(chunk)
            frames = len(chunk.new_token_ids) * config.frames_per_talker_token
            if frames:
                self.feed.send_batch(
                    "response.audio.delta",
                    (
                        {
                            "response_id": turn.ref.response_id,
                            "frames": frames,
                            "sample_rate_hz": config.audio_sample_rate_hz,
                        },
                    ),
                )
            last = chunk
        turn.outputs.flush()
        if turn.cancelled or (last is not None and last.finish_reason == "abort"):
            raise asyncio.CancelledError
        stats, stamps = recorder.stats(port1.pop_finished_stats(turn.request_id))
        now = time.time()
        self.log.emit_held(
            StageMetricsReported(
                session_id=sid,
                ts=now,
                stage_id=1,
                request_id=turn.request_id,
                stats=stats,
                stage_submit_ts=forwarded_ts,
                **stamps,
            ),
            StageRequestFinished(
                session_id=sid,
                ts=now,
                stage_id=1,
                request_id=turn.request_id,
                finish_reason=last.finish_reason if last else None,
                model_turn_id=turn.ref.turn_id,
                end_of_turn=True,
            ),
        )
