"""Opening a Realtime socket's session: the query of ``/v1/realtime`` and the engine's
``open_session``, waiting for a previous connection of the same session id that is still
closing (a client reconnecting right after a drop).

Query parameters: ``model``, ``session_id`` (default ``sess_<uuid hex>``), ``mode``
(``response_required`` | ``auto_response``), ``resumable`` (0|1), ``duplex`` (0|1).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine_bridge.messages import SessionError
from engine_bridge.plugin import TextPlugin
from engine_bridge.session import Session
from realtime.protocol import ProtocolError

if TYPE_CHECKING:
    from engine_bridge.engine import SessionEngine

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""A session id from the wire: no markup, no path separator, no space ever reaches the ledger
or the tools that render it."""
OPEN_REFUSAL_CLOSE_CODE = {"max_sessions_reached": 1013, "engine_closed": 1013}
"""The close code of an open the engine refused, by its error code (1008 otherwise)."""


class QueryOptions(Protocol):
    """What :func:`parse_query` reads of the server's options."""

    @property
    def model_name(self) -> str: ...


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


def parse_query(query: dict[str, str], options: QueryOptions) -> OpenParams:
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


class StillClosing(Exception):
    """The open waited ``reopen_wait_s`` for the previous connection of its id to close."""


class Holder(Protocol):
    """A live connection as the open sees it: the session id it opened and whether its
    shutdown began (``closing``) and is over (``ended``)."""

    session_id: str | None
    closing: bool
    ended: asyncio.Event


def closing_holder(connections: Iterable[Holder], session_id: str, me: object) -> Holder | None:
    """Another connection of ``session_id`` than ``me`` that is shutting down (its close not
    settled)."""
    for other in list(connections):
        if other is not me and other.session_id == session_id and other.closing and not other.ended.is_set():
            return other
    return None


async def open_session(
    engine: SessionEngine,
    params: OpenParams,
    *,
    connection_id: str,
    connections: Mapping[str, Holder],
    me: object,
    reopen_wait_s: float,
) -> Session:
    """``engine.open_session`` for ``params``, once no previous connection of the same id is
    still closing. A client reconnecting a few ms after a drop finds the old connection's
    close unsettled (its aborts in flight, its last results not yet in the log): the open
    waits for that close, at most ``reopen_wait_s``, so it is neither refused
    ``session_exists`` nor started beside a close that still writes the stream; then it
    opens the next incarnation. Raises StillClosing past the bound, SessionError as
    ``open_session`` does otherwise."""
    waited = False
    while True:
        previous = None if waited else closing_holder(connections.values(), params.session_id, me)
        if previous is not None:
            waited = True
            try:
                await asyncio.wait_for(previous.ended.wait(), reopen_wait_s)
            except TimeoutError:
                raise StillClosing(
                    f"session {params.session_id!r}: its previous connection is still closing "
                    f"after {reopen_wait_s:g} s; retry"
                ) from None
        try:
            return await engine.open_session(
                params.session_id,
                auto_response=params.mode == "auto_response",
                plugin=TextPlugin(resumable=params.resumable),
                protocol="realtime+duplex" if params.duplex else "realtime",
                connection_id=connection_id,
            )
        except SessionError as exc:
            # the old connection saw its socket drop while this open ran: wait for it once
            if (
                exc.code != "session_exists"
                or waited
                or closing_holder(connections.values(), params.session_id, me) is None
            ):
                raise
