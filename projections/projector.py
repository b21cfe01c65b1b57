"""The three projections composed into one pure, synchronous fold.

``Projector.apply(stored)`` runs the resources fold first; its verdict (refused duplicate
submits, old-fence forwards…) gates the turn-tables fold, so each rule exists once and a
refused event can never be double counted (CASE-02). No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from events.records import StoredEvent

from projections.findings import Finding
from projections.resources import ResourcesFold
from projections.turn_tables import TurnTables
from projections.turns import TurnsFold


class Projector:
    """request_resources + stale-id audit + per-turn tables over one log."""

    def __init__(self) -> None:
        self.resources = ResourcesFold()
        self.turns = TurnsFold()
        self.position = 0
        self.turn_tables: list[TurnTables] = []

    def apply(self, stored: StoredEvent) -> None:
        verdict = self.resources.apply(stored)
        self.turns.apply(stored, verdict.accepted)
        self.position = stored.position

    def apply_all(self, events: Iterable[StoredEvent]) -> "Projector":
        for stored in events:
            self.apply(stored)
        self.turn_tables.extend(self.turns.take_finalized())
        return self

    def findings(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        """Leaks and warnings at the current point (DOMAIN §4.2; see projections.findings)."""
        out = self.resources.evaluate(max_idle_s, as_of_ts) + list(self.turns.findings)
        return sorted(out, key=Finding.sort_key)

    def leaks(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        return [f for f in self.findings(max_idle_s, as_of_ts) if f.severity == "leak"]

    def forget_closed(self) -> None:
        """Drop working state of closed sessions that hold nothing (bounded memory)."""
        self.resources.forget_closed()
        self.turns.forget_closed()
