"""Typed dispatch of stored events to fold handlers (issue 13: one definition of each event).

A fold declares ``{EventClass: handler}`` with the event's model class (the declaration, and
the handler's type for the checker); :func:`dispatch_table` keys each handler by the event's
struct (:mod:`events.structs`), the one shape every reader gets — read back from the log or
handed on live. One entry per event kind, chosen by the event's class, never by a type-name
string. Handlers take the concrete event: ``handler(session_state, stored, event)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from events.structs import struct_type
from events.types import EventBase

Handler = Callable[..., Any]


def dispatch_table(handlers: Mapping[type[EventBase], Handler]) -> dict[type, Handler]:
    """``handlers`` keyed by each event class's struct (one entry per kind)."""
    return {struct_type(cls): handler for cls, handler in handlers.items()}
