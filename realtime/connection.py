"""One Realtime WebSocket connection over one engine session (vLLM's house structure: one
connection object per socket; errors are events and never close the socket, research §3).

Lifecycle: accept; open the session (:mod:`realtime.opening`: ``engine.open_session``; a
refused admission is an ``error`` then close 1013 for ``max_sessions_reached``/
``engine_closed``, 1008 otherwise); ``session.created``; then client events are dispatched one
at a time (:class:`realtime.client_events.ClientEvents`) while the connection, the subscriber
of the session's client feed (``ClientFeed.subscribe``: each engine write is handed over in
the writer's own step, no task hop), projects the engine's events to GA server events
(:class:`realtime.projection.Projection`). Every server event passes the bounded outbound
queue of :class:`realtime.outbound.Outbound` — what one engine write (or one front answer)
produced is ONE queue item, one wake-up of its sender: a client too slow to drain it
(``ConnectionOptions.outbound_queue_max`` events queued) is closed (1008) and its session
closed as a ``disconnect``, so it never slows another connection. The client's normal
closure (close code 1000: the SDK's ``connection.close()``) closes the session with reason
``session_close``; a dropped socket (any other code, 1006 for a lost transport), a failed send
or the idle timeout (``idle_timeout_s``) with reason ``disconnect`` (:func:`session_end_reason`;
both DOMAIN §2.4 session-end reasons -> ``close``). When the session ends (``session.closed``)
the socket is closed with 1000 (1001 on server shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketState

from engine_bridge.messages import ClientEvent, SessionError
from engine_bridge.session import Session
from events.ids import RequestIdError
from realtime.audio import Transcriber
from realtime.client_events import ClientEvents
from realtime.opening import (
    OPEN_REFUSAL_CLOSE_CODE,
    SESSION_ID,
    OpenParams,
    StillClosing,
    open_session,
    parse_query,
)
from realtime.outbound import Outbound
from realtime.projection import Projection
from realtime.protocol import MAX_EVENT_BYTES, ProtocolError, dumps, error_event
from realtime.session_config import SessionConfig

if TYPE_CHECKING:
    from engine_bridge.engine import SessionEngine

__all__ = [
    "OPEN_REFUSAL_CLOSE_CODE",
    "SESSION_ID",
    "ConnectionOptions",
    "OpenParams",
    "RealtimeConnection",
    "RealtimeState",
    "parse_query",
]

logger = logging.getLogger(__name__)


NORMAL_CLOSURE = 1000
"""WebSocket close code of a normal closure (RFC 6455 §7.4.1), what ``connection.close()`` of the
``openai`` SDK sends (research/realtime.md §2.1)."""


def session_end_reason(end_reason: str | None) -> str:
    """The session's close reason for how its connection ended (``RealtimeConnection.
    end_reason``), one of DOMAIN §2.4's session-end reasons: ``session_close`` when the client
    closed the socket normally (``client_closed_1000``: it ended the session, as the duplex
    dialect's ``session.close`` does); ``disconnect`` for every other end (another close code —
    1001 going away, 1006 a lost transport —, a failed receive or send, a client too slow, the
    idle timeout, a stop): the transport ended under the session."""
    return "session_close" if end_reason == f"client_closed_{NORMAL_CLOSURE}" else "disconnect"


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


class RealtimeConnection:
    """One socket (see the module docstring). ``connection_id`` is ``ws-<uuid4>``; ``out`` its
    outbound path; ``events`` its client-event side (once the session is open)."""

    def __init__(self, websocket: WebSocket, state: RealtimeState) -> None:
        self.ws = websocket
        self.state = state
        self.options = state.options
        self.connection_id = f"ws-{uuid.uuid4()}"
        self.session: Session | None = None
        self.projection: Projection | None = None
        self.events: ClientEvents | None = None
        self.out = Outbound(
            websocket, queue_max=self.options.outbound_queue_max, connection_id=self.connection_id, stop=self._end
        )
        self.feed_ended = asyncio.Event()  # the session's client feed ended (after session.closed)
        self.end_reason: str | None = None  # why the connection ended (disconnect, idle_timeout, ...)
        self._stop = asyncio.Event()
        self._reading: asyncio.Task[Any] | None = None  # the task parked in a socket read
        self._read_stopped = False  # _request_stop cancelled that read
        self._created = asyncio.Event()
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
        self.out.socket_gone = True
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
            self.session = await open_session(
                self.state.engine,
                params,
                connection_id=self.connection_id,
                connections=self.state.connections,
                me=self,
                reopen_wait_s=self.options.reopen_wait_s,
            )
        except StillClosing as exc:
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
            max_output_tokens=self.state.engine.config.max_tokens,
            dialect="ga+duplex" if params.duplex else "ga",
        )
        self.projection = Projection(config, duplex_dialect=params.duplex)
        self.events = ClientEvents(self.session, self.projection, self.options, self.out.send, self.connection_id)
        self.out.start()
        self.session.subscribe(self._deliver)  # session.created, queued at the open, comes first
        with contextlib.suppress(TimeoutError):  # session.created goes out before any answer
            await asyncio.wait_for(self._created.wait(), 10.0)
        return True

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
            self.out.socket_gone = True
            self.end_reason = self.end_reason or f"client_closed_{message.get('code', 1005)}"
            return None
        text = message.get("text")
        return text if text is not None else (message.get("bytes") or b"")

    def _end(self, reason: str, overriding: bool) -> None:
        """The outbound path ends the connection (a failed send, a slow client)."""
        self.end_reason = reason if overriding else self.end_reason or reason
        self._request_stop()

    def _request_stop(self) -> None:
        """End the connection: the receive loop stops (a read in progress is cancelled)."""
        self._stop.set()
        reading = self._reading
        if reading is not None and not self._read_stopped and reading is not asyncio.current_task():
            self._read_stopped = True
            reading.cancel()

    async def _receive_loop(self) -> None:
        assert self.events is not None
        dispatch = self.events.dispatch
        while not self._stop.is_set():
            try:
                frame = await self._next_frame()
            except Exception as exc:  # noqa: BLE001 - a transport failure is a disconnect
                logger.info("%s: receive failed: %s", self.connection_id, exc)
                self.out.socket_gone = True
                self.end_reason = "receive_failed"
                return
            if frame is None:
                return
            await dispatch(frame)

    async def _shutdown(self) -> None:
        """The session is closed (unless it already closed) with :func:`session_end_reason`
        of how the connection ended, its feed delivers the session's last events, then the
        socket is closed (if it is still open)."""
        session = self.session
        if session is not None and not session.closed:
            if self.end_reason:
                logger.info("%s: session %s ends: %s", self.connection_id, session.session_id, self.end_reason)
            reason = session_end_reason(self.end_reason)
            try:
                await session.close(reason)
            except SessionError as exc:
                logger.info("%s: close on %s refused: %s", self.connection_id, reason, exc)
            except Exception:  # noqa: BLE001 - the session is closed all the same (logged)
                logger.exception("%s: close on %s failed", self.connection_id, reason)
        if session is not None:
            try:
                await asyncio.wait_for(self.feed_ended.wait(), 10.0)
            except Exception:  # noqa: BLE001 - a feed that never ends: the connection ends all the same
                logger.warning("%s: the session's events did not end", self.connection_id)
        await self.out.finish()
        if not self.out.socket_gone and self.ws.application_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(self.out.close_code), 5.0)

    # ------------------------------------------------------------------ the session's feed
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
        out = self.out
        try:
            project, sending = self.projection.project, []
            for event in events:
                sending += project(event)
                if event.type == "session.created":
                    self._created.set()
                elif event.type == "session.closed":
                    out.send_all(sending)
                    sending = []
                    out.close_code = 1001 if event.data.get("reason") == "server_shutdown" else 1000
                    self.end_reason = self.end_reason or f"session_closed_{event.data.get('reason')}"
                    out.close_after_queued()
                    self._request_stop()
            out.send_all(sending)
        except Exception:  # noqa: BLE001 - logged; the connection then ends
            logger.exception("%s: projecting the session's events failed", self.connection_id)
            self.feed_ended.set()
            self._created.set()
            self._request_stop()
