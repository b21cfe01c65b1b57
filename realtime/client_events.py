"""Client events -> engine commands for one Realtime connection (research/realtime.md §5.2).

One client frame at a time: parsed (:func:`realtime.protocol.parse_client_event`), dispatched
by its ``type`` to one handler, which calls the session's commands. Every refusal is an
``error`` event echoing the client's ``event_id`` (and ``param``) and the socket stays open: a
refusal the front decides is its own ``error``; one the engine decides is the engine's one
``error`` on the session's stream (research G5), never a second one from the front.

State kept here: what the input buffer holds since its last commit (the transcripts heard and
the samples appended), for the user item of the next ``input_audio_buffer.commit``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from engine_bridge.messages import SessionError
from engine_bridge.session import Session
from realtime import duplex
from realtime.audio import PCM_BYTES_PER_SAMPLE, PCM_SAMPLE_RATE_HZ, decode_pcm16
from realtime.projection import CommitCause, Projection, RequestedResponse
from realtime.protocol import (
    GA_CLIENT_EVENTS,
    MAX_EVENT_BYTES,
    SUPPORTED_CLIENT_EVENTS,
    ProtocolError,
    client_event_id,
    error_event,
    parse_client_event,
    server_event,
    storable_text,
)
from realtime.request_fields import client_metadata, max_output_tokens_notice, response_overrides
from realtime.session_config import apply_update, session_object

if TYPE_CHECKING:
    from realtime.connection import ConnectionOptions

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]
"""Queue one server event on the connection's outbound path."""

SYSTEM_ITEM_REFUSAL = (
    "only user messages are accepted: a system message would change the instructions, which are "
    "this server's fixed system prompt (session.instructions)"
)
"""Why a ``system`` message item is refused (research/realtime.md §5.1-§5.2): GA takes it
into the conversation, but the engine's instructions are fixed at open and recorded nowhere
else than its config (``session.updated`` answers ``instructions`` with that effective value,
never pretended changed), and everything the model hears reaches the ledger as appended input
(``InputAppended``), which has no role: taking the text as the user's words would change its
role, taking it as instructions would put words in the prompt that the log does not hold."""


async def _command(method: Callable[..., Awaitable[Any]], *args: Any, event_id: str | None, **kw: Any) -> Any:
    """Call an engine command on behalf of the client event ``event_id``. A refusal puts
    exactly one ``error`` event (echoing ``event_id``, with ``param``) on the session's stream
    and raises SessionError (research G5): the front forwards that event and never sends one
    of its own."""
    return await method(*args, event_id=event_id, **kw)


class ClientEvents:
    """The client-event side of one connection (see the module docstring): ``dispatch`` one
    frame; ``send`` queues the front's own answers."""

    def __init__(
        self, session: Session, projection: Projection, options: ConnectionOptions, send: Send, connection_id: str
    ) -> None:
        self.session = session
        self.projection = projection
        self.options = options
        self.send = send
        self.connection_id = connection_id
        self._buffer_transcripts: list[str] = []
        self._buffer_samples = 0

    async def dispatch(self, frame: str | bytes) -> None:
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

    async def _handle(self, type_: str, event: dict[str, Any], event_id: str | None) -> None:
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
        if type_ == "barge_in":
            await _command(self.session.barge_in, event_id=event_id)
        elif type_ == "input.cancel":
            await _command(self.session.cancel_input, event_id=event_id)
            self._reset_buffer()
            self.send(server_event("input_audio_buffer.cleared"))
        else:  # session.close
            await _command(self.session.close, duplex.CLOSE_REASON, event_id=event_id)

    # --- GA client events
    def _fixed_by_server(self, requested: object, param: str, event_id: str | None) -> None:
        """Validate a requested ``max_output_tokens`` (ProtocolError ``invalid_value``: the event
        is refused); a valid value the server does not apply gets an ``error``
        ``fixed_by_server`` before the answer, which shows the effective value."""
        notice = max_output_tokens_notice(requested, self.projection.config.max_output_tokens, param=param)
        if notice is not None:
            self.send(error_event(notice.code, notice.message, event_id=event_id, param=notice.param))

    async def _on_session_update(self, event: dict[str, Any], event_id: str | None) -> None:
        session = event.get("session")
        config = apply_update(self.projection.config, session)
        assert isinstance(session, dict)  # apply_update refused anything else
        self._fixed_by_server(session.get("max_output_tokens"), "session.max_output_tokens", event_id)
        self.projection.config = config
        self.send(server_event("session.updated", session=session_object(config)))

    async def _transcript(self, pcm: bytes, given: object) -> str | None:
        """What the thinker hears for ``pcm``: the item part's transcript (``given``), else
        the transcriber's, else None (research §5.4)."""
        if isinstance(given, str):
            return given
        if self.options.transcriber is not None:
            return await self.options.transcriber.transcribe(pcm, sample_rate_hz=PCM_SAMPLE_RATE_HZ)
        return None

    async def _append_audio(self, pcm: bytes, transcript: str | None, event_id: str | None) -> None:
        await _command(
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
        self.projection.causes.append(cause)
        try:
            if self.projection.config.mode == "auto_response":
                await _command(self.session.commit, event_id=event_id)
            else:
                await _command(self.session.commit, create_response=False, event_id=event_id)
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
        await _command(self.session.clear_input, event_id=event_id)
        self._reset_buffer()

    async def _on_conversation_item_create(self, event: dict[str, Any], event_id: str | None) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            raise ProtocolError("bad_event", "item must be an object", param="item")
        if item.get("type", "message") != "message":
            raise ProtocolError("unsupported_item", f"item type {str(item.get('type'))[:40]!r}", param="item.type")
        if item.get("role") == "system":
            raise ProtocolError("unsupported_item", SYSTEM_ITEM_REFUSAL, param="item.role")
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
                await _command(self.session.append_text, value, event_id=event_id)
                wire.append({"type": "input_text", "text": value})
                continue
            await self._append_audio(value, transcript, event_id)
            has_audio, seconds = True, seconds + len(value) / PCM_BYTES_PER_SAMPLE / PCM_SAMPLE_RATE_HZ
            wire.append({"type": "input_audio", **({"transcript": transcript} if transcript else {})})
            if transcript and transcript.strip():
                heard.append(transcript.strip())
        await self._commit(CommitCause("item", wire, has_audio, " ".join(heard) or None, seconds), event_id)

    async def _on_response_create(self, event: dict[str, Any], event_id: str | None) -> None:
        """Start a response. ``response.metadata`` is validated (ProtocolError ``invalid_value``,
        no response) and echoed on the response object; the per-response overrides
        (``output_modalities`` honoured for this response, ``instructions`` and
        ``max_output_tokens`` fixed by the server, the rest refused: :func:`response_overrides`)
        are decided before anything is told; the notices go just before ``response.created``,
        and not at all when the engine refuses the response (its one ``error`` is the answer)."""
        params = event.get("response")
        if params is not None and not isinstance(params, dict):
            raise ProtocolError("bad_event", "response must be an object", param="response")
        params = params or {}
        metadata = client_metadata(params.get("metadata"), param="response.metadata")
        config = self.projection.config
        overrides = response_overrides(
            params,
            output_modality=config.output_modality,
            instructions=config.instructions,
            max_output_tokens=config.max_output_tokens,
        )
        projection = self.projection
        # the notices are told just before response.created: a response.create the engine
        # refuses (one in progress, nothing to answer) gets that refusal alone
        notices = tuple(
            error_event(notice.code, notice.message, event_id=event_id, param=notice.param)
            for notice in overrides.notices
        )
        projection.creating = True
        projection.requested = RequestedResponse(metadata, overrides.output_modality, notices)
        try:
            await _command(self.session.create_response, event_id=event_id)
        finally:
            projection.creating, projection.requested = False, None

    async def _on_response_cancel(self, event: dict[str, Any], event_id: str | None) -> None:
        wanted = event.get("response_id")
        active = self.session.active
        if wanted is not None and active is not None and active.ref.response_id != wanted:
            raise ProtocolError(
                "response_cancel_not_active", f"response {str(wanted)[:80]!r} is not in progress", param="response_id"
            )
        # nothing in progress, whatever response_id it names: the engine's refusal, logged
        # CommandRejected as every refused command is, and its one error (D14)
        param = None if wanted is None else "response_id"
        await _command(self.session.cancel_response, event_id=event_id, param=param)

    async def _on_output_audio_buffer_clear(self, event: dict[str, Any], event_id: str | None) -> None:
        if not await _command(self.session.clear_output_audio, event_id=event_id):
            # the engine only replies False (serve's contract): GA's answer is the front's
            raise ProtocolError("response_cancel_not_active", "no response audio is playing to clear")
