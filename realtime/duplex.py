"""vLLM-Omni's duplex dialect, opt-in per socket with ``?duplex=1`` (and offered by the server
with ``ConnectionOptions.extensions``).

Extension client events: ``barge_in`` (user speech over the response: log reason
``barge_in``, GA ``response.done`` reason ``turn_detected``), ``input.cancel`` (drop the input
and cancel the response: log reason ``cancel``), ``session.close`` (close the session, log
reason ``session_close``: ``session.closed`` then close code 1000). Extension server events:
``response.listen`` (the model keeps listening: no response) and ``session.closed``. None of
these names is a GA name; with the dialect off the client events get ``unknown_event`` and
none of the server events is sent. Their shapes are the models below (``extra="forbid"``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from realtime.protocol import GA_CLIENT_EVENTS, server_event

DUPLEX_CLIENT_EVENTS = frozenset({"barge_in", "input.cancel", "session.close"})
DUPLEX_SERVER_EVENTS = frozenset({"response.listen", "session.closed"})
assert not DUPLEX_CLIENT_EVENTS & GA_CLIENT_EVENTS  # never a GA name reused for an extension


class ResponseListen(BaseModel):
    """``response.listen``: the committed input was a listen-only unit (DOMAIN §2.2)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["response.listen"]
    event_id: str
    session_id: str
    turn_id: int


class SessionClosed(BaseModel):
    """``session.closed``: the session ended (``reason``: the log's close reason)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["session.closed"]
    event_id: str
    session_id: str
    reason: str


EXTENSION_MODELS: dict[str, type[BaseModel]] = {"response.listen": ResponseListen, "session.closed": SessionClosed}


def response_listen(session_id: str, turn_id: int) -> dict[str, Any]:
    return server_event("response.listen", session_id=session_id, turn_id=turn_id)


def session_closed(session_id: str, reason: str) -> dict[str, Any]:
    return server_event("session.closed", session_id=session_id, reason=reason)


CLOSE_REASON = "session_close"
"""The log reason of an extension ``session.close``, whatever ``reason`` the client gave: a
client's own word would map to ``cancel`` under DOMAIN §2.4, and never reaches the log."""
