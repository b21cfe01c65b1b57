"""One fold of the log for ``tables --summary`` (issue 23 step 3): turn tables and session rollups.

A single pass of :class:`projections.metrics.MetricsFold` (its own :class:`Projector` inside)
over the stored events gives both the per-turn tables and the [DuplexSessionSummary] rollups,
so the log is read and folded once. A :class:`~projections.metrics.TallySink` takes the metric
updates: nothing here needs Prometheus or ``engine_bridge``. Needs neither vllm nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.chain_walk import ChainFault, chain_fault
from events.store.store import EventStore
from projections.metrics import MetricsFold, SessionRollup, TallySink
from projections.turn_tables import TurnTables


@dataclass
class SummaryFold:
    """What one fold of the log gives ``tables --summary``.

    ``turns``: the finalized turn tables in finalize order (as ``tables --until-position``
    folds them); ``rollups``: (rollup, leaked request ids sorted) per closed session, in close
    order; ``fault``: the first fault of the hash chain of the rows folded (None: intact)."""

    turns: list[TurnTables] = field(default_factory=list)
    rollups: list[tuple[SessionRollup, list[str]]] = field(default_factory=list)
    fault: ChainFault | None = None


async def summary_of(
    store: EventStore, session: str | None = None, until_position: int | None = None, max_idle_s: float = 30.0
) -> SummaryFold:
    """Fold ``store`` once up to ``until_position`` (default: its head). Rollups of ``session``
    only when given; leaks as the audit sees them at that point (``max_idle_s`` as
    ``audit --max-idle``). Raises what :meth:`EventStore.read_all` raises for unreadable rows."""
    head = await store.head_position()
    until = head if until_position is None else min(until_position, head)
    fold = MetricsFold(TallySink())
    out = SummaryFold(fault=await chain_fault(store, until))
    async for stored in store.read_all(0, until_position=until):
        out.turns.extend(fold.apply(stored))
    out.rollups = [
        (r, fold.leaked_ids_of(r.session_id, max_idle_s))
        for r in fold.rollups
        if session is None or r.session_id == session
    ]
    return out
