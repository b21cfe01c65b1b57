"""Per-connection projection: the engine's :class:`~engine_bridge.messages.ClientEvent` stream
-> GA Realtime server events (research/realtime.md §5.3).

State kept per connection: the effective :class:`SessionConfig`, the causes of the commits the
front asked for (a buffer commit or a ``conversation.item.create``, in order) and the active
response with its open content part. An engine ``error`` carries the client's ``event_id``
itself (research G5). Ids are DERIVED, not random, so a replay of the log could
rebuild the wire stream: a user item is ``item_<session>_i<incarnation>_u<n>`` (n-th commit of
the connection), an assistant item ``item_<response_id>``; a response's id is the ledger's
``response_id``. Server ``event_id``s are random.

One terminal event per response (DOMAIN §5.7 D14): every ``response.created`` gets exactly one
``response.done``; nothing of that response is sent after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from decider import PortFailure
from engine_bridge.messages import ClientEvent
from realtime import duplex
from realtime.audio import encode_audio, render_output_audio
from realtime.protocol import client_message, error_event, error_type_for, new_event_id, server_event
from realtime.session_config import SessionConfig, session_object
from realtime.usage import response_usage


@dataclass
class CommitCause:
    """What made the front commit: ``kind`` ``buffer`` (input_audio_buffer.commit) or ``item``
    (conversation.item.create, its GA ``content`` parts); for audio the transcript the thinker
    heard (None: none was available) and the seconds of audio."""

    kind: str
    content: list[dict[str, Any]]
    has_audio: bool = False
    transcript: str | None = None
    audio_s: float = 0.0


@dataclass
class ActiveResponse:
    response_id: str
    item_id: str
    modality: str
    text: list[str] = field(default_factory=list)
    audio_bytes: int = 0
    metadata: dict[str, str] | None = None  # the client's (response.create's response.metadata)
    where: dict[str, Any] = field(default_factory=dict)  # its content part's address, built once
    delta_type: str = "response.output_text.delta"  # the GA name of its text deltas

    def __post_init__(self) -> None:
        self.where = {"response_id": self.response_id, "item_id": self.item_id, "output_index": 0, "content_index": 0}
        if self.modality != "text":
            self.delta_type = "response.output_audio_transcript.delta"


@dataclass(frozen=True)
class RequestedResponse:
    """What the ``response.create`` being decided asks of the response it creates (set by the
    client-event side, taken by the first ``response.created``): the client's ``metadata``, the
    ``output_modality`` (the client's or the session's) and the ``notices`` (``error`` events
    :data:`realtime.request_fields.FIXED_BY_SERVER`) sent just before ``response.created``."""

    metadata: dict[str, str] | None
    output_modality: str
    notices: tuple[dict[str, Any], ...] = ()


_UNSEEN: Any = object()  # Projection._handlers: an engine event type not looked up yet

#: A response's GA terminal status from the log's finished_reason (and the engine's wire reason).
CANCEL_REASON = {"barge_in": "turn_detected", "cancel": "client_cancelled"}

UNTRANSCRIBED_INPUT = (
    "the committed audio has no transcript, so there is no input to answer: this server has no speech "
    "recognizer and hears audio only through its transcript (an input_audio content part's 'transcript' "
    "in conversation.item.create, or the 'transcript' key of input_audio_buffer.append)"
)
"""The message of ``input_audio_buffer_empty`` for a ``response.create`` after a commit of audio
without transcript (``conversation.item.input_audio_transcription.failed``): the engine's own
text ("no committed input", kept in the ledger's ``CommandRejected``) would hide the cause."""

SERVER_METADATA_KEYS = frozenset({"finished_reason", "finish_reason", "wire_reason"})
"""The ``response.done`` metadata keys that say how a response ended: the server's alone. A
client's ``response.create`` metadata under one of them is dropped from ``response.done`` even
when this ending does not set that key (a cancel sets no ``finish_reason``), so a client value
never reads as the server's account."""

TURN_FAILURE_CODES = frozenset(failure.code for failure in PortFailure)
"""The ``error`` codes of a turn whose stage port refused or lost its request (``FailTurn``):
the request an engine message names is then the open response's."""


class Projection:
    """ClientEvent -> GA server events for one connection (see the module docstring)."""

    def __init__(self, config: SessionConfig, *, duplex_dialect: bool = False) -> None:
        self.config = config
        self.duplex = duplex_dialect
        self.commits = 0
        self.last_item_id: str | None = None
        self.causes: deque[CommitCause] = deque()
        self.active: ActiveResponse | None = None
        self.finished: set[str] = set()
        self.last_error: dict[str, Any] | None = None
        self.creating = False  # a response.create is being decided (set by the client-event side)
        self.requested: RequestedResponse | None = None  # what that response.create asks of its response
        self.untranscribed = False  # the last commit was audio without transcript, no response since
        self._handlers: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]] | None] = {}

    # ------------------------------------------------------------------ engine events
    def project(self, event: ClientEvent) -> list[dict[str, Any]]:
        """The GA (and, with the dialect, extension) server events for one engine event."""
        handler = self._handlers.get(event.type, _UNSEEN)
        if handler is _UNSEEN:  # looked up once per engine event type
            handler = self._handlers[event.type] = getattr(self, "_on_" + event.type.replace(".", "_"), None)
        return handler(event.data) if handler is not None else []

    def _on_session_created(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        self.config = replace(self.config, incarnation=int(data.get("incarnation", 0)))
        return [server_event("session.created", session=session_object(self.config))]

    def _on_input_audio_buffer_committed(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        cause = self.causes.popleft() if self.causes else CommitCause("buffer", [{"type": "input_audio"}], True)
        self.commits += 1
        c = self.config
        item_id = f"item_{c.session_id}_i{c.incarnation}_u{self.commits}"
        previous, self.last_item_id = self.last_item_id, item_id
        out: list[dict[str, Any]] = []
        if cause.kind == "buffer":
            out.append(server_event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous))
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": cause.content,
        }
        out += [
            server_event("conversation.item.added", item=item, previous_item_id=previous),
            server_event("conversation.item.done", item=item, previous_item_id=previous),
        ]
        self.untranscribed = cause.has_audio and not cause.transcript
        if cause.has_audio:
            if cause.transcript:
                out.append(
                    server_event(
                        "conversation.item.input_audio_transcription.completed",
                        item_id=item_id,
                        content_index=0,
                        transcript=cause.transcript,
                        usage={"type": "duration", "seconds": round(cause.audio_s, 3)},
                    )
                )
            else:
                out.append(
                    server_event(
                        "conversation.item.input_audio_transcription.failed",
                        item_id=item_id,
                        content_index=0,
                        error={
                            "type": "invalid_request_error",
                            "code": "transcript_unavailable",
                            "message": "no transcript for this audio (item transcript, transcriber or "
                            "append 'transcript'); it was recorded as non-speech",
                        },
                    )
                )
        return out

    def _on_input_audio_buffer_cleared(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        return [server_event("input_audio_buffer.cleared")]

    def _on_response_listen(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.duplex:
            return []
        return [duplex.response_listen(self.config.session_id, int(data.get("turn_id", 0)))]

    def _on_response_created(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        response_id = data["response_id"]
        requested, self.requested, self.untranscribed = self.requested, None, False
        modality = requested.output_modality if requested is not None else self.config.output_modality
        r = self.active = ActiveResponse(response_id, f"item_{response_id}", modality)
        notices: tuple[dict[str, Any], ...] = ()
        if requested is not None:
            r.metadata, notices = requested.metadata, requested.notices
        item = self._assistant_item(r, "in_progress", content=[])
        previous, self.last_item_id = self.last_item_id, r.item_id
        part = {"type": "text", "text": ""} if modality == "text" else {"type": "audio", "transcript": ""}
        response = {
            "id": response_id,
            "object": "realtime.response",
            "status": "in_progress",
            "output": [],
            "output_modalities": [modality],
            "max_output_tokens": self.config.max_output_tokens,
        }
        if r.metadata is not None:
            response["metadata"] = r.metadata
        return [
            *notices,
            server_event("response.created", response=response),
            server_event("response.output_item.added", response_id=response_id, output_index=0, item=item),
            server_event("conversation.item.added", item=item, previous_item_id=previous),
            server_event("response.content_part.added", part=part, **self._where(r)),
        ]

    def _live(self, data: dict[str, Any]) -> ActiveResponse | None:
        r = self.active
        return r if r is not None and r.response_id == data.get("response_id") else None

    def _on_response_text_delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        r = self._live(data)
        delta = data.get("delta")
        if r is None or not delta:
            return []
        r.text.append(delta)
        return [{"event_id": new_event_id(), "type": r.delta_type, "delta": delta, **r.where}]

    def _on_response_audio_delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        r = self._live(data)
        if r is None or r.modality != "audio":
            return []
        pcm = render_output_audio(int(data["frames"]))
        r.audio_bytes += len(pcm)
        return [server_event("response.output_audio.delta", delta=encode_audio(pcm), **self._where(r))]

    def _on_response_done(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        r = self._live(data)
        if r is None:
            return []
        reason, finish_reason = data.get("reason", "stop"), data.get("finish_reason")
        metadata = {"finished_reason": str(reason), "finish_reason": str(finish_reason)}
        counts = data.get("token_counts")
        if reason == "stop":
            if finish_reason == "length":
                incomplete = {"type": "incomplete", "reason": "max_output_tokens"}
                return self._finish(r, "incomplete", incomplete, metadata, counts)
            return self._finish(r, "completed", None, metadata, counts)
        error = self.last_error or {"type": "server_error", "code": f"response_{reason}", "message": str(reason)}
        details = {
            "type": "failed",
            "error": {"type": error["type"], "code": error.get("code"), "message": error.get("message")},
        }
        if reason == "abort":
            details["error"] = {"type": "server_error", "code": "engine_aborted", "message": "the engine ended it"}
        return self._finish(r, "failed", details, metadata, counts)

    def _on_response_cancelled(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        r = self._live(data)
        if r is None:
            return []
        reason, wire = data.get("finished_reason", "cancel"), data.get("reason", "")
        metadata = {"finished_reason": str(reason), "wire_reason": str(wire)}
        counts = data.get("token_counts")
        if reason in CANCEL_REASON:
            cleared = []  # the client's output_audio_buffer.clear: told before the response's terminal event
            if wire == "output_audio_buffer_clear":
                cleared = [server_event("output_audio_buffer.cleared", response_id=r.response_id)]
            return cleared + self._finish(
                r, "cancelled", {"type": "cancelled", "reason": CANCEL_REASON[reason]}, metadata, counts
            )
        if wire == duplex.CLOSE_REASON:  # the client's own session.close
            cancelled = {"type": "cancelled", "reason": "client_cancelled"}
            return self._finish(r, "cancelled", cancelled, metadata, counts)
        error = {"type": "server_error", "code": "session_closed", "message": f"the session closed ({wire})"}
        return self._finish(r, "failed", {"type": "failed", "error": error}, metadata, counts)

    def _on_error(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The GA ``error``; its message names client-facing ids only (:func:`client_message`:
        a turn failure's engine request id becomes the open response's id)."""
        code = str(data.get("code", "internal_error"))
        failed = self.active.response_id if self.active is not None and code in TURN_FAILURE_CODES else None
        message = client_message(str(data.get("message", "")), failed)
        if code == "input_audio_buffer_empty" and self.creating and self.untranscribed:
            message = UNTRANSCRIBED_INPUT
        event = error_event(code, message, event_id=data.get("event_id"), param=data.get("param"))
        self.last_error = {"type": error_type_for(code), "code": code, "message": event["error"]["message"]}
        return [event]

    def _on_session_closed(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.duplex:
            return []
        return [duplex.session_closed(self.config.session_id, str(data.get("reason", "")))]

    # ------------------------------------------------------------------ helpers
    def _where(self, r: ActiveResponse) -> dict[str, Any]:
        return r.where  # spread (**) by every caller, never changed

    def _content(self, r: ActiveResponse) -> list[dict[str, Any]]:
        text = "".join(r.text)
        if r.modality == "text":
            return [{"type": "output_text", "text": text}]
        return [{"type": "output_audio", "transcript": text}]

    def _assistant_item(self, r: ActiveResponse, status: str, *, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": r.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _finish(
        self,
        r: ActiveResponse,
        status: str,
        details: dict[str, Any] | None,
        metadata: dict[str, str],
        token_counts: object = None,
    ) -> list[dict[str, Any]]:
        """Close the open content part and item, then the response's one ``response.done``. Its
        ``metadata`` is the client's (response.create's) merged with the server's ``metadata``
        keys (``finished_reason``, ``finish_reason`` / ``wire_reason``): a client key among
        :data:`SERVER_METADATA_KEYS` is dropped, so those keys always say what happened. Its
        ``usage`` is :func:`realtime.usage.response_usage` of the engine's ``token_counts``."""
        self.active = None
        self.finished.add(r.response_id)
        self.last_error = None
        text, where = "".join(r.text), self._where(r)
        if r.modality == "text":
            out = [server_event("response.output_text.done", text=text, **where)]
            part = {"type": "text", "text": text}
        else:
            out = [
                server_event("response.output_audio_transcript.done", transcript=text, **where),
                server_event("response.output_audio.done", **where),
            ]
            part = {"type": "audio", "transcript": text}
        item = self._assistant_item(r, "completed" if status == "completed" else "incomplete", content=self._content(r))
        out += [
            server_event("response.content_part.done", part=part, **where),
            server_event("response.output_item.done", response_id=r.response_id, output_index=0, item=item),
            server_event("conversation.item.done", item=item),
        ]
        response: dict[str, Any] = {
            "id": r.response_id,
            "object": "realtime.response",
            "status": status,
            "output": [item],
            "output_modalities": [r.modality],
            "max_output_tokens": self.config.max_output_tokens,
            "metadata": {**_client_keys(r.metadata), **metadata} if r.metadata else metadata,
        }
        if details is not None:
            response["status_details"] = details
        usage = response_usage(token_counts)
        if usage is not None:
            response["usage"] = usage
        out.append(server_event("response.done", response=response))
        return out


def _client_keys(metadata: dict[str, str]) -> dict[str, str]:
    """The client's ``metadata`` without the keys the server alone sets (:data:`SERVER_METADATA_KEYS`)."""
    return {key: value for key, value in metadata.items() if key not in SERVER_METADATA_KEYS}
