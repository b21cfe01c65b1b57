"""Realtime GA wire format: client-event parsing and server-event builders.

Client frames are JSON objects with a string ``type`` (OpenAI Realtime GA,
``openai.types.realtime.RealtimeClientEvent``); anything else is a :class:`ProtocolError`,
answered with the GA error envelope ``{type: "error", event_id, error: {type, code, message,
param, event_id}}`` and never a closed socket (research/realtime.md §5.5). Server events carry
GA names only (never the beta ``response.text.delta`` / ``response.audio.delta``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import secrets
from typing import Any

import msgspec

from events import ids

MAX_EVENT_BYTES = 15 * 2**20
"""GA's limit on one client event (an ``input_audio_buffer.append`` of at most 15 MiB)."""

GA_CLIENT_EVENTS = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)
"""Every client event type of the GA union (``realtime_client_event.py``)."""

SUPPORTED_CLIENT_EVENTS = GA_CLIENT_EVENTS - {
    "conversation.item.truncate",
    "conversation.item.delete",
    "conversation.item.retrieve",
}
"""The GA client events this front answers; the rest get ``unsupported_event``."""

SERVER_ERROR_CODES = frozenset(
    {"runtime_append_failed", "cleanup_failed", "engine_dead", "stage_error", "internal_error", "engine_closed"}
)
RATE_LIMIT_CODES = frozenset({"max_sessions_reached"})


def error_type_for(code: str) -> str:
    """The GA error ``type`` bucket of a code: ``rate_limit_error`` (admission),
    ``server_error`` (the server's or engine's fault), else ``invalid_request_error``."""
    if code in RATE_LIMIT_CODES:
        return "rate_limit_error"
    if code in SERVER_ERROR_CODES:
        return "server_error"
    return "invalid_request_error"


class ProtocolError(Exception):
    """A client event the front refuses before it reaches the engine: ``code`` (wire error
    code), ``message``, ``param`` (the offending field's path, GA ``error.param``)."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id  # the client's, when the frame was an object that named one


def storable_text(value: str, *, param: str) -> str:
    """``value`` when the ledger can store it (UTF-8 without lone surrogates, DOMAIN D12);
    raises ProtocolError ``invalid_input`` naming ``param`` otherwise, so a multi-part item is
    refused before any part of it is appended."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProtocolError(
            "invalid_input", f"{param} cannot be stored as UTF-8 (a lone surrogate at index {exc.start})", param=param
        ) from None
    return value


_rng = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _rng.seed(secrets.randbits(128)))
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
_FAST_ENCODER = msgspec.json.Encoder()


def new_event_id() -> str:
    """A server ``event_id``: ``event_`` and 32 hex digits, random (GA does not constrain the
    format). From a PRNG seeded from the OS at import: unique, not secret; ``uuid4`` cost a
    system call per server event. The 32 digits are 16 random bytes' hex (≈ 0.3 µs less than
    formatting a 128-bit integer, on every server event; issue 23)."""
    return "event_" + _rng.randbytes(16).hex()


def server_event(type_: str, **fields: Any) -> dict[str, Any]:
    """One server event: ``{"event_id": ..., "type": type_, **fields}``."""
    return {"event_id": new_event_id(), "type": type_, **fields}


def error_event(code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The GA error envelope; ``event_id`` is the client event's id that caused it (echoed)."""
    error = {"type": error_type_for(code), "code": code, "message": message, "param": param, "event_id": event_id}
    return server_event("error", error=error)


_ENGINE_REQUEST_ID = re.compile(
    rf"(?P<word>\brequest\s+)?(?P<quote>['\"]?){re.escape(ids.PREFIX)}(?:\.[A-Za-z0-9_-]+)+(?P=quote)"
)
"""An engine request id in a message (DOMAIN §1: ``duplex-s.<S>.i.<I>.e.<E>.r.<ROLE>``, and the
legacy 6-part form), quoted or not, with the word ``request`` before it when there is one."""


def client_message(message: str, response_id: str | None) -> str:
    """An engine error's ``message`` as a client is told it: every engine request id (an
    internal id, DOMAIN §1) is replaced by the client-facing id of what failed, the
    ``response_id`` when the error is the failure of that response's turn (``request 'ID'``
    -> ``request of response 'resp_…'``), else by no id at all (``request``, ``an engine
    request``). Client error events name client-facing ids only (item, response, event ids),
    as OpenAI's server does; the ledger's ``CommandRejected`` keeps the engine's own text."""

    def rename(match: re.Match[str]) -> str:
        owner = None if response_id is None else f"response {response_id!r}"
        if match["word"]:
            return "request" if owner is None else f"request of {owner}"
        return "an engine request" if owner is None else f"the request of {owner}"

    return _ENGINE_REQUEST_ID.sub(rename, message) if ids.PREFIX in message else message


def client_event_id(event: dict[str, Any]) -> str | None:
    """The client's ``event_id`` when it is a string (echoed in errors), else None."""
    value = event.get("event_id")
    return value if isinstance(value, str) else None


class _NotJsonConstant(ValueError):
    """``NaN``/``Infinity``/``-Infinity`` met while parsing a client frame."""


def _refuse_constant(token: str) -> Any:
    raise _NotJsonConstant(token)


def _finite_float(token: str) -> float:
    """A JSON number with a fraction or exponent as a float; one beyond a double's range
    (``1e309``, read as infinity) is refused as the tokens are."""
    value = float(token)
    if not math.isfinite(value):
        raise _NotJsonConstant(f"{token[:40]} (beyond a double's range)")
    return value


def parse_client_event(frame: str | bytes, *, max_bytes: int = MAX_EVENT_BYTES) -> dict[str, Any]:
    """A client frame -> its JSON object. Raises ProtocolError ``event_too_large`` (over
    ``max_bytes``), ``invalid_json`` (not JSON / not UTF-8; ``NaN``, ``Infinity`` and
    ``-Infinity``, which Python's parser takes but RFC 8259 §6 has no token for, and a number
    beyond a double's range), ``bad_event``
    (not an object, or no string ``type``; param ``type``)."""
    size = len(frame) if isinstance(frame, bytes) else len(frame.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ProtocolError("event_too_large", f"event of {size} bytes is over the limit of {max_bytes} bytes")
    try:
        event = json.loads(frame, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJsonConstant as exc:
        raise ProtocolError("invalid_json", f"the frame is not JSON: {exc} is not a JSON value (RFC 8259 §6)") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"the frame is not JSON: {type(exc).__name__}") from None
    if not isinstance(event, dict):
        raise ProtocolError("bad_event", f"an event must be a JSON object, not {type(event).__name__}")
    if not isinstance(event.get("type"), str):
        raise ProtocolError(
            "bad_event", "the event has no string 'type'", param="type", event_id=client_event_id(event)
        )
    return event


def dumps(event: dict[str, Any]) -> str:
    """A server event as one JSON text frame (compact; non-ASCII escaped, so even a lone
    surrogate a client sent can never make a frame that is not UTF-8).

    Encoded with msgspec (≈ 0.2 µs a delta event against the stdlib encoder's ≈ 2, issue 23);
    an event whose text is not all ASCII (non-ASCII or a lone surrogate), or that msgspec
    refuses, goes through the stdlib encoder, so such frames stay byte for byte what they were.
    ASCII frames carry the same values; only the spelling of a float exponent (``1e-05`` ->
    ``0.00001``) and of DEL (``\u007f`` -> the raw character) can differ, as JSON allows."""
    try:
        frame = _FAST_ENCODER.encode(event)
    except Exception:  # noqa: BLE001 - a lone surrogate, an unsupported value: the stdlib's answer
        return _ENCODER.encode(event)
    return frame.decode("ascii") if frame.isascii() else _ENCODER.encode(event)
