"""The turns fold's findings: point warnings (DOMAIN §5.7 D9: a fact that joins no turn, a stale
terminal, a begin after close...) and clocks that stepped back (D17), as
:class:`projections.findings.Finding` records."""

from __future__ import annotations

from events.records import StoredEvent
from projections.findings import Finding, severity_of

_CLOCK_STEPPED_BACK = severity_of("clock_stepped_back")


def warning(
    session_id: str, kind: str, stage_id: int | None, request_id: str | None, st: StoredEvent, detail: str
) -> Finding:
    """One warning of ``kind`` at the event ``st`` (its position and ts on both ends)."""
    position, ts = st.position, st.event.ts
    return Finding(
        session_id, stage_id, request_id, kind, position, ts, position, ts, (position,), detail, severity_of(kind)
    )


def clock_stepped_back(
    session_id: str,
    stage_id: int | None,
    response_id: str | None,
    start: tuple[int, float],
    end: tuple[int, float],
    what: str,
) -> Finding:
    """DOMAIN §5.7 D17: the span ``what`` between two wall-clock stamps, ``start`` and ``end``
    (position, ts), came out negative (the host's clock stepped back); it is shown and observed
    as 0; one warning naming both positions."""
    end_position, end_ts = end
    return Finding(
        session_id,
        stage_id,
        response_id,
        "clock_stepped_back",
        start[0],
        start[1],
        end_position,
        end_ts,
        tuple(sorted({start[0], end_position})),
        f"{what}: {start[1]!r} at position {start[0]} -> {end_ts!r} at position {end_position}; clamped to 0",
        _CLOCK_STEPPED_BACK,
    )
