"""One full-duplex session driven against the stage ports (DOMAIN §2–§4): the hand that
executes the session's rules.

Each command (append, commit, response.create, the cancels, close) is handed to
:func:`decider.decide` together with the session's folded state and what
the process observes (time, whether response work runs, the input buffer); the steps it
returns are executed in order: events recorded (write-ahead: an abort's or release's intent is
durable before the engine call; a submit's or forward's intent is pipelined, durable before any
output of its call is handed on — ``SessionLog.emit_ahead`` and ``gated``; results after the
call), ids released or aborted on the stage ports, turns started on the
:class:`~engine_bridge.turn_runner.TurnRunner`, client events sent. Epoch, turn and bindings
change only by folding the recorded events (the session's projector, the same folds the
offline audit runs). Nothing here decides a rule.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pydantic import ValidationError

from decider import (
    Append,
    BufferInput,
    CancelResponse,
    Cleanup,
    CleanupRefused,
    ClearInput,
    Close,
    CloseStream,
    Commit,
    CreateResponse,
    EndClient,
    ForgetStream,
    HaltTurn,
    Notify,
    PrepareSubmit,
    PromoteDeferred,
    Record,
    Refuse,
    Reply,
    Reserve,
    SessionRules,
    SessionState,
    StartTurn,
    Step,
    StopTurn,
    Submit,
    SubmitAbandoned,
    Then,
    decide,
)
from decider.decide import error_notice
from engine_bridge.cleanup import CleanupFailed, cleanup_id
from engine_bridge.client_feed import ClientFeed
from engine_bridge.conversation import Conversation
from engine_bridge.messages import ClientEvent, EngineConfig, SessionError
from engine_bridge.plugin import ModelPlugin
from engine_bridge.ports import StagePort
from engine_bridge.session_log import SessionLog
from engine_bridge.turn_runner import TurnRun, TurnRunner
from events.types import Fence


@dataclass
class _Execution:
    """One command's execution: its name, the response work it concerns, the client's
    ``event_id`` of the command (echoed in every ``error`` it causes; None outside a client
    command) and the cleanup failures collected on the way (close reports them at the end)."""

    command: str
    turn: TurnRun | None
    event_id: str | None = None
    failures: list[str] = field(default_factory=list)


class Session:
    """A session of a :class:`engine_bridge.engine.SessionEngine`.

    Every command takes keyword ``event_id`` (the client event that asked for it). A refused
    command puts exactly ONE ``error`` client event on the session's stream — data
    ``{code, message, event_id, param?}`` — and raises :class:`SessionError` (same code,
    message and param) for Python callers; a refusal of an open session is also logged as
    ``CommandRejected`` (issue 21, research G5). A front reports the exception or forwards the
    stream's ``error``, never both."""

    def __init__(
        self,
        session_id: str,
        *,
        log: SessionLog,
        ports: list[StagePort],
        plugin: ModelPlugin,
        config: EngineConfig,
        auto_response: bool,
        log_stats: bool,
    ) -> None:
        """The session's incarnation, epoch and turn are those its log folds (``state``): the
        engine records ``SessionOpened`` before :meth:`start`."""
        self.session_id = session_id
        self.log = log
        self.ports = ports
        self.plugin = plugin
        self.capabilities = plugin.capabilities()
        self.auto_response = auto_response
        self.log_stats = log_stats
        self.taken_over = False  # fenced: another replica owns the session now (issue 14); never in the log
        # A later incarnation of this id was opened on this engine: it continues this session's
        # fold (issue 23: one fold per event), so this object is closed for good and reads nothing
        # of the new incarnation's state.
        self.superseded = False
        self.state = SessionState(
            session_id, log.projector.resources, SessionRules(auto_response, config.overlap_short_ack_ms)
        )
        self.client = ClientFeed(session_id)
        self.conversation = Conversation(config.system_prompt)
        self.runner = TurnRunner(
            log=log,
            ports=ports,
            config=config,
            feed=self.client,
            conversation=self.conversation,
            resident=self.resident,
            run=lambda command, turn: self._run(command, _Execution("turn", turn)),
            on_done=self._promote_deferred,
        )
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ queries
    @property
    def resident(self) -> bool:
        return self.capabilities.supports_core_resumable_request

    @property
    def incarnation(self) -> int:
        return self.state.incarnation

    @property
    def epoch(self) -> int:
        """From the folded ``EpochAdvanced`` events (DOMAIN §2.1)."""
        return self.state.epoch

    @property
    def turn_id(self) -> int:
        """From the folded ``TurnCompleted`` events (DOMAIN §2.2)."""
        return self.state.turn_id

    @property
    def active(self) -> TurnRun | None:
        """The response work in progress."""
        return self.runner.active

    @property
    def closed(self) -> bool:
        return self.taken_over or self.superseded or self.state.closed

    async def settled(self) -> None:
        """Wait until the command running now (a close's aborts included) has ended and every
        event it recorded is committed. Raises what the log's last write raised."""
        async with self._lock:
            await self.log.flush()

    def fence(self) -> Fence:
        """The session's current fence (what a client sends back with ``fence=``)."""
        return self.state.fence

    async def events(self) -> AsyncIterator[ClientEvent]:
        """What a client would receive, in order, until ``session.closed``."""
        async for event in self.client.events():
            yield event

    def subscribe(self, sink: Callable[[Sequence[ClientEvent] | None], None]) -> None:
        """Hand what a client would receive to ``sink`` at once, write by write, instead of
        :meth:`events` (:meth:`ClientFeed.subscribe`: no queue, no task hop; None ends it)."""
        self.client.subscribe(sink)

    def drain_events(self) -> list[ClientEvent]:
        """Client events received so far (non-blocking)."""
        return self.client.drain()

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        """Until no response work is running (including promoted deferred turns)."""
        await asyncio.wait_for(self.runner.idle.wait(), timeout_s)

    # ------------------------------------------------------------------ commands
    async def start(self) -> None:
        """Open: the Stage0 id of fence turn 0 is reserved, durably with ``SessionOpened``."""
        await self._run(Reserve(time.time()), _Execution("open", None))
        await self.log.flush()
        self.client.send(
            "session.created",
            incarnation=self.incarnation,
            capabilities=self.capabilities.model_dump(),
            auto_response=self.auto_response,
        )

    async def append_text(
        self, text: str, *, is_speech: bool = True, fence: Fence | None = None, event_id: str | None = None
    ) -> None:
        """Append a text chunk (a transcript unit) to the input buffer. ``fence``: the fence the
        client last saw; a stale one raises SessionError ``stale_fence`` (param ``fence``). A
        text that cannot be stored (a lone surrogate) raises SessionError ``invalid_input``
        naming the field (D12)."""
        fields = dict(input_kind="text", text=text, size_bytes=len(text.encode("utf-8", "surrogatepass")))
        await self._command("append", lambda: Append(time.time(), fields, text, is_speech, fence), event_id)

    async def append_audio(
        self,
        pcm: bytes,
        *,
        sample_rate_hz: int,
        audio_format: str = "pcm16",
        transcript: str | None = None,
        is_speech: bool = True,
        store_payload: bool = False,
        fence: Fence | None = None,
        event_id: str | None = None,
    ) -> None:
        """Append an audio chunk of ``sample_rate_hz`` (required: no rate is right for every
        client — Realtime GA sends 24000, traces say theirs; a wrong one would record a wrong
        ``duration_ms``, research G7). Recorded by format, rate, duration (16-bit mono), size
        and sha256 digest; the payload itself only with ``store_payload``. ``transcript`` is
        what the text model hears. ``fence`` as in :meth:`append_text`. A rate that is not > 0
        raises SessionError ``invalid_input`` (param ``sample_rate_hz``)."""
        if isinstance(sample_rate_hz, bool) or not isinstance(sample_rate_hz, int) or sample_rate_hz <= 0:
            self._refuse(
                "invalid_input",
                f"append: sample_rate_hz must be an integer > 0, got {sample_rate_hz!r}",
                event_id,
                param="sample_rate_hz",
            )
        duration_ms = len(pcm) / 2 / sample_rate_hz * 1000.0 if audio_format == "pcm16" else None
        fields = dict(
            input_kind="audio",
            text=transcript,
            audio_format=audio_format,
            sample_rate_hz=sample_rate_hz,
            duration_ms=duration_ms,
            size_bytes=len(pcm),
            digest_sha256=hashlib.sha256(pcm).hexdigest(),
            payload_b64=base64.b64encode(pcm).decode() if store_payload else None,
        )
        await self._command("append", lambda: Append(time.time(), fields, transcript or "", is_speech, fence), event_id)

    async def clear_input(self, *, event_id: str | None = None) -> None:
        """input_audio_buffer.clear (issue 21, research G1): drop the uncommitted input buffer,
        recorded as ``InputCleared``; the client gets ``input_audio_buffer.cleared``. A running
        response and committed input awaiting :meth:`create_response` are not touched (unlike
        :meth:`cancel_input`). Raises SessionError ``session_closed``."""
        c = self.conversation
        await self._command("input_audio_buffer.clear", lambda: ClearInput(time.time(), c.input_chunks), event_id)

    async def commit(
        self,
        *,
        create_response: bool = True,
        overlap_speech_ms: float = 0.0,
        fence: Fence | None = None,
        event_id: str | None = None,
    ) -> str:
        """input_audio_buffer.commit. Returns the commit action taken: START_AUTO_RESPONSE,
        COMMIT_ONLY, DEFER_ACTIVE_RESPONSE or LISTEN (silent commit). Raises SessionError
        ``input_audio_buffer_empty`` on an empty buffer, ``runtime_append_failed`` when the
        stale id's abort failed (R3), ``stale_fence`` for a ``fence`` of another incarnation or
        an older epoch. What the engine does with the prompt is not raised (the commit was
        accepted): a prompt the model refuses or a dead engine fails the turn — the client gets
        ``error`` (``prompt_too_long``, ``engine_dead``, ``stage_error``) then ``response.done``
        reason ``error`` when a response was created (D14), and the log finalizes it ``error``."""
        c = self.conversation
        return await self._command(
            "commit",
            lambda: Commit(
                time.time(),
                create_response,
                overlap_speech_ms,
                c.input_chunks,
                c.input_speech,
                self.runner.active is not None,
                secrets.token_hex(4),
                fence,
            ),
            event_id,
        )

    async def create_response(self, *, event_id: str | None = None) -> str:
        """response.create: start a response from committed input. Returns the response_id.
        Raises SessionError ``conversation_already_has_active_response`` or
        ``input_audio_buffer_empty``."""
        return await self._command(
            "response.create",
            lambda: CreateResponse(
                time.time(),
                self.runner.active.request_id if self.runner.active else None,
                bool(self.conversation.pending),
                secrets.token_hex(4),
            ),
            event_id,
        )

    async def barge_in(self, *, event_id: str | None = None) -> bool:
        """User speech over the response: cancel it with source ``barge_in``. False (no error)
        when nothing runs."""
        return await self._cancel("barge_in", "barge_in", event_id)

    async def cancel_response(self, *, event_id: str | None = None) -> bool:
        """response.cancel (log reason ``cancel``). With no response in progress the client gets
        one ``error`` event ``response_cancel_not_active`` (with ``event_id``) and False is
        returned, nothing raised (D14)."""
        return await self._cancel("response.cancel", "response.cancel", event_id)

    async def cancel_input(self, *, event_id: str | None = None) -> bool:
        """input.cancel: drop the input buffer and cancel the response (log reason ``cancel``;
        wire reason stays ``barge_in``, M17). False (no error) when no response runs; the
        buffer is dropped all the same (not logged: see :meth:`clear_input` for a logged clear)."""
        return await self._cancel("input.cancel", "input.cancel", event_id)

    async def clear_output_audio(self, *, event_id: str | None = None) -> bool:
        """output_audio_buffer.clear (log reason ``cancel``). False (no error event) when no
        response is in progress: the front says what its protocol wants (research §5.5)."""
        return await self._cancel("output_audio_buffer.clear", "output_audio_buffer_clear", event_id)

    async def _cancel(self, command: str, source: str, event_id: str | None) -> bool:
        return await self._command(
            command,
            lambda: CancelResponse(
                time.time(), command, source, self.runner.active.ref if self.runner.active else None
            ),
            event_id,
        )

    async def close(self, reason: str = "session_close", *, event_id: str | None = None) -> None:
        """Close (irreversible): record it, snapshot held ids before dropping anything, cancel
        the active response, abort submitted ids, release the rest. A failed abort keeps its
        keys (restored) and is reported (``error`` ``cleanup_failed``, with ``event_id``);
        the session is closed all the same. On a closed session: SessionError
        ``session_closed``."""
        await self._command(
            "close",
            lambda: Close(time.time(), reason, self.runner.active.ref if self.runner.active else None),
            event_id,
        )

    def fence_out(self, message: str) -> None:
        """Drop the session without writing (issue 14 fencing): another replica took it over,
        or this replica lost its lease. Its running work is cancelled (engine requests end with
        their consumers), the client gets ``error`` (code ``session_taken_over``) and
        ``session.closed``, and every later command raises SessionError
        ``session_taken_over``. Idempotent; never writes to the log."""
        if self.taken_over:
            return
        self.taken_over = True
        self.log.fence(message)  # buffered outputs of the fenced session are never flushed
        self.runner.cancel_tasks()
        self.client.send("error", code="session_taken_over", message=message, event_id=None)
        self.client.send("session.closed", reason="session_taken_over")
        self.client.end()

    async def _promote_deferred(self) -> None:
        """A response ended uncancelled: deferred input gets its own response (E9)."""
        if not self.conversation.deferred or self.runner.active is not None or self.closed:
            return
        async with self._lock:
            await self._run(
                PromoteDeferred(
                    time.time(), bool(self.conversation.deferred), self.runner.active is not None, secrets.token_hex(4)
                ),
                _Execution("commit", None),
            )

    # ------------------------------------------------------------------ execution
    def _refuse(self, code: str, message: str, event_id: str | None, *, param: str | None = None) -> NoReturn:
        """Refuse a command the rules never saw: its one ``error`` event, then SessionError."""
        self.client.send("error", **error_notice(code, message, param).data, event_id=event_id)
        raise SessionError(code, message, session_id=self.session_id, param=param)

    async def _command(self, name: str, command: Callable[[], Any], event_id: str | None = None) -> Any:
        """Decide and execute one client command under the session's lock. ``command`` builds
        it inside the lock (what it observes is current); ``event_id`` is echoed in every
        ``error`` the command causes. A cleanup the command needed that failed refuses it
        (``runtime_append_failed``, R3). Input that cannot be stored (a lone surrogate in a
        text, DOMAIN §5.7 D12) raises SessionError ``invalid_input`` naming the field (param:
        the first field); nothing is recorded (the events are built before any is applied).
        Every refusal: exactly one ``error`` client event, then SessionError; once the stream
        ended (``session.closed``) only the SessionError (the client was told, CASE-35)."""
        if self.taken_over:
            self._refuse("session_taken_over", f"{name}: the session was taken over by another replica", event_id)
        if self.superseded:
            self._refuse("session_closed", f"{name} on a closed session", event_id)
        async with self._lock:
            run = _Execution(name, self.runner.active, event_id)
            try:
                return await self._run(command(), run)
            except ValidationError as exc:  # the client's input cannot be an event (D12): refused
                errors = exc.errors()
                fields = "; ".join(f"field {'.'.join(map(str, e['loc']))!r}: {e['msg']}" for e in errors)
                param = ".".join(map(str, errors[0]["loc"])) if errors and errors[0]["loc"] else None
                self._refuse("invalid_input", f"{name}: {fields}", event_id, param=param)
            except CleanupFailed as exc:
                return await self._run(CleanupRefused(time.time(), name, exc.request_id, str(exc)), run)

    async def _run(self, command: Any, run: _Execution) -> Any:
        """Execute what the rules decide for ``command`` now; returns its reply."""
        return await self._execute(decide(self.state, command), run)

    async def _execute(self, steps: list[Step], run: _Execution) -> Any:
        reply = None
        for step in steps:
            match step:
                case Record(events=events, durable=True, pipelined=True):
                    self.log.emit_ahead(*events)  # the engine call follows; its outputs pass log.gated
                case Record(events=events, durable=True):
                    await self.log.emit(*events)
                case Record(events=events) if run.command == "turn":
                    self.log.emit_held(*events)  # a running turn's: with its next intent or at its end
                case Record(events=events):
                    self.log.emit_later(*events)
                case Notify(type="error", data=data):
                    self.client.send("error", **data, event_id=run.event_id)
                case Notify(type=type_, data=data):
                    self.client.send(type_, **data)
                case Reply(value=value):
                    reply = value
                case Refuse(code=code, message=message, request_id=request_id, param=param):
                    raise SessionError(code, message, session_id=self.session_id, request_id=request_id, param=param)
                case Cleanup():
                    await self._cleanup(step, run)
                case BufferInput(action=action, text=text, is_speech=is_speech):
                    self.conversation.buffer(action, text, is_speech)
                case StartTurn(quiet=True):
                    try:
                        await self._start_turn(step, run)
                    except SessionError:
                        pass  # already logged and sent to the client
                case StartTurn():
                    await self._start_turn(step, run)
                case HaltTurn():
                    self.runner.halt(run.turn)
                case StopTurn():
                    await self.runner.stop(run.turn)
                case ForgetStream():
                    self.runner.stream.forget()
                case CloseStream():
                    await self.runner.stream.close()
                case EndClient(reason=reason):
                    await self.log.close()
                    for failure in run.failures:
                        self.client.send("error", code="cleanup_failed", message=failure, event_id=run.event_id)
                    self.client.send("session.closed", reason=reason)
                    self.client.end()
                case Then(command=command, collect=collect):
                    try:
                        await self._run(dataclasses.replace(command, ts=time.time()), run)
                    except CleanupFailed as exc:
                        if not collect:
                            raise
                        run.failures.append(str(exc))
                case _:
                    raise TypeError(f"unknown step {step!r}")
        return reply

    async def _cleanup(self, step: Cleanup, run: _Execution) -> None:
        try:
            await cleanup_id(self.log, self.ports, step.request_id, cause=step.cause, force_abort=step.force_abort)
        except CleanupFailed as exc:
            if step.release_turn:
                # The id still runs and its keys are restored (R3). The turn's task is not
                # cancelled: closing vLLM's iterator would abort the request behind the log's
                # back. It drains the outputs silently (halted); close retries the abort (R7).
                self.runner.release(run.turn)
            if not step.collect:
                raise
            run.failures.append(str(exc))

    async def _start_turn(self, step: StartTurn, run: _Execution) -> None:
        """Take the turn's text, clean up before the submit (may refuse the command), submit
        write-ahead, and hand the turn to the runner."""
        text = self.conversation.take(step.take)
        command = "commit"  # a refused submit is the commit's refusal, whichever command started it
        speak = step.speak if step.speak is not None else self.plugin.decide(text) == "speak"
        try:
            try:
                await self._run(PrepareSubmit(time.time()), run)
            except CleanupFailed as exc:
                await self._run(CleanupRefused(time.time(), command, exc.request_id, str(exc)), run)
        except SessionError:
            await self._run(SubmitAbandoned(time.time(), step.response_id, step.announced), run)
            raise
        prompt, num_tokens_in = self.conversation.prompt(self.ports[0], text, resident=self.resident)
        now = time.time()
        turn, kind = await self._run(
            Submit(now, step.response_id, step.commit_ts, num_tokens_in, self.runner.stream.request_id), run
        )
        self.runner.start(turn, kind, text=text, speak=speak, prompt=prompt, num_tokens_in=num_tokens_in, submit_ts=now)
