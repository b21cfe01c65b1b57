"""One full-duplex session driven against the stage ports (DOMAIN §2–§4): the hand that
executes the session's rules.

Each command (append, commit, response.create, the cancels, close) is built here from what
the process observes (time, whether response work runs, the input buffer) and handed, under
the session's lock, to :func:`decider.decide` together with the session's folded state; the
steps it returns are carried out by :class:`~engine_bridge.executor.StepExecutor`. Epoch,
turn and bindings change only by folding the recorded events (the session's projector, the
same folds the offline audit runs). Nothing here decides a rule.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from decider import (
    Append,
    CancelResponse,
    ClearInput,
    Close,
    Commit,
    CreateResponse,
    PromoteDeferred,
    Reserve,
    SessionRules,
    SessionState,
)
from engine_bridge.client_feed import ClientFeed
from engine_bridge.conversation import Conversation
from engine_bridge.executor import Execution, StepExecutor
from engine_bridge.inputs import audio_input_fields, text_input_fields
from engine_bridge.messages import ClientEvent, EngineConfig
from engine_bridge.plugin import ModelPlugin
from engine_bridge.ports import StagePort
from engine_bridge.session_log import SessionLog
from engine_bridge.turn_run import TurnRun
from events.types import Fence


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
        self.resident = self.capabilities.supports_core_resumable_request  # one resident Stage0 stream
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
        self.executor = StepExecutor(
            session_id,
            state=self.state,
            log=log,
            ports=ports,
            plugin=plugin,
            config=config,
            client=self.client,
            conversation=self.conversation,
            resident=self.resident,
            on_done=self._promote_deferred,
        )
        self.runner = self.executor.runner
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ queries
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
        await self.executor.run(Reserve(time.time()), Execution("open", None))
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
        fields = text_input_fields(text)
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
            self.executor.refuse(
                "invalid_input",
                f"append: sample_rate_hz must be an integer > 0, got {sample_rate_hz!r}",
                event_id,
                param="sample_rate_hz",
            )
        fields = audio_input_fields(pcm, sample_rate_hz, audio_format, transcript, store_payload=store_payload)
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

    async def cancel_response(self, *, event_id: str | None = None, param: str | None = None) -> bool:
        """response.cancel (log reason ``cancel``). With no response in progress the client gets
        one ``error`` event ``response_cancel_not_active`` (with ``event_id``, and ``param`` when
        given: the client field that named a response) and False is returned, nothing raised
        (D14)."""
        return await self._cancel("response.cancel", "response.cancel", event_id, param)

    async def cancel_input(self, *, event_id: str | None = None) -> bool:
        """input.cancel: drop the input buffer and cancel the response (log reason ``cancel``;
        wire reason stays ``barge_in``, M17). False (no error) when no response runs; the
        buffer is dropped all the same (not logged: see :meth:`clear_input` for a logged clear)."""
        return await self._cancel("input.cancel", "input.cancel", event_id)

    async def clear_output_audio(self, *, event_id: str | None = None) -> bool:
        """output_audio_buffer.clear (log reason ``cancel``). False (no error event) when no
        response is in progress: the front says what its protocol wants (research §5.5)."""
        return await self._cancel("output_audio_buffer.clear", "output_audio_buffer_clear", event_id)

    async def _cancel(self, command: str, source: str, event_id: str | None, param: str | None = None) -> bool:
        return await self._command(
            command,
            lambda: CancelResponse(
                time.time(), command, source, self.runner.active.ref if self.runner.active else None, param
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
            await self.executor.run(
                PromoteDeferred(
                    time.time(), bool(self.conversation.deferred), self.runner.active is not None, secrets.token_hex(4)
                ),
                Execution("commit", None),
            )

    # ------------------------------------------------------------------ execution
    async def _command(self, name: str, command: Callable[[], Any], event_id: str | None = None) -> Any:
        """Decide and execute one client command under the session's lock
        (:meth:`StepExecutor.command`). Every refusal: exactly one ``error`` client event, then
        SessionError; once the stream ended (``session.closed``) only the SessionError (the
        client was told, CASE-35)."""
        if self.taken_over:
            self.executor.refuse(
                "session_taken_over", f"{name}: the session was taken over by another replica", event_id
            )
        if self.superseded:
            self.executor.refuse("session_closed", f"{name} on a closed session", event_id)
        async with self._lock:
            return await self.executor.command(name, command, event_id)
