"""One Realtime WebSocket connection over one engine session (vLLM's house structure: one
connection object per socket; errors are events and never close the socket, research §3).

Lifecycle: accept; open the session (``engine.open_session``; a refused admission is an
``error`` then close 1013 for ``max_sessions_reached``/``engine_closed``, 1008 otherwise);
``session.created``; then client events are dispatched one at a time while the connection,
the subscriber of the session's client feed (``ClientFeed.subscribe``: each engine write is
handed over in the writer's own step, no task hop), projects the engine's events to GA server
events. Every server event passes a bounded outbound queue drained by one sender task — what
one engine write (or one front answer) produced is ONE queue item, one wake-up of the sender:
a client too slow to drain it (``ConnectionOptions.outbound_queue_max`` events queued) is
closed (1008) and its session closed as a ``disconnect``, so it never slows another
connection. A dropped socket,
a failed send or the idle timeout (``idle_timeout_s``) close the session with reason
``disconnect`` (DOMAIN §2.4 -> ``close``). When the session ends (``session.closed``) the socket
is closed with 1000 (1001 on server shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketState

from engine_bridge.eager import run_eagerly
from engine_bridge.messages import ClientEvent, SessionError
from engine_bridge.plugin import TextPlugin
from engine_bridge.session import Session
from events.ids import RequestIdError
from realtime import duplex
from realtime.audio import PCM_BYTES_PER_SAMPLE, PCM_SAMPLE_RATE_HZ, Transcriber, decode_pcm16
from realtime.projection import CommitCause, Projection
from realtime.protocol import (
    GA_CLIENT_EVENTS,
    MAX_EVENT_BYTES,
    SUPPORTED_CLIENT_EVENTS,
    ProtocolError,
    client_event_id,
    dumps,
    error_event,
    parse_client_event,
    server_event,
    storable_text,
)
from realtime.session_config import SessionConfig, apply_update, session_object

if TYPE_CHECKING:
    from engine_bridge.engine import SessionEngine

logger = logging.getLogger(__name__)

_CLOSE = object()  # outbound-queue marker: close the socket after what is queued before it


@dataclass
class _Sending:
    """Outbound item: a send the producer started that is waiting for the socket (the
    transport paused writing), and the events of its write still to send after it."""

    send: asyncio.Future[None]
    rest: list[dict[str, Any]]


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""A session id from the wire: no markup, no path separator, no space ever reaches the ledger
or the tools that render it."""
OPEN_REFUSAL_CLOSE_CODE = {"max_sessions_reached": 1013, "engine_closed": 1013}


@dataclass(frozen=True)
class ConnectionOptions:
    """Per-server options of the Realtime front. Units in the names.

    * ``extensions``: the duplex dialect (:mod:`realtime.duplex`) is offered to sockets that
      ask for it with ``?duplex=1``; otherwise such a socket gets an error and close 1008;
    * ``idle_timeout_s``: no client frame for this long while no response runs is a
      disconnect (None: never);
    * ``outbound_queue_max``: server events queued for one client before it counts as too
      slow and is closed;
    * ``transcriber``: what turns appended audio into the thinker's text (None: only the
      ``transcript`` of an ``input_audio`` item part or an append's extension key);
    * ``model_name``: the one ``?model=`` served (any other is refused);
    * ``max_frame_bytes``: a client frame over this is ``event_too_large`` (GA's 15 MiB plus
      the JSON envelope);
    * ``reopen_wait_s``: an open of a session id whose previous connection is still closing
      (a client reconnecting right after a drop) waits this long for that close to settle,
      then opens the next incarnation; past it the open is refused ``session_exists`` with
      close 1013 (retry later). An id held by a live connection is refused at once (1008).
    """

    extensions: bool = False
    idle_timeout_s: float | None = None
    outbound_queue_max: int = 1024
    transcriber: Transcriber | None = None
    model_name: str = "duplex-ledger"
    max_frame_bytes: int = MAX_EVENT_BYTES + 64 * 1024
    reopen_wait_s: float = 5.0


@dataclass
class RealtimeState:
    """What the router reads from ``app.state.realtime``: the engine, the options and the live
    connections (by ``connection_id``)."""

    engine: SessionEngine
    options: ConnectionOptions = field(default_factory=ConnectionOptions)
    connections: dict[str, RealtimeConnection] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenParams:
    """The query parameters of ``/v1/realtime``."""

    session_id: str
    model: str
    mode: str
    resumable: bool
    duplex: bool


def _flag(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "0")
    if value not in ("0", "1", "true", "false"):
        raise ProtocolError("invalid_query", f"query parameter {name}={value!r}: must be 0 or 1", param=name)
    return value in ("1", "true")


def parse_query(query: dict[str, str], options: ConnectionOptions) -> OpenParams:
    """``model``, ``session_id`` (default ``sess_<uuid hex>``), ``mode`` (response_required |
    auto_response), ``resumable`` (0|1), ``duplex`` (0|1). Raises ProtocolError
    ``invalid_query`` / ``model_not_found`` naming the parameter."""
    model = query.get("model", options.model_name)
    if model != options.model_name:
        raise ProtocolError("model_not_found", f"model {model[:80]!r} is not served here", param="model")
    mode = query.get("mode", "response_required")
    if mode not in ("response_required", "auto_response"):
        raise ProtocolError("invalid_query", "mode must be response_required or auto_response", param="mode")
    session_id = query.get("session_id") or f"sess_{uuid.uuid4().hex}"
    if not SESSION_ID.fullmatch(session_id):
        raise ProtocolError(
            "invalid_query", "session_id: 1-128 of A-Z a-z 0-9 . _ : - (a letter or digit first)", param="session_id"
        )
    return OpenParams(session_id, model, mode, _flag(query, "resumable"), _flag(query, "duplex"))


class _StillClosing(Exception):
    """The open waited ``reopen_wait_s`` for the previous connection of its id to close."""


class RealtimeConnection:
    """One socket (see the module docstring). ``connection_id`` is ``ws-<uuid4>``."""

    def __init__(self, websocket: WebSocket, state: RealtimeState) -> None:
        self.ws = websocket
        self.state = state
        self.options = state.options
        self.connection_id = f"ws-{uuid.uuid4()}"
        self.session: Session | None = None
        self.projection: Projection | None = None
        # An item: the server events of one write (a list), or _CLOSE. Unbounded as a queue:
        # ``queued`` (events in it) is held to ``outbound_queue_max`` by :meth:`send_all`.
        self.outbound: asyncio.Queue[Any] = asyncio.Queue()
        self.queued = 0
        self.feed_ended = asyncio.Event()  # the session's client feed ended (after session.closed)
        self._sender_idle = False  # the sender waits on an empty queue: a write may go out at once
        self.sender_task: asyncio.Task[None] | None = None
        self.close_code = 1000
        self.end_reason: str | None = None  # why the connection ended (disconnect, idle_timeout, ...)
        self._stop = asyncio.Event()
        self._reading: asyncio.Task[Any] | None = None  # the task parked in a socket read
        self._read_stopped = False  # _request_stop cancelled that read
        self._created = asyncio.Event()
        self._socket_gone = False
        self._overflowed = False
        self._abort_task: asyncio.Task[None] | None = None
        self._buffer_transcripts: list[str] = []
        self._buffer_samples = 0
        self.session_id: str | None = None  # the id this connection opened (or asked for)
        self.closing = False  # the socket or the session ended: the connection is shutting down
        self.ended = asyncio.Event()  # the shutdown is over: the session is closed (or was never opened)

    # ------------------------------------------------------------------ lifecycle
    async def handle(self) -> None:
        """Serve the socket until it or the session ends; always closes the session."""
        await self.ws.accept()
        self.state.connections[self.connection_id] = self
        try:
            if await self._open():
                await self._receive_loop()
        finally:
            self.closing = True
            try:
                await self._shutdown()
            finally:
                self.state.connections.pop(self.connection_id, None)
                self.ended.set()

    async def _refuse_open(self, code: str, message: str, close_code: int, param: str | None = None) -> bool:
        with contextlib.suppress(Exception):
            await self.ws.send_text(dumps(error_event(code, message, param=param)))
            await self.ws.close(close_code)
        self._socket_gone = True
        return False

    async def _open(self) -> bool:
        try:
            params = parse_query(dict(self.ws.query_params), self.options)
        except ProtocolError as exc:
            return await self._refuse_open(exc.code, exc.message, 1008, exc.param)
        if params.duplex and not self.options.extensions:
            return await self._refuse_open("duplex_not_enabled", "this server does not offer ?duplex=1", 1008, "duplex")
        self.session_id = params.session_id
        try:
            self.session = await self._open_session(params)
        except _StillClosing as exc:
            return await self._refuse_open("session_exists", str(exc), 1013)
        except SessionError as exc:
            return await self._refuse_open(exc.code, str(exc), OPEN_REFUSAL_CLOSE_CODE.get(exc.code, 1008))
        except RequestIdError as exc:
            return await self._refuse_open("invalid_query", f"session_id: {exc}", 1008, "session_id")
        except Exception as exc:  # noqa: BLE001 - the ledger or engine failed: told, logged, 1011
            logger.exception("%s: open_session failed", self.connection_id)
            return await self._refuse_open(
                "internal_error", f"the session could not be opened: {type(exc).__name__}", 1011
            )
        config = SessionConfig(
            session_id=params.session_id,
            model=params.model,
            mode=params.mode,  # type: ignore[arg-type]
            resumable=params.resumable,
            instructions=self.state.engine.config.system_prompt,
            dialect="ga+duplex" if params.duplex else "ga",
        )
        self.projection = Projection(config, duplex_dialect=params.duplex)
        self.sender_task = asyncio.create_task(self._sender(), name=f"{self.connection_id}-sender")
        self.session.subscribe(self._deliver)  # session.created, queued at the open, comes first
        with contextlib.suppress(TimeoutError):  # session.created goes out before any answer
            await asyncio.wait_for(self._created.wait(), 10.0)
        return True

    async def _open_session(self, params: OpenParams) -> Session:
        """``engine.open_session`` for ``params``, once no previous connection of the same id is
        still closing. A client reconnecting a few ms after a drop finds the old connection's
        close unsettled (its aborts in flight, its last results not yet in the log): the open
        waits for that close, at most ``reopen_wait_s``, so it is neither refused
        ``session_exists`` nor started beside a close that still writes the stream; then it
        opens the next incarnation. Raises _StillClosing past the bound, SessionError as
        ``open_session`` does otherwise."""
        waited = False
        while True:
            previous = None if waited else self._closing_holder(params.session_id)
            if previous is not None:
                waited = True
                try:
                    await asyncio.wait_for(previous.ended.wait(), self.options.reopen_wait_s)
                except TimeoutError:
                    raise _StillClosing(
                        f"session {params.session_id!r}: its previous connection is still closing "
                        f"after {self.options.reopen_wait_s:g} s; retry"
                    ) from None
            try:
                return await self.state.engine.open_session(
                    params.session_id,
                    auto_response=params.mode == "auto_response",
                    plugin=TextPlugin(resumable=params.resumable),
                    protocol="realtime+duplex" if params.duplex else "realtime",
                    connection_id=self.connection_id,
                )
            except SessionError as exc:
                # the old connection saw its socket drop while this open ran: wait for it once
                if exc.code != "session_exists" or waited or self._closing_holder(params.session_id) is None:
                    raise

    def _closing_holder(self, session_id: str) -> RealtimeConnection | None:
        """Another connection of ``session_id`` that is shutting down (its close not settled)."""
        for other in list(self.state.connections.values()):
            if other is not self and other.session_id == session_id and other.closing and not other.ended.is_set():
                return other
        return None

    async def _next_frame(self) -> str | bytes | None:
        """The next client frame; None when the socket closed, the connection is stopping or
        the idle timeout passed (``end_reason`` says which). Idle means no client frame for
        ``idle_timeout_s`` while no response runs: a client listening to a long answer is not
        idle. The socket is read in this task (no task and no ``asyncio.wait`` per frame): a
        stop requested meanwhile (:meth:`_request_stop`) cancels the read."""
        task = asyncio.current_task()
        while True:
            if self._stop.is_set():
                self.end_reason = self.end_reason or "stopped"
                return None
            self._reading = task
            try:
                async with asyncio.timeout(self.options.idle_timeout_s):
                    message = await self.ws.receive()
                break
            except TimeoutError:
                if self.session is None or self.session.active is None:
                    self.end_reason = self.end_reason or "idle_timeout"
                    return None
            except asyncio.CancelledError:
                if not self._read_stopped or task is None:
                    raise
                self._read_stopped = False
                task.uncancel()  # the stop's own cancel, not the server's
            finally:
                self._reading = None
        if message["type"] == "websocket.disconnect":
            self._socket_gone = True
            self.end_reason = self.end_reason or f"client_closed_{message.get('code', 1005)}"
            return None
        text = message.get("text")
        return text if text is not None else (message.get("bytes") or b"")

    def _request_stop(self) -> None:
        """End the connection: the receive loop stops (a read in progress is cancelled)."""
        self._stop.set()
        reading = self._reading
        if reading is not None and not self._read_stopped and reading is not asyncio.current_task():
            self._read_stopped = True
            reading.cancel()

    async def _receive_loop(self) -> None:
        while not self._stop.is_set():
            try:
                frame = await self._next_frame()
            except Exception as exc:  # noqa: BLE001 - a transport failure is a disconnect
                logger.info("%s: receive failed: %s", self.connection_id, exc)
                self._socket_gone = True
                self.end_reason = "receive_failed"
                return
            if frame is None:
                return
            await self._dispatch(frame)

    async def _shutdown(self) -> None:
        """The session is closed (``disconnect`` unless it already closed), its feed delivers
        the session's last events, then the socket is closed (if it is still open)."""
        session = self.session
        if session is not None and not session.closed:
            if self.end_reason:
                logger.info("%s: session %s ends: %s", self.connection_id, session.session_id, self.end_reason)
            try:
                await session.close("disconnect")
            except SessionError as exc:
                logger.info("%s: close on disconnect refused: %s", self.connection_id, exc)
            except Exception:  # noqa: BLE001 - the session is closed all the same (logged)
                logger.exception("%s: close on disconnect failed", self.connection_id)
        if session is not None:
            try:
                await asyncio.wait_for(self.feed_ended.wait(), 10.0)
            except Exception:  # noqa: BLE001 - a feed that never ends: the connection ends all the same
                logger.warning("%s: the session's events did not end", self.connection_id)
        if self.sender_task is not None:
            if not (self._socket_gone or self._overflowed):
                self.outbound.put_nowait(_CLOSE)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self.sender_task), 5.0)
            self.sender_task.cancel()
            with contextlib.suppress(BaseException):
                await self.sender_task
        if self._abort_task is not None:
            with contextlib.suppress(Exception):
                await self._abort_task
        if not self._socket_gone and self.ws.application_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(self.close_code), 5.0)

    # ------------------------------------------------------------------ outbound
    def send(self, event: dict[str, Any]) -> None:
        """Queue one server event (:meth:`send_all`)."""
        self.send_all([event])

    def send_all(self, events: list[dict[str, Any]]) -> None:
        """Queue server events as one item (one wake-up of the sender); a queue that would
        hold more than ``outbound_queue_max`` events closes the connection (slow client)."""
        if self._overflowed or self._socket_gone or not events:
            return
        if self.queued + len(events) > self.options.outbound_queue_max:
            self._overflowed = True
            self.close_code = 1008
            self.end_reason = "outbound_queue_full"
            logger.warning(
                "%s: client too slow (%d events queued): closing as a disconnect", self.connection_id, self.queued
            )
            self._request_stop()
            self._abort_task = asyncio.get_running_loop().create_task(self._abort_socket())
            return
        if self._sender_idle and self.outbound.empty():
            self._send_now(events)
            return
        self.queued += len(events)
        self.outbound.put_nowait(events)

    def _send_now(self, events: list[dict[str, Any]]) -> None:
        """Send a write in the producer's step while nothing waits before it (the socket's send
        completes without waiting unless the transport paused writing): no wake-up of the
        sender. A send that has to wait is handed to the sender with the rest of the write, so
        the order on the wire stays the order of the writes."""
        send_text = self.ws.send_text
        for i, event in enumerate(events):
            try:
                sending = run_eagerly(send_text(dumps(event)))
            except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                self._send_failed(exc)
                return
            if sending is not None:
                rest = events[i + 1 :]
                self.queued += 1 + len(rest)
                self.outbound.put_nowait(_Sending(sending, rest))
                return

    def _send_failed(self, exc: BaseException) -> None:
        """A failed send is a disconnect (research §2.1)."""
        logger.info("%s: send failed: %s", self.connection_id, exc)
        self._socket_gone = True
        self.end_reason = self.end_reason or "send_failed"
        self._request_stop()

    async def _abort_socket(self) -> None:
        if self.sender_task is not None:
            self.sender_task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(1008), 5.0)
        self._socket_gone = True

    async def _sender(self) -> None:
        """Drain the outbound queue in order; idle (``_sender_idle``) only while it waits on an
        empty queue, so a write may then go out in its producer's step (:meth:`send_all`)."""
        try:
            await self._drain_outbound()
        finally:
            self._sender_idle = False

    async def _drain_outbound(self) -> None:
        send_text = self.ws.send_text
        while True:
            self._sender_idle = self.outbound.empty()
            item = await self.outbound.get()
            self._sender_idle = False
            if item is _CLOSE:
                if not self._socket_gone:
                    with contextlib.suppress(Exception):
                        await self.ws.close(self.close_code)
                    self._socket_gone = True
                return
            events = item
            if isinstance(item, _Sending):
                self.queued -= 1
                events = item.rest
                try:
                    await item.send
                except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                    self._send_failed(exc)
            self.queued -= len(events)
            for event in events:
                if self._socket_gone:
                    break
                try:
                    await send_text(dumps(event))
                except Exception as exc:  # noqa: BLE001 - a failed send is a disconnect
                    self._send_failed(exc)

    def _deliver(self, events: Sequence[ClientEvent] | None) -> None:
        """The session's client feed hands each write here, in the writer's step
        (``ClientFeed.subscribe``; None: the feed ended): its events are projected and queued
        as one outbound item. A projection failure is logged and ends the connection."""
        if self.feed_ended.is_set():
            return
        if events is None:
            self.feed_ended.set()
            self._created.set()
            return
        assert self.projection is not None
        try:
            project, out = self.projection.project, []
            for event in events:
                out += project(event)
                if event.type == "session.created":
                    self._created.set()
                elif event.type == "session.closed":
                    self.send_all(out)
                    out = []
                    self.close_code = 1001 if event.data.get("reason") == "server_shutdown" else 1000
                    self.end_reason = self.end_reason or f"session_closed_{event.data.get('reason')}"
                    if not self._socket_gone and not self._overflowed:
                        self.outbound.put_nowait(_CLOSE)
                    self._request_stop()
            self.send_all(out)
        except Exception:  # noqa: BLE001 - logged; the connection then ends
            logger.exception("%s: projecting the session's events failed", self.connection_id)
            self.feed_ended.set()
            self._created.set()
            self._request_stop()

    # ------------------------------------------------------------------ inbound
    async def _dispatch(self, frame: str | bytes) -> None:
        """One client frame -> engine commands; every refusal is an ``error`` event echoing the
        client's ``event_id`` (and ``param``); the socket stays open."""
        event_id: str | None = None
        try:
            event = parse_client_event(frame, max_bytes=self.options.max_frame_bytes)
            event_id = client_event_id(event)
            await self._handle(event["type"], event, event_id)
        except ProtocolError as exc:
            self.send(error_event(exc.code, exc.message, event_id=event_id or exc.event_id, param=exc.param))
        except SessionError:
            pass  # the engine's one error event for it is on the session's stream (see _command)
        except Exception as exc:  # noqa: BLE001 - one bad event never ends the connection
            logger.exception("%s: event failed", self.connection_id)
            self.send(error_event("internal_error", f"{type(exc).__name__}", event_id=event_id))

    async def _command(self, method: Callable[..., Awaitable[Any]], *args: Any, event_id: str | None, **kw: Any) -> Any:
        """Call an engine command on behalf of the client event ``event_id``. A refusal puts
        exactly one ``error`` event (echoing ``event_id``, with ``param``) on the session's
        stream and raises SessionError (research G5): the front forwards that event and never
        sends one of its own."""
        return await method(*args, event_id=event_id, **kw)

    async def _handle(self, type_: str, event: dict[str, Any], event_id: str | None) -> None:
        assert self.session is not None and self.projection is not None
        if type_ in duplex.DUPLEX_CLIENT_EVENTS and self.projection.duplex:
            await self._handle_duplex(type_, event_id)
            return
        if type_ not in GA_CLIENT_EVENTS:
            raise ProtocolError("unknown_event", f"unknown event type {type_[:80]!r}", param="type")
        if type_ not in SUPPORTED_CLIENT_EVENTS:
            raise ProtocolError("unsupported_event", f"{type_} is not supported by this server", param="type")
        handler = getattr(self, "_on_" + type_.replace(".", "_"))
        await handler(event, event_id)

    async def _handle_duplex(self, type_: str, event_id: str | None) -> None:
        assert self.session is not None
        if type_ == "barge_in":
            await self._command(self.session.barge_in, event_id=event_id)
        elif type_ == "input.cancel":
            await self._command(self.session.cancel_input, event_id=event_id)
            self._reset_buffer()
            self.send(server_event("input_audio_buffer.cleared"))
        else:  # session.close
            await self._command(self.session.close, duplex.CLOSE_REASON, event_id=event_id)

    # --- GA client events
    async def _on_session_update(self, event: dict[str, Any], event_id: str | None) -> None:
        assert self.projection is not None
        self.projection.config = apply_update(self.projection.config, event.get("session"))
        self.send(server_event("session.updated", session=session_object(self.projection.config)))

    async def _transcript(self, pcm: bytes, given: object) -> str | None:
        """What the thinker hears for ``pcm``: the item part's transcript (``given``), else
        the transcriber's, else None (research §5.4)."""
        if isinstance(given, str):
            return given
        if self.options.transcriber is not None:
            return await self.options.transcriber.transcribe(pcm, sample_rate_hz=PCM_SAMPLE_RATE_HZ)
        return None

    async def _append_audio(self, pcm: bytes, transcript: str | None, event_id: str | None) -> None:
        assert self.session is not None
        await self._command(
            self.session.append_audio,
            pcm,
            audio_format="pcm16",
            sample_rate_hz=PCM_SAMPLE_RATE_HZ,
            transcript=transcript,
            is_speech=bool(transcript and transcript.strip()),
            event_id=event_id,
        )

    async def _on_input_audio_buffer_append(self, event: dict[str, Any], event_id: str | None) -> None:
        pcm = decode_pcm16(event.get("audio"), max_bytes=MAX_EVENT_BYTES)
        transcript = await self._transcript(pcm, None)
        if transcript is None and isinstance(event.get("transcript"), str):  # extension key (research §5.4 3.)
            transcript = event["transcript"]
        await self._append_audio(pcm, transcript, event_id)
        self._buffer_samples += len(pcm) // PCM_BYTES_PER_SAMPLE
        if transcript and transcript.strip():
            self._buffer_transcripts.append(transcript.strip())

    def _reset_buffer(self) -> None:
        self._buffer_transcripts, self._buffer_samples = [], 0

    async def _commit(self, cause: CommitCause, event_id: str | None) -> None:
        """Commit with ``cause`` queued for the projection (GA: a commit never creates a
        response in response_required mode)."""
        assert self.session is not None and self.projection is not None
        self.projection.causes.append(cause)
        try:
            if self.projection.config.mode == "auto_response":
                await self._command(self.session.commit, event_id=event_id)
            else:
                await self._command(self.session.commit, create_response=False, event_id=event_id)
        except BaseException:
            self.projection.causes.pop()
            raise

    async def _on_input_audio_buffer_commit(self, event: dict[str, Any], event_id: str | None) -> None:
        transcript = " ".join(self._buffer_transcripts) or None
        part: dict[str, Any] = {"type": "input_audio"}
        if transcript:
            part["transcript"] = transcript
        seconds = self._buffer_samples / PCM_SAMPLE_RATE_HZ
        has_audio = self._buffer_samples > 0
        await self._commit(CommitCause("buffer", [part], has_audio, transcript, seconds), event_id)
        self._reset_buffer()

    async def _on_input_audio_buffer_clear(self, event: dict[str, Any], event_id: str | None) -> None:
        """A pure input clear (G1): a running response is not touched; the engine's
        ``input_audio_buffer.cleared`` is projected."""
        assert self.session is not None
        await self._command(self.session.clear_input, event_id=event_id)
        self._reset_buffer()

    async def _on_conversation_item_create(self, event: dict[str, Any], event_id: str | None) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            raise ProtocolError("bad_event", "item must be an object", param="item")
        if item.get("type", "message") != "message":
            raise ProtocolError("unsupported_item", f"item type {str(item.get('type'))[:40]!r}", param="item.type")
        if item.get("role") != "user":
            raise ProtocolError("unsupported_item", "only user messages are accepted", param="item.role")
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise ProtocolError("bad_event", "item.content must be a non-empty list", param="item.content")
        parts: list[tuple[str, Any, str | None]] = []  # (kind, text or pcm, transcript)
        for i, part in enumerate(content):
            where = f"item.content[{i}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "input_text" and isinstance(part.get("text"), str):
                parts.append(("text", storable_text(part["text"], param=f"{where}.text"), None))
            elif kind == "input_audio":
                pcm = decode_pcm16(part.get("audio"), param=f"{where}.audio")
                if isinstance(part.get("transcript"), str):
                    storable_text(part["transcript"], param=f"{where}.transcript")
                transcript = await self._transcript(pcm, part.get("transcript"))
                parts.append(("audio", pcm, transcript))
            else:
                raise ProtocolError("unsupported_item", f"{where}: only input_text and input_audio", param=where)
        wire: list[dict[str, Any]] = []
        has_audio, seconds, heard = False, 0.0, []
        for kind, value, transcript in parts:
            if kind == "text":
                await self._command(self.session.append_text, value, event_id=event_id)  # type: ignore[union-attr]
                wire.append({"type": "input_text", "text": value})
                continue
            await self._append_audio(value, transcript, event_id)
            has_audio, seconds = True, seconds + len(value) / PCM_BYTES_PER_SAMPLE / PCM_SAMPLE_RATE_HZ
            wire.append({"type": "input_audio", **({"transcript": transcript} if transcript else {})})
            if transcript and transcript.strip():
                heard.append(transcript.strip())
        await self._commit(CommitCause("item", wire, has_audio, " ".join(heard) or None, seconds), event_id)

    async def _on_response_create(self, event: dict[str, Any], event_id: str | None) -> None:
        assert self.session is not None
        await self._command(self.session.create_response, event_id=event_id)

    async def _on_response_cancel(self, event: dict[str, Any], event_id: str | None) -> None:
        assert self.session is not None
        wanted = event.get("response_id")
        active = self.session.active
        if wanted is not None and (active is None or active.ref.response_id != wanted):
            raise ProtocolError(
                "response_cancel_not_active", f"response {str(wanted)[:80]!r} is not in progress", param="response_id"
            )
        await self._command(self.session.cancel_response, event_id=event_id)  # nothing: the engine's error (D14)

    async def _on_output_audio_buffer_clear(self, event: dict[str, Any], event_id: str | None) -> None:
        assert self.session is not None
        if not await self._command(self.session.clear_output_audio, event_id=event_id):
            # the engine only replies False (serve's contract): GA's answer is the front's
            raise ProtocolError("response_cancel_not_active", "no response audio is playing to clear")
