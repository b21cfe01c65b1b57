"""A session's metric record and the rollup fixed at its ``SessionClosed`` (the
``[DuplexSessionSummary]`` table): :class:`SessionTally`, :class:`Distribution`,
:class:`SessionRollup`, :func:`close_rollup`. Pure: no I/O."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from events.types import FINISHED_REASONS, SessionClosed
from projections.intervals import span_ms
from projections.metrics_families import UNKNOWN_MODEL


@dataclass(frozen=True)
class Distribution:
    """count / mean / p50 / p99 of a list of values (ms); None when empty. Percentiles are
    nearest-rank: the value at rank ceil(p/100 · count) of the sorted values."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0, None, None, None)
        ordered = sorted(values)

        def rank(p: float) -> float:
            return ordered[max(math.ceil(p / 100.0 * len(ordered)), 1) - 1]

        return cls(len(ordered), sum(ordered) / len(ordered), rank(50), rank(99))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p99": self.p99}


@dataclass(frozen=True)
class SessionRollup:
    """One closed session (fixed at its ``SessionClosed``): turns by finished reason (all six,
    DOMAIN §5.5), Stage0 TTFT and TPOT (``vllm_ttft_ms``, ``vllm_tpot_ms`` > 0 of its turn tables)
    and TTFP (:data:`FAMILIES` ``audio_ttfp_s``, in ms) as :class:`Distribution` s, listen units,
    ``session_wall_ms`` (open ts → close ts, wall clock; None when the open is not in the folded
    log) and the close reason. Leaked ids are read from the audit when it is rendered."""

    session_id: str
    model_name: str
    close_reason: str
    opened_ts: float | None
    closed_ts: float
    closed_position: int
    turns_by_reason: dict[str, int]
    ttft_ms: Distribution
    ttfp_ms: Distribution
    tpot_ms: Distribution
    listen_units: int
    session_wall_ms: float | None

    @property
    def turns(self) -> int:
        return sum(self.turns_by_reason.values())


@dataclass(slots=True)
class SessionTally:
    """One session incarnation's metric state (the fold's per-session record): its model,
    open ts, whether it holds an admitted slot, turns counted by finished reason, the Stage0
    TTFT/TPOT and TTFP values of its turns (ms), listen units, the turns that listened or
    answered, the responses counted, the (request_id, stage) segments still awaiting audio, the
    first audio outputs per request id, and the close reason while its slot is unsettled."""

    model_name: str = UNKNOWN_MODEL
    opened_ts: float | None = None
    admitted: bool = False
    reasons: Counter[str] = field(default_factory=Counter)
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    ttfp_ms: list[float] = field(default_factory=list)
    listen_units: int = 0
    listened_turns: set[int] = field(default_factory=set)
    answered_turns: set[int] = field(default_factory=set)
    counted_responses: set[str] = field(default_factory=set)
    audio_open: set[tuple[str, int]] = field(default_factory=set)  # (request_id, stage): segment awaiting audio
    audio_first: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # request_id -> (ts, stage)
    close_reason: str | None = None  # closed, slot not yet settled


def close_rollup(session_id: str, s: SessionTally, closed_position: int, e: SessionClosed) -> SessionRollup:
    """The rollup of session ``session_id`` fixed by its close ``e`` (stored at
    ``closed_position``). D17: a clock stepped back between open and close gives a wall time of
    0, never negative."""
    wall_ms = max(span_ms(s.opened_ts, e.ts), 0.0) if s.opened_ts is not None else None
    return SessionRollup(
        session_id=session_id,
        model_name=s.model_name,
        close_reason=e.reason,
        opened_ts=s.opened_ts,
        closed_ts=e.ts,
        closed_position=closed_position,
        turns_by_reason={r: s.reasons.get(r, 0) for r in FINISHED_REASONS},
        ttft_ms=Distribution.of(s.ttft_ms),
        ttfp_ms=Distribution.of(s.ttfp_ms),
        tpot_ms=Distribution.of(s.tpot_ms),
        listen_units=s.listen_units,
        session_wall_ms=wall_ms,
    )
