"""What every Realtime scenario checks in the ledger after the wire (research §6.1)."""

from __future__ import annotations

from projections.shell.runner import project_as_of
from realtime.connection import RealtimeState
from tests.waiting import eventually


async def settled_ledger(state: RealtimeState, session_id: str) -> list[str | None]:
    """Once the session is closed and its connection has ended (the close, the pump and the
    socket all done): its turn-table finished_reasons, after checking that the audit is
    clean (no leaks) and that no port holds a live request id."""
    engine = state.engine

    def ended() -> bool:
        session = engine.sessions.get(session_id)
        serving = any(c.session is session for c in state.connections.values())
        return session is not None and session.closed and not serving

    await eventually(ended, timeout_s=15)
    p = await project_as_of(engine.store)
    assert p.leaks() == []
    assert all(port.live_request_ids() == set() for port in engine.ports)
    return [t.finished_reason for t in p.turn_tables if t.session_id == session_id]
