"""One full-duplex session driven against the stage ports (DOMAIN §2–§4).

Every command and engine interaction is an event of the session's stream, written ahead:
the intent (abort, release) is durable before the engine call, the result after it; a submit's
or forward's intent is pipelined (durable before any output of its call is handed on:
``SessionLog.emit_ahead``). Decisions come from the session's projector (the folds of ``projections``):
which keys are held, which ids are stale (:func:`projections.resources.stale_before_submit`),
which turn is open.

Stage0 id modes (capability ``supports_core_resumable_request``, DOMAIN §3.4):

* false (default, ephemeral): one ordinary request per committed turn on ``stage0_t<N>``;
  finished ids are released at end of turn, and any id still held when a new one is
  submitted is released or aborted first (R4); a listen-only turn leaves its id bound, so the
  next commit rebinds (mechanical turn completion, R1 full drop, R3 restore-and-raise);
* true (resident): one streaming request per epoch on ``stage0``: submit_initial, then one
  submit_update per committed unit; never rebinds (R8).

Stage1 (talker) gets Stage0's text under the SAME request id, bound as key ``(1, X)``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from events import ids
from events.types import (
    ActiveRequestBound,
    CancelRequested,
    CommandRejected,
    EpochAdvanced,
    Fence,
    InputAppended,
    ResponseBegun,
    ResponseEnded,
    ResponseListened,
    SessionClosed,
    StageMetricsReported,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestReleased,
    StageRequestReserved,
    StageRequestSubmitted,
    TransferTx,
    TurnCommitted,
    TurnCompleted,
    TurnFinalized,
)
from projections.reasons import reason_for_cancel_source
from projections.resources import stale_before_submit

from engine_bridge.cleanup import CleanupFailed, cleanup_id
from engine_bridge.messages import ClientEvent, EngineConfig, SessionError
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.plugin import ModelPlugin
from engine_bridge.ports import GenerationParams, StageChunk, StagePort, StagePortError, StreamSegment
from engine_bridge.segments import SegmentRecorder
from engine_bridge.session_log import SessionLog

#: Wire reason of ``response.cancelled`` / ``audio.cancelled`` per cancel source (legacy
#: values: input.cancel still reports ``barge_in`` on the wire, M17).
WIRE_REASON = {
    "barge_in": "barge_in",
    "input.cancel": "barge_in",
    "response.cancel": "client_cancelled",
    "output_audio_buffer_clear": "output_audio_buffer_clear",
}


@dataclass
class TurnRun:
    """The response work of one committed turn."""

    request_id: str
    turn_id: int
    epoch: int
    incarnation: int
    user_text: str
    speak: bool
    response_id: str | None = None
    commit_ts: float | None = None
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    chunks: asyncio.Queue[StageChunk | None] = field(default_factory=asyncio.Queue)
    text: list[str] = field(default_factory=list)
    outputs: OutputCoalescer | None = None  # the stage currently streaming

    @property
    def fence(self) -> Fence:
        """The fence the turn's request was submitted under (a forward carries it, never a
        newer one: DOMAIN §3.1)."""
        return Fence(incarnation=self.incarnation, epoch=self.epoch, turn_id=self.turn_id)


class Session:
    """A session of a :class:`engine_bridge.engine.SessionEngine`. Commands raise
    :class:`SessionError` (the refusal is also logged as ``CommandRejected``)."""

    def __init__(self, session_id: str, *, incarnation: int, log: SessionLog, ports: list[StagePort],
                 plugin: ModelPlugin, config: EngineConfig, auto_response: bool, log_stats: bool) -> None:
        self.session_id = session_id
        self.incarnation = incarnation
        self.epoch = 0
        self.turn_id = 0
        self.log = log
        self.ports = ports
        self.plugin = plugin
        self.config = config
        self.capabilities = plugin.capabilities()
        self.auto_response = auto_response
        self.log_stats = log_stats
        self.closed = False
        self.taken_over = False  # fenced: another replica owns the session now (issue 14)
        self.active: TurnRun | None = None
        self._client: asyncio.Queue[ClientEvent | None] = asyncio.Queue()
        self._input: list[str] = []
        self._input_chunks = 0
        self._input_speech = False
        self._pending_text: list[str] = []  # committed while a response was in progress
        self._deferred: list[str] = []  # DEFER_ACTIVE_RESPONSE payloads
        self._history: list[dict[str, str]] = []
        self._stream_id: str | None = None  # resident request currently open
        self._stream_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ helpers
    @property
    def resident(self) -> bool:
        return self.capabilities.supports_core_resumable_request

    def fence(self) -> Fence:
        return Fence(incarnation=self.incarnation, epoch=self.epoch, turn_id=self.turn_id)

    def stage0_id(self) -> str:
        """The Stage0 id the current fence mints (resident placeholder or ``stage0_t<N>``)."""
        if self.resident:
            return ids.mint_resident(self.session_id, self.incarnation, self.epoch)
        return ids.mint_ephemeral(self.session_id, self.incarnation, self.epoch, self.turn_id)

    def _state(self):  # the session's request_resources state (the fold's)
        return self.log.projector.resources.sessions.get(self.session_id)

    def _bound(self, request_id: str, stage_id: int = 0):
        state = self._state()
        return state.bindings.get((stage_id, request_id)) if state else None

    def _send(self, type_: str, **data: Any) -> None:
        self._client.put_nowait(ClientEvent(type_, self.session_id, time.time(), data))

    async def _reject(self, command: str, code: str, message: str, request_id: str | None = None) -> SessionError:
        await self.log.emit(CommandRejected(session_id=self.session_id, ts=time.time(), command=command,
                                            error_code=code, message=message, request_id=request_id))
        self._send("error", code=code, message=message)
        return SessionError(code, message, session_id=self.session_id, request_id=request_id)

    def _check_open(self, command: str) -> None:
        if self.taken_over:
            raise SessionError("session_taken_over", f"{command}: the session was taken over by another replica",
                               session_id=self.session_id)
        if self.closed:
            raise SessionError("session_closed", f"{command} on a closed session", session_id=self.session_id)

    async def events(self) -> AsyncIterator[ClientEvent]:
        """What a client would receive, in order, until ``session.closed``."""
        while True:
            event = await self._client.get()
            if event is None:
                return
            yield event

    def drain_events(self) -> list[ClientEvent]:
        """Client events received so far (non-blocking)."""
        out = []
        while not self._client.empty():
            event = self._client.get_nowait()
            if event is not None:
                out.append(event)
        return out

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        """Until no response work is running (including promoted deferred turns)."""
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    # ------------------------------------------------------------------ open
    async def start(self) -> None:
        await self._reserve(self.stage0_id())
        await self.log.flush()  # open is durable: SessionOpened and the turn-0 reservation
        self._send("session.created", incarnation=self.incarnation,
                   capabilities=self.capabilities.model_dump(), auto_response=self.auto_response)

    async def _reserve(self, request_id: str) -> None:
        if self._bound(request_id) is None:
            self.log.emit_later(StageRequestReserved(session_id=self.session_id, ts=time.time(), stage_id=0,
                                                     request_id=request_id, fence=self.fence()))

    # ------------------------------------------------------------------ input
    async def _check_fence(self, command: str, fence: Fence | None) -> None:
        """A client that sends the fence it last saw is refused when that fence is of another
        incarnation or an older epoch (DOMAIN §2.1: appends of an older epoch are dropped)."""
        if fence is None:
            return
        if fence.incarnation != self.incarnation or fence.epoch < self.epoch:
            raise await self._reject(command, "stale_fence",
                                     f"fence (incarnation {fence.incarnation}, epoch {fence.epoch}) is older than "
                                     f"the session's (incarnation {self.incarnation}, epoch {self.epoch})",
                                     self.stage0_id())

    async def append_text(self, text: str, *, is_speech: bool = True, fence: Fence | None = None) -> None:
        """Append a text chunk (a transcript unit) to the input buffer. ``fence``: the fence the
        client last saw; a stale one raises SessionError ``stale_fence``."""
        await self._append(InputAppended(session_id=self.session_id, ts=time.time(), input_kind="text",
                                         text=text, size_bytes=len(text.encode()), is_speech=is_speech,
                                         fence=self.fence(), request_id=self.stage0_id()), text, is_speech, fence)

    async def append_audio(self, pcm: bytes, *, audio_format: str = "pcm16", sample_rate_hz: int = 16_000,
                           transcript: str | None = None, is_speech: bool = True, store_payload: bool = False,
                           fence: Fence | None = None) -> None:
        """Append an audio chunk. Recorded by format, duration (16-bit mono), size and sha256
        digest; the payload itself only with ``store_payload``. ``transcript`` is what the
        text model hears. ``fence`` as in :meth:`append_text`."""
        duration_ms = len(pcm) / 2 / sample_rate_hz * 1000.0 if audio_format == "pcm16" else None
        event = InputAppended(
            session_id=self.session_id, ts=time.time(), input_kind="audio", text=transcript,
            audio_format=audio_format, sample_rate_hz=sample_rate_hz, duration_ms=duration_ms,
            size_bytes=len(pcm), digest_sha256=hashlib.sha256(pcm).hexdigest(),
            payload_b64=base64.b64encode(pcm).decode() if store_payload else None,
            is_speech=is_speech, fence=self.fence(), request_id=self.stage0_id())
        await self._append(event, transcript or "", is_speech, fence)

    async def _append(self, event: InputAppended, text: str, is_speech: bool, fence: Fence | None) -> None:
        self._check_open("append")
        async with self._lock:
            await self._check_fence("append", fence)
            await self._reserve(self.stage0_id())  # the append names a held id (DOMAIN §5.7 D9)
            self.log.emit_later(event)
            if text:
                self._input.append(text)
            self._input_chunks += 1
            self._input_speech = self._input_speech or is_speech

    # ------------------------------------------------------------------ commit (DOMAIN §2.3)
    async def commit(self, *, create_response: bool = True, overlap_speech_ms: float = 0.0,
                     fence: Fence | None = None) -> str:
        """input_audio_buffer.commit. Returns the commit action taken: START_AUTO_RESPONSE,
        COMMIT_ONLY, DEFER_ACTIVE_RESPONSE or LISTEN (silent commit). Raises SessionError
        ``input_audio_buffer_empty`` on an empty buffer, ``runtime_append_failed`` when the
        stale id's abort failed (R3), ``prompt_too_long`` when the model refuses the prompt,
        ``stale_fence`` for a ``fence`` of another incarnation or an older epoch."""
        self._check_open("commit")
        async with self._lock:
            await self._check_fence("commit", fence)
            return await self._commit(create_response, overlap_speech_ms)

    async def _commit(self, create_response: bool, overlap_speech_ms: float) -> str:
        now = time.time()
        if self._input_chunks == 0:
            raise await self._reject("commit", "input_audio_buffer_empty", "nothing appended since the last commit")
        text, speech = " ".join(self._input).strip(), self._input_speech
        self._input, self._input_chunks, self._input_speech = [], 0, False
        base = dict(session_id=self.session_id, ts=now, turn_id=self.turn_id, overlap_speech_ms=overlap_speech_ms)
        if not speech:  # silent commit: nothing to answer
            self.log.emit_later(TurnCommitted(**base, create_response=False, action="COMMIT_ONLY"))
            self._send("input_audio_buffer.committed", action="COMMIT_ONLY")
            self._send("response.listen", turn_id=self.turn_id)
            return "LISTEN"
        if self.active is not None:
            if not self.auto_response and overlap_speech_ms > 0:
                self.log.emit_later(TurnCommitted(**base, create_response=create_response,
                                                  action="DEFER_ACTIVE_RESPONSE"))
                if overlap_speech_ms > self.config.overlap_short_ack_ms:
                    self._deferred.append(text)  # promoted after the active response ends (E9)
                self._send("input_audio_buffer.committed", action="DEFER_ACTIVE_RESPONSE")
                return "DEFER_ACTIVE_RESPONSE"
            self.log.emit_later(TurnCommitted(**base, create_response=create_response, action="COMMIT_ONLY"))
            self._pending_text.append(text)
            self._send("input_audio_buffer.committed", action="COMMIT_ONLY")
            return "COMMIT_ONLY"
        text = " ".join([*self._pending_text, text])
        self._pending_text = []
        if self.auto_response:
            speak = self.plugin.decide(text) == "speak"
            self.log.emit_later(TurnCommitted(**base, create_response=False, action="START_AUTO_RESPONSE"))
            self._send("input_audio_buffer.committed", action="START_AUTO_RESPONSE")
            await self._start_turn(text, speak=speak, response_id=None, commit_ts=now)
            return "START_AUTO_RESPONSE"
        if not create_response:
            self.log.emit_later(TurnCommitted(**base, create_response=False, action="COMMIT_ONLY"))
            self._pending_text.append(text)
            self._send("input_audio_buffer.committed", action="COMMIT_ONLY")
            return "COMMIT_ONLY"
        response_id = self._mint_response_id()
        self.log.emit_later(TurnCommitted(**base, create_response=True, action="COMMIT_ONLY", response_id=response_id))
        self._send("input_audio_buffer.committed", action="COMMIT_ONLY", response_id=response_id)
        await self._start_turn(text, speak=True, response_id=response_id, commit_ts=now)
        return "COMMIT_ONLY"

    async def create_response(self) -> str:
        """response.create: start a response from committed input. Returns the response_id.
        Raises SessionError ``conversation_already_has_active_response`` or
        ``input_audio_buffer_empty``."""
        self._check_open("response.create")
        async with self._lock:
            if self.active is not None:
                raise await self._reject("response.create", "conversation_already_has_active_response",
                                         "a response is in progress", self.active.request_id)
            if not self._pending_text:
                raise await self._reject("response.create", "input_audio_buffer_empty", "no committed input")
            text = " ".join(self._pending_text)
            self._pending_text = []
            response_id = self._mint_response_id()
            await self._start_turn(text, speak=True, response_id=response_id, commit_ts=time.time())
            return response_id

    def _mint_response_id(self) -> str:
        """0.30.0 shape ``resp-<session>-<epoch>-<8 hex>`` (DOMAIN §2.2)."""
        return f"resp-{self.session_id}-{self.epoch}-{secrets.token_hex(4)}"

    # ------------------------------------------------------------------ submit
    async def _prepare_ephemeral_id(self, command: str) -> str:
        """Mint the turn's ephemeral id; rebind when it is already submitted (listen-only turn
        never completed, or a response ended without model_turn_id); release or abort every
        other held Stage0 id first (R1, R3, R4)."""
        request_id = self.stage0_id()
        existing = self._bound(request_id)
        if existing is not None and existing.submitted:
            completed = self.turn_id
            self.turn_id += 1
            self.log.emit_later(TurnCompleted(session_id=self.session_id, ts=time.time(), completed_turn_id=completed,
                                              new_turn_id=self.turn_id, cause="mechanical"))
            request_id = self.stage0_id()
        state = self._state()
        for stale in (stale_before_submit(state, request_id) if state else []):
            try:
                await cleanup_id(self.log, self.ports, stale.request_id,
                                 cause="end_of_turn" if stale.finished else "stale_rebind")
            except CleanupFailed as exc:
                raise await self._reject(command, "runtime_append_failed", str(exc), stale.request_id) from None
        return request_id

    async def _start_turn(self, text: str, *, speak: bool, response_id: str | None, commit_ts: float) -> None:
        try:
            request_id = self.stage0_id() if self.resident else await self._prepare_ephemeral_id("commit")
        except SessionError:
            if response_id is not None:
                self.log.emit_later(TurnFinalized(session_id=self.session_id, ts=time.time(),
                                                  response_id=response_id, finished_reason="error"))
            raise
        turn = TurnRun(request_id, self.turn_id, self.epoch, self.incarnation, text, speak, response_id, commit_ts)
        prompt, tokens_in = self._prompt(text)
        kind = "update" if self.resident and self._stream_id == request_id else "initial"
        now = time.time()
        await self._reserve(request_id)
        self.log.emit_ahead(  # pipelined intent: its outputs are gated on its commit (session_log)
            ActiveRequestBound(session_id=self.session_id, ts=now, request_id=request_id),
            StageRequestSubmitted(session_id=self.session_id, ts=now, stage_id=0, request_id=request_id,
                                  fence=self.fence(), kind=kind, resumable=self.resident, num_tokens_in=tokens_in))
        if response_id is not None:
            self.log.emit_later(ResponseBegun(session_id=self.session_id, ts=time.time(), response_id=response_id,
                                              turn_id=turn.turn_id, request_id=request_id, commit_ts=commit_ts))
            self._send("response.created", response_id=response_id)
        self.active = turn
        self._idle.clear()
        recorder = SegmentRecorder(stage_id=0, submit_ts=now, num_prompt_tokens=tokens_in, resident=self.resident)
        turn.task = asyncio.get_running_loop().create_task(self._run_turn(turn, prompt, kind, recorder))

    def _prompt(self, text: str) -> tuple[str, int]:
        port0 = self.ports[0]
        if self.resident:
            prompt = port0.chat_prompt([{"role": "user", "content": text}])
        else:
            messages = [{"role": "system", "content": self.config.system_prompt}, *self._history[-6:],
                        {"role": "user", "content": text}]
            prompt = port0.chat_prompt(messages)
        return prompt, port0.count_tokens(prompt)

    def _params(self, max_tokens: int, stage_id: int = 0) -> GenerationParams:
        ignore_eos = self.config.ignore_eos
        if stage_id >= 1 and self.config.talker_ignore_eos is not None:
            ignore_eos = self.config.talker_ignore_eos
        return GenerationParams(max_tokens=max_tokens, temperature=self.config.temperature, ignore_eos=ignore_eos)

    async def _stage0_chunks(self, turn: TurnRun, prompt: str, kind: str) -> AsyncIterator[StageChunk]:
        port0 = self.ports[0]
        budget = self.config.max_tokens if turn.speak else 1  # a listen unit produces no visible output
        if not self.resident:
            async for chunk in self.log.gated(port0.generate(turn.request_id, prompt, self._params(budget))):
                yield chunk
            return
        segment = StreamSegment(prompt, self._params(budget))
        if kind == "initial":
            self._stream_id = turn.request_id
            self._stream_task = asyncio.get_running_loop().create_task(
                self._pump_stream(turn.request_id, self.log.gated(port0.open_stream(turn.request_id, segment))))
        else:
            await port0.update_stream(turn.request_id, segment)
        while True:
            chunk = await turn.chunks.get()
            if chunk is None:
                return
            yield chunk
            if chunk.segment_done or chunk.finished:
                return

    async def _pump_stream(self, request_id: str, stream: AsyncIterator[StageChunk]) -> None:
        """Route a resident request's chunks to the turn that owns its current segment."""
        try:
            async for chunk in stream:
                if self.active is not None and self.active.request_id == request_id:
                    self.active.chunks.put_nowait(chunk)
        except StagePortError as exc:
            if self.active is not None and self.active.request_id == request_id:
                self.active.chunks.put_nowait(None)
            self._send("error", code="stage_error", message=str(exc))
        finally:
            if self._stream_id == request_id:
                self._stream_id = None

    # ------------------------------------------------------------------ response work
    async def _run_turn(self, turn: TurnRun, prompt: str, kind: str, recorder: SegmentRecorder) -> None:
        try:
            finish_reason = await self._consume_stage0(turn, prompt, kind, recorder)
            if turn.cancelled:
                return
            if finish_reason == "abort":
                await self._engine_aborted(turn)
                return
            await self._finish_stage0(turn, recorder, finish_reason)
            if not turn.speak:
                await self._listen(turn)
                return
            await self._talk(turn)
            await self._end_turn(turn, finish_reason)
        except StagePortError as exc:
            if not turn.cancelled:
                await self._fail_turn(turn, exc)
        finally:
            if self.active is turn:
                self.active = None
            if not turn.cancelled:
                await self._promote_deferred()
            if self.active is None:
                self._idle.set()

    async def _consume_stage0(self, turn: TurnRun, prompt: str, kind: str, recorder: SegmentRecorder) -> str | None:
        finish_reason = None
        turn.outputs = OutputCoalescer(self.log, 0, turn.request_id, window_s=self.config.flush_interval_s)
        async for chunk in self._stage0_chunks(turn, prompt, kind):
            if turn.cancelled:
                continue
            recorder.add(chunk)
            turn.outputs.add(chunk)
            if turn.speak and chunk.new_token_ids:
                if turn.response_id is None:  # auto_response: the response begins at first visible output
                    turn.response_id = self._mint_response_id()
                    self.log.emit_later(ResponseBegun(session_id=self.session_id, ts=chunk.received_ts,
                                                      response_id=turn.response_id, turn_id=turn.turn_id,
                                                      request_id=turn.request_id))
                    self._send("response.created", response_id=turn.response_id)
                turn.text.append(chunk.text_delta)
                self._send("response.text.delta", response_id=turn.response_id, delta=chunk.text_delta)
            finish_reason = chunk.finish_reason
        turn.outputs.flush()
        return finish_reason

    async def _finish_stage0(self, turn: TurnRun, recorder: SegmentRecorder, finish_reason: str | None) -> None:
        port0 = self.ports[0]
        stats, stamps = recorder.stats(port0.pop_finished_stats(turn.request_id))
        events: list[Any] = [StageMetricsReported(session_id=self.session_id, ts=time.time(), stage_id=0,
                                                  request_id=turn.request_id, stats=stats,
                                                  stage_submit_ts=recorder.submit_ts, **stamps)]
        if not self.resident:
            events.append(StageRequestFinished(session_id=self.session_id, ts=time.time(), stage_id=0,
                                               request_id=turn.request_id, finish_reason=finish_reason))
        self.log.emit_later(*events)

    async def _engine_aborted(self, turn: TurnRun) -> None:
        """The engine ended the turn's request itself (shutdown, scale-down, abort): the log says
        so with ``StageRequestFinished(finish_reason=abort)``, which finalizes the turn ``abort``
        (DOMAIN §5.5 (4), §5.7 D11), and the client gets ``response.done`` with reason
        ``abort`` (D14). An ephemeral id stays bound (finished): the next commit rebinds. The
        resident request is gone, so its id is released and the session moves to a new epoch
        (a new resident id serves the next turn)."""
        now = time.time()
        self.log.emit_later(StageRequestFinished(session_id=self.session_id, ts=now, stage_id=0,
                                                 request_id=turn.request_id, finish_reason="abort"))
        if turn.response_id is not None:
            self.log.emit_later(TurnFinalized(session_id=self.session_id, ts=now, response_id=turn.response_id,
                                              finished_reason="abort"))
            self._send("response.done", response_id=turn.response_id, reason="abort", finish_reason="abort",
                       text="".join(turn.text))
        if self.resident:
            await cleanup_id(self.log, self.ports, turn.request_id, cause="engine_abort")
            self.log.emit_later(EpochAdvanced(session_id=self.session_id, ts=time.time(), old_epoch=self.epoch,
                                              new_epoch=self.epoch + 1))
            self.epoch += 1
            self._stream_id = None
            await self._reserve(self.stage0_id())

    async def _listen(self, turn: TurnRun) -> None:
        """Listen-only unit: ``response.listen``, no response. The resident placeholder's
        active request is cleared; a turn-scoped ephemeral id stays bound (DOMAIN §2.2)."""
        events: list[Any] = [ResponseListened(session_id=self.session_id, ts=time.time(), turn_id=turn.turn_id,
                                              request_id=turn.request_id)]
        if self.resident:
            events.append(ActiveRequestBound(session_id=self.session_id, ts=time.time(), request_id=None))
        self.log.emit_later(*events)
        self._send("response.listen", turn_id=turn.turn_id)

    async def _talk(self, turn: TurnRun) -> None:
        """Forward Stage0's text to Stage1 under the same id (key (1, X)); its tokens stand for
        audio codec frames."""
        if len(self.ports) < 2:
            return
        port1 = self.ports[1]
        text = "".join(turn.text)
        payload_bytes = len(text.encode())
        n_text_tokens = max(1, port1.count_tokens(text) if text else 1)
        budget = max(1, min(self.config.talker_max_tokens,
                            round(n_text_tokens * self.config.talker_tokens_per_text_token)))
        if turn.cancelled:
            raise asyncio.CancelledError  # a cancel won the race: nothing is forwarded for a cancelled turn
        tx_start = time.perf_counter()
        forwarded_ts = time.time()
        self.log.emit_ahead(StageRequestForwarded(session_id=self.session_id, ts=forwarded_ts, stage_id=1,
                                                  request_id=turn.request_id, fence=turn.fence, from_stage=0))
        stream = self.log.gated(port1.generate(turn.request_id, text or " ", self._params(budget, stage_id=1)))
        tx_ms = (time.perf_counter() - tx_start) * 1000.0
        self.log.emit_later(TransferTx(session_id=self.session_id, ts=time.time(), from_stage=0, to_stage=1,
                                       request_id=turn.request_id, size_bytes=payload_bytes, tx_time_ms=tx_ms))
        recorder = SegmentRecorder(stage_id=1, submit_ts=forwarded_ts, num_prompt_tokens=n_text_tokens,
                                   frames_per_token=self.config.frames_per_talker_token,
                                   sample_rate_hz=self.config.audio_sample_rate_hz, rx_bytes=payload_bytes)
        last: StageChunk | None = None
        turn.outputs = OutputCoalescer(self.log, 1, turn.request_id, window_s=self.config.flush_interval_s,
                                       frames_per_token=self.config.frames_per_talker_token)
        async for chunk in stream:
            if turn.cancelled:
                continue
            recorder.add(chunk)
            turn.outputs.add(chunk)
            frames = len(chunk.new_token_ids) * self.config.frames_per_talker_token
            if frames:
                self._send("response.audio.delta", response_id=turn.response_id, frames=frames,
                           sample_rate_hz=self.config.audio_sample_rate_hz)
            last = chunk
        turn.outputs.flush()
        if turn.cancelled or (last is not None and last.finish_reason == "abort"):
            raise asyncio.CancelledError
        stats, stamps = recorder.stats(port1.pop_finished_stats(turn.request_id))
        now = time.time()
        self.log.emit_later(
            StageMetricsReported(session_id=self.session_id, ts=now, stage_id=1, request_id=turn.request_id,
                                 stats=stats, stage_submit_ts=forwarded_ts, **stamps),
            StageRequestFinished(session_id=self.session_id, ts=now, stage_id=1, request_id=turn.request_id,
                                 finish_reason=last.finish_reason if last else None,
                                 model_turn_id=turn.turn_id, end_of_turn=True))

    async def _end_turn(self, turn: TurnRun, finish_reason: str | None) -> None:
        """model_turn_id + end_of_turn: response.done, turn completion, finalize (``stop``), then
        the end-of-turn release of the finished ephemeral id (0.30.0 behaviour, R4).
        ``response.done`` carries the turn's ``reason`` and Stage0's ``finish_reason`` (``stop``
        or ``length``: a truncated answer is visible, DOMAIN §5.7 D14)."""
        now = time.time()
        events: list[Any] = []
        if turn.response_id is not None:
            events.append(ResponseEnded(session_id=self.session_id, ts=now, response_id=turn.response_id,
                                        status="completed", cause="model"))
        self.turn_id = max(self.turn_id, turn.turn_id + 1)
        events.append(TurnCompleted(session_id=self.session_id, ts=now, completed_turn_id=turn.turn_id,
                                    new_turn_id=self.turn_id, cause="model"))
        if turn.response_id is not None:
            events.append(TurnFinalized(session_id=self.session_id, ts=now, response_id=turn.response_id,
                                        finished_reason="stop"))
        self.log.emit_later(*events)
        answer = "".join(turn.text)
        self._history = [*self._history[-4:], {"role": "user", "content": turn.user_text},
                         {"role": "assistant", "content": answer}]  # the prompt uses the last 6 messages
        if turn.response_id is not None:
            self._send("response.done", response_id=turn.response_id, reason="stop", finish_reason=finish_reason,
                       text=answer)
        if not self.resident:
            await cleanup_id(self.log, self.ports, turn.request_id, cause="end_of_turn")
        await self._reserve(self.stage0_id())

    async def _fail_turn(self, turn: TurnRun, exc: StagePortError) -> None:
        code = type(exc).__name__
        code = {"PromptTooLong": "prompt_too_long", "EngineDead": "engine_dead"}.get(code, "stage_error")
        now = time.time()
        events: list[Any] = [StageRequestFinished(session_id=self.session_id, ts=now, stage_id=0,
                                                  request_id=turn.request_id, finish_reason="error")]
        if turn.response_id is not None:
            events.append(TurnFinalized(session_id=self.session_id, ts=now, response_id=turn.response_id,
                                        finished_reason="error"))
        self.log.emit_later(*events)
        await self._reject("commit", code, str(exc), turn.request_id)
        if turn.response_id is not None:  # the response's one terminal event, after its error (D14)
            self._send("response.done", response_id=turn.response_id, reason="error", finish_reason="error",
                       text="".join(turn.text))
        for stage_id in (0, 1):
            if self._bound(turn.request_id, stage_id) is not None:
                self.log.emit_later(StageRequestReleased(session_id=self.session_id, ts=time.time(),
                                                         stage_id=stage_id, request_id=turn.request_id,
                                                         cause="submit_failed"))

    async def _promote_deferred(self) -> None:
        if self._deferred and self.active is None and not self.closed:
            text = " ".join(self._deferred)
            self._deferred = []
            async with self._lock:
                response_id = self._mint_response_id()
                now = time.time()
                self.log.emit_later(TurnCommitted(session_id=self.session_id, ts=now, turn_id=self.turn_id,
                                                  create_response=True, action="COMMIT_ONLY",
                                                  response_id=response_id))
                try:
                    await self._start_turn(text, speak=True, response_id=response_id, commit_ts=now)
                except SessionError:
                    pass  # already logged and sent to the client

    # ------------------------------------------------------------------ cancel (DOMAIN §2.4)
    async def _cancel_active(self, source: str) -> bool:
        """Cancel the active response work: CancelRequested, finalize with the §2.4 reason,
        epoch +1, abort the id on every pool (R1/R2). Returns False when there was no work."""
        turn = self.active
        if turn is None:
            return False
        turn.cancelled = True
        if turn.outputs is not None:
            turn.outputs.flush()  # what was received before the cancel is in the log
        wire = WIRE_REASON.get(source, source)
        now = time.time()
        events: list[Any] = [CancelRequested(session_id=self.session_id, ts=now, source=source, wire_reason=wire,
                                             response_id=turn.response_id)]
        if turn.response_id is not None:
            events.append(TurnFinalized(session_id=self.session_id, ts=now, response_id=turn.response_id,
                                        finished_reason=reason_for_cancel_source(source)))
        events.append(EpochAdvanced(session_id=self.session_id, ts=now, old_epoch=self.epoch, new_epoch=self.epoch + 1))
        self.epoch += 1
        self.log.emit_later(*events)
        if turn.response_id is not None:  # finalized now: the response's one terminal event (D14)
            self._send("response.cancelled", response_id=turn.response_id, reason=wire,
                       finished_reason=reason_for_cancel_source(source))
        try:
            await cleanup_id(self.log, self.ports, turn.request_id, cause=source, force_abort=True)
        except CleanupFailed:
            # The id still runs and its keys are restored (R3). Do not cancel the consuming task:
            # closing vLLM's iterator would abort the request behind the log's back. The task
            # drains the outputs silently (turn.cancelled); close retries the abort (R7).
            if self.active is turn:
                self.active = None
            self._idle.set()
            raise
        turn.chunks.put_nowait(None)
        if turn.task is not None:
            turn.task.cancel()
            await asyncio.gather(turn.task, return_exceptions=True)
        if self.active is turn:
            self.active = None
        self._idle.set()
        self._send("audio.cancelled", reason=wire)
        if self.resident and not self.closed:
            self._stream_id = None
            await self._reserve(self.stage0_id())
        return True

    async def _cancel(self, command: str, source: str) -> bool:
        self._check_open(command)
        async with self._lock:
            try:
                return await self._cancel_active(source)
            except CleanupFailed as exc:
                raise await self._reject(command, "runtime_append_failed", str(exc), exc.request_id) from None

    async def barge_in(self) -> bool:
        """User speech over the response: cancel it with source ``barge_in``."""
        return await self._cancel("barge_in", "barge_in")

    async def cancel_response(self) -> bool:
        """response.cancel (log reason ``cancel``). With no response in progress the client gets
        an ``error`` event ``response_cancel_not_active`` and False is returned (D14)."""
        cancelled = await self._cancel("response.cancel", "response.cancel")
        if not cancelled:
            self._send("error", code="response_cancel_not_active", message="no response in progress to cancel")
        return cancelled

    async def cancel_input(self) -> bool:
        """input.cancel: drop the input buffer and cancel the response (log reason ``cancel``;
        wire reason stays ``barge_in``, M17)."""
        self._input, self._input_chunks, self._input_speech = [], 0, False
        return await self._cancel("input.cancel", "input.cancel")

    async def clear_output_audio(self) -> bool:
        """output_audio_buffer.clear (log reason ``cancel``)."""
        return await self._cancel("output_audio_buffer.clear", "output_audio_buffer_clear")

    def fence_out(self, message: str) -> None:
        """Drop the session without writing (issue 14 fencing): another replica took it over,
        or this replica lost its lease. Its running work is cancelled (engine requests end with
        their consumers), the client gets ``error`` (code ``session_taken_over``) and
        ``session.closed``, and every later command raises SessionError
        ``session_taken_over``. Idempotent; never writes to the log."""
        if self.taken_over:
            return
        self.taken_over = self.closed = True
        current = asyncio.current_task()
        for task in (self.active.task if self.active else None, self._stream_task):
            if task is not None and task is not current and not task.done():
                task.cancel()
        self._idle.set()
        self._send("error", code="session_taken_over", message=message)
        self._send("session.closed", reason="session_taken_over")
        self._client.put_nowait(None)

    # ------------------------------------------------------------------ close (R7)
    async def close(self, reason: str = "session_close") -> None:
        """Close (irreversible): record it, snapshot held ids before dropping anything, cancel
        the active response, abort submitted ids, release the rest. A failed abort keeps its
        keys (restored) and is reported; the session is closed all the same."""
        self._check_open("close")
        async with self._lock:
            self.closed = True
            state = self._state()
            held = sorted({k[1] for k in state.bindings}) if state else []
            turn = self.active
            if turn is not None:  # what it received before the close is logged inside its segment (D1)
                turn.cancelled = True
                if turn.outputs is not None:
                    turn.outputs.flush()
            self.log.emit_later(SessionClosed(session_id=self.session_id, ts=time.time(), reason=reason))
            failures: list[str] = []
            try:
                await self._cancel_active(reason)
            except CleanupFailed as exc:
                failures.append(str(exc))
            state = self._state()
            still = [r for r in held if state and any(k[1] == r for k in state.bindings)]
            for request_id in still:
                try:
                    await cleanup_id(self.log, self.ports, request_id, cause=reason)
                except CleanupFailed as exc:
                    failures.append(str(exc))
            if self._stream_id is not None:
                await self.ports[0].close_stream(self._stream_id)
            if self._stream_task is not None:
                self._stream_task.cancel()
                await asyncio.gather(self._stream_task, return_exceptions=True)
            await self.log.close()
            for failure in failures:
                self._send("error", code="cleanup_failed", message=failure)
            self._send("session.closed", reason=reason)
            self._client.put_nowait(None)
