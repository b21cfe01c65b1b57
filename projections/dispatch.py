"""Typed dispatch of stored events to fold handlers (issue 13: one definition of each event).

A fold declares ``{EventClass: handler}``; :func:`dispatch_table` adds the event's read-side
twin (:mod:`events.structs`, the msgspec Struct a rebuild decodes rows into) under the same
handler, so the write path (pydantic models) and the read path (twins) run the same handler,
chosen by the event's class — never by a type-name string. Handlers take the concrete event
type: ``handler(session_state, stored, event)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from events.structs import twin_of
from events.types import EventBase

Handler = Callable[..., Any]


def dispatch_table(handlers: Mapping[type[EventBase], Handler]) -> dict[type, Handler]:
    """``handlers`` keyed by event class, plus each class's read-side twin."""
    table: dict[type, Handler] = {}
    for cls, handler in handlers.items():
        table[cls] = handler
        table[twin_of(cls)] = handler
    return table
