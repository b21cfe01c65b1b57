"""Small event factories for store tests."""

from __future__ import annotations

from events.types import EventBase, ResponseBegun, TurnCommitted


def turn(stream: str, n: int, ts: float = 1757000000.0) -> EventBase:
    return TurnCommitted(session_id=stream, ts=ts + n / 1000, turn_id=n)


def turns(stream: str, count: int, start: int = 0) -> list[EventBase]:
    return [turn(stream, start + i) for i in range(count)]


def begun(stream: str, response_id: str, ts: float = 120.010) -> EventBase:
    return ResponseBegun(session_id=stream, ts=ts, response_id=response_id)
