"""The three projections composed into one pure, synchronous fold.

``Projector.apply(stored)`` runs the resources fold first; its verdict (refused duplicate
submits, old-fence forwards…) gates the turn-tables fold, so each rule exists once and a
refused event can never be double counted (CASE-02). No I/O, no clock.

Bounded memory, deterministically: closed sessions that hold nothing are forgotten by the fold
itself, at fixed log positions (before the first event at or past each multiple of
``SWEEP_EVERY``), never at a reader's batch boundary. The state after a prefix of the log is
therefore a function of the prefix alone: a fold resumed from a checkpoint taken at any cut,
a fold of disjoint session partitions merged (:mod:`projections.shell.parallel`) and one straight
fold agree, even for a session that gets a late event after it was forgotten (issue 12).

Where a sweep falls changes no table, metric or resource state, and no finding but one: a
forgotten session keeps its close point (D18) and its finalized responses (a reused response id
stays stale, DOMAIN §2.1), and a session is not forgotten while an abort still waits for a pool's
answer; a late *duplicate* ack of a session already forgotten reads as ``abort_of_unknown_id``,
as it does for an id retired long ago (R6). ``tests/projections/test_sweep_anywhere.py`` folds
every committed log with a sweep before every event and checks exactly that.
"""

from __future__ import annotations

from collections.abc import Iterable

from events.records import StoredEvent
from projections.findings import Finding
from projections.resources import ResourcesFold, SessionResources
from projections.turn_tables import TurnTables
from projections.turns import TurnsFold

SWEEP_EVERY = 4096
"""Log positions between two sweeps of forgettable closed sessions (see the module doc)."""


class Projector:
    """request_resources + stale-id audit + per-turn tables over one log."""

    def __init__(self, live: bool = False) -> None:
        """``live=True``: the session engine's own fold — sessions with log_stats off build no
        turn state (M14). Offline folds (the default) build every session's tables."""
        self.resources = ResourcesFold()
        self.turns = TurnsFold(live=live)
        self.position = 0
        self.turn_tables: list[TurnTables] = []

    def apply(self, stored: StoredEvent) -> bool:
        """Apply one event; returns the resources fold's verdict: False for an event it refused
        (DOMAIN §5.7 D9/D18: such a fact changes no state and counts nowhere)."""
        if stored.position // SWEEP_EVERY > self.position // SWEEP_EVERY:
            self.forget_closed()  # a sweep point was crossed (module doc)
        verdict = self.resources.apply(stored)
        self.turns.apply(stored, verdict.accepted)
        self.position = stored.position
        return verdict.accepted

    def apply_all(self, events: Iterable[StoredEvent]) -> Projector:
        for stored in events:
            self.apply(stored)
        self.turn_tables.extend(self.turns.take_finalized())
        return self

    def session_resources(self, session_id: str) -> SessionResources | None:
        """The resources fold's state of one session (None when the log has none of it)."""
        return self.resources.sessions.get(session_id)

    def sessions_resources(self) -> list[tuple[str, SessionResources]]:
        """Every session's resources state, by session id."""
        return sorted(self.resources.sessions.items())

    def findings(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        """Leaks and warnings at the current point (DOMAIN §4.2; see projections.findings)."""
        out = self.resources.evaluate(max_idle_s, as_of_ts) + list(self.turns.findings)
        return sorted(out, key=Finding.sort_key)

    def leaks(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        return [f for f in self.findings(max_idle_s, as_of_ts) if f.severity == "leak"]

    @classmethod
    def merged(cls, parts: Iterable[Projector]) -> Projector:
        """One projector from projectors that folded DISJOINT sets of sessions of the same log
        (projections.shell.parallel): per-session state is united, findings and turn tables are put
        back in log order, and the log-wide position and "now" (ts) come from the part that
        applied the log's last event. Equal to folding the whole log in one projector."""
        parts = list(parts)
        out = cls()
        end = max((p.position for p in parts), default=0)
        for part in parts:
            if end // SWEEP_EVERY > part.position // SWEEP_EVERY:
                part.forget_closed()  # the whole log crossed a sweep point after this part's last event
            out.resources.sessions.update(part.resources.sessions)
            out.resources.closed_sessions.update(part.resources.closed_sessions)
            out.turns.sessions.update(part.turns.sessions)
            out.turns.closed_responses.update(part.turns.closed_responses)
            out.resources.point_findings.extend(part.resources.point_findings)
            out.turns.findings.extend(part.turns.findings)
            out.turns.finalized.extend(part.turns.finalized)
            out.turn_tables.extend(part.turn_tables)
        out.resources.point_findings.sort(key=lambda f: f.last_position)  # stable: emission order
        out.turns.findings.sort(key=lambda f: f.last_position)
        if parts:
            last = max(parts, key=lambda p: p.position)
            out.position = last.position
            out.resources.position, out.resources.ts = last.resources.position, last.resources.ts
        return out

    def forget_closed(self) -> None:
        """Drop working state of closed sessions that hold nothing (bounded memory). Called by
        :meth:`apply` at the sweep points only: calling it anywhere else makes the state depend
        on where it was called (a late event of a forgotten session starts afresh)."""
        self.resources.forget_closed()
        self.turns.forget_closed()
