"""What every Realtime scenario checks in the ledger after the wire (research §6.1)."""

from __future__ import annotations

from projections.runner import project_as_of


async def settled_ledger(engine, session_id: str) -> list[str | None]:
    """The session's turn-table finished_reasons, once the audit is clean (no leaks) and no
    port holds a live request id."""
    p = await project_as_of(engine.store)
    assert p.leaks() == []
    assert all(port.live_request_ids() == set() for port in engine.ports)
    return [t.finished_reason for t in p.turn_tables if t.session_id == session_id]
