"""Per-turn metric tables, built once at finalize (DOMAIN §5.1, §5.3 TX/RX, §5.4, §5.5).

:func:`build_turn_tables` is pure: the event fold (``projections.turns``) hands it what it
accumulated for one turn and gets back a frozen :class:`TurnTables`, which the renderers
(``reports.render_text``, ``reports.render_formats``) print. Units live in the names: ``_ms``
milliseconds, ``_s`` seconds, ``_ts`` wall-clock epoch seconds, ``_bytes`` bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from events.limits import derived
from projections.collapse import Segment, collapse_segments
from projections.intervals import span_ms
from projections.reasons import normalize_reason

PREPROCESS_TIMING_KEY = "preprocess_ms"
"""The ``pipeline_timings`` key read as the turn's input preprocess time (ms)."""


@dataclass(frozen=True)
class TransferEdge:
    """One connector edge ``from_stage -> to_stage`` of one turn (DOMAIN §5.1).

    ``size_bytes`` None = no size known (neither RX nor the TX delta reported one)."""

    from_stage: int
    to_stage: int
    size_bytes: int | None = None
    tx_time_ms: float = 0.0
    rx_decode_time_ms: float = 0.0
    in_flight_time_ms: float = 0.0
    used_shm: bool = False

    @property
    def edge(self) -> str:
        """Column label, e.g. ``"0->1"``."""
        return f"{self.from_stage}->{self.to_stage}"

    @property
    def total_time_ms(self) -> float:
        """tx + rx_decode + in_flight (the edge's share of ``transfers_total_time_ms``)."""
        return self.tx_time_ms + self.rx_decode_time_ms + self.in_flight_time_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "edge": self.edge,
            "from_stage": self.from_stage,
            "to_stage": self.to_stage,
            "size_bytes": self.size_bytes,
            "tx_time_ms": self.tx_time_ms,
            "rx_decode_time_ms": self.rx_decode_time_ms,
            "in_flight_time_ms": self.in_flight_time_ms,
            "used_shm": self.used_shm,
        }


JSON_RENAMES: dict[str, str] = {"audio_sample_rate": "audio_sample_rate_hz"}
"""Stage fields whose catalogue name lacks the unit; machine formats use the right-hand name."""


@dataclass(frozen=True)
class TurnTables:
    """Everything one turn's table set shows (DOMAIN §5.1/§5.2).

    * ``stages``: stage id -> collapsed row (``STAT_FIELDS`` -> value, None = not reported);
    * ``transfers``: edges in first-seen order;
    * ``e2e``: ``e2e_total_ms``, ``e2e_total_tokens``, ``transfers_total_time_ms``,
      ``transfers_total_bytes``;
    * ``summary``: Overall Summary keys in their print order (``input_preprocess_time_ms``
      only when a preprocess timing exists, then ``e2e_stage_<i>_wall_time_ms`` by stage);
    * ``preprocess_ms``: the summary's preprocess figure (lowest stage that has one) or None.
    """

    session_id: str
    response_id: str
    request_id: str | None
    turn_id: int
    finished_reason: str
    arrival_ts: float
    finalize_ts: float
    stages: Mapping[int, Mapping[str, Any]]
    transfers: tuple[TransferEdge, ...]
    e2e: Mapping[str, Any]
    summary: Mapping[str, Any]
    preprocess_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; units in the names (``audio_sample_rate`` -> ``audio_sample_rate_hz``,
        ``arrival_ts`` -> ``arrival_ts_s``). ``stages`` is a list sorted by ``stage_id``.
        ``request_id`` is None for a turn that ended before any engine request (D8). Every float
        except the ``_ts_s`` stamps is rounded to 3 decimals, as the text tables print it (ms to
        the µs: the values derive from integer microseconds, so 190 ms is ``190.0``, never
        ``189.9999999999995``)."""
        return {
            "session_id": self.session_id,
            "response_id": self.response_id,
            "request_id": self.request_id,
            "turn_id": self.turn_id,
            "finished_reason": self.finished_reason,
            "arrival_ts_s": self.arrival_ts,
            "finalize_ts_s": self.finalize_ts,
            "preprocess_ms": _json_value(self.preprocess_ms),
            "summary": {k: _json_value(v) for k, v in self.summary.items()},
            "e2e": {k: _json_value(v) for k, v in self.e2e.items()},
            "stages": [
                {"stage_id": sid, **{JSON_RENAMES.get(k, k): _json_value(v) for k, v in row.items()}}
                for sid, row in sorted(self.stages.items())
            ],
            "transfers": [{k: _json_value(v) for k, v in edge.to_dict().items()} for edge in self.transfers],
        }


JSON_DECIMALS = 3
"""Decimals of every float in the machine formats: the text tables' precision (DOMAIN §5.2)."""


def _json_value(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, JSON_DECIMALS)
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    return value


def _edges(
    stages: Mapping[int, Mapping[str, Any]],
    tx_delta: Mapping[tuple[int, int], tuple[float, int, bool]],
    edge_order: Sequence[tuple[int, int]],
    snapshot_stages: frozenset[int] | None = None,
) -> tuple[TransferEdge, ...]:
    """RX from each downstream stage k sets edge (k-1 -> k): its size once, from the first
    non-zero RX bytes (D3); a stage-k snapshot creates the edge even with no RX fields, size 0
    (D4). Then the TX delta is added (DOMAIN §5.3). Order: ``edge_order``, then TX-only edges,
    then RX-only edges, sorted. ``snapshot_stages`` None = every stage in ``stages`` reported."""
    # edge -> [size_bytes, tx_time_ms, rx_decode_time_ms, in_flight_time_ms, used_shm]
    edges: dict[tuple[int, int], list[Any]] = {}
    for sid, row in stages.items():  # any order: the edge order below sorts what it needs
        if sid < 1:
            continue
        rx_bytes, rx_decode, rx_flight = (
            row.get("rx_transfer_bytes"),
            row.get("rx_decode_time_ms"),
            row.get("rx_in_flight_time_ms"),
        )
        reported = snapshot_stages is None or sid in snapshot_stages
        if not (reported or any(v is not None and v > 0 for v in (rx_bytes, rx_decode, rx_flight))):
            continue
        size = rx_bytes if rx_bytes else (0 if reported else None)
        edges[(sid - 1, sid)] = [size, 0.0, float(rx_decode or 0.0), float(rx_flight or 0.0), False]
    for key, (tx_ms, size, shm) in tx_delta.items():
        edge = edges.get(key)
        if edge is None:
            edge = edges[key] = [None, 0.0, 0.0, 0.0, False]
        edge[1] = 0.0 + max(float(tx_ms), 0.0)  # (0.0 +: a -0.0 delta shows 0.0)
        edge[4] = bool(shm)
        if not edge[0] and size and size > 0:
            edge[0] = int(size)
    order = [k for k in dict.fromkeys(edge_order) if k in edges]
    if len(order) < len(edges):
        order += sorted(k for k in tx_delta if k not in order)
        order += sorted(k for k in edges if k not in order)
    return tuple(TransferEdge(a, b, *edges[(a, b)]) for a, b in order)


def _preprocess_ms(stages: Mapping[int, Mapping[str, Any]]) -> float | None:
    """The lowest stage's preprocess timing (``stages`` sorted by stage id)."""
    for row in stages.values():
        timings = row.get("pipeline_timings") or {}
        if timings.get(PREPROCESS_TIMING_KEY) is not None:
            return float(timings[PREPROCESS_TIMING_KEY])
    return None


@functools.lru_cache(maxsize=64)
def _wall_key(stage_id: int) -> str:
    return f"e2e_stage_{stage_id}_wall_time_ms"


def build_turn_tables(
    *,
    session_id: str,
    response_id: str,
    request_id: str | None,
    turn_id: int,
    finished_reason: str,
    arrival_ts: float,
    finalize_ts: float,
    segments: Mapping[int, Sequence[Segment]],
    stage_first_ts: Mapping[int, float],
    stage_last_ts: Mapping[int, float],
    tx_delta: Mapping[tuple[int, int], tuple[float, int, bool]],
    edge_order: Sequence[tuple[int, int]],
    num_stages: int | None = None,
    snapshot_stages: frozenset[int] | None = None,
) -> TurnTables:
    """Build one turn's tables (DOMAIN §5.3 TX/RX, §5.4 collapse, §5.5 e2e).

    * ``segments``: stage id -> that stage's segments in arrival order (snapshots, or a pending
      ``StageCollapse`` replayed at begin); stages with no segment get no column;
    * ``request_id``: the turn's engine id; None for a turn that ended before any engine
      request (D8: a JSON/CSV row, no text tables);
    * ``stage_first_ts`` / ``stage_last_ts``: wall-clock seconds per stage (first submit or
      receipt / last receipt); only stage ``num_stages - 1`` has its last ts raised to
      ``finalize_ts``, and no other stage stands in when it never reported (D2; ``num_stages``
      None = the highest stage present is the final one). Each stage's span is kept inside
      [arrival, finalize], so no stage wall time is negative or exceeds ``e2e_total_ms``;
    * ``snapshot_stages``: stages whose engine reported a snapshot (D4 edges; None = all);
    * ``tx_delta``: edge -> (tx_time_ms delta, size_bytes delta, used_shm) since begin; negative
      deltas count as 0; ``edge_order``: edges in first-seen order;
    * ``finished_reason`` outside the reason set becomes ``abort``.

    ``e2e_total_ms`` = (finalize_ts - arrival_ts) * 1000, 0 when the clock stepped back (D17); ``e2e_total_tokens`` = stage-0
    ``num_tokens_in`` + every stage's ``num_tokens_out``. Pure; raises nothing for empty input.
    """
    return turn_tables_from_rows(
        session_id=session_id,
        response_id=response_id,
        request_id=request_id,
        turn_id=turn_id,
        finished_reason=finished_reason,
        arrival_ts=arrival_ts,
        finalize_ts=finalize_ts,
        stages={sid: collapse_segments(segs) for sid, segs in sorted(segments.items()) if segs},
        stage_first_ts=stage_first_ts,
        stage_last_ts=stage_last_ts,
        tx_delta=tx_delta,
        edge_order=edge_order,
        num_stages=num_stages,
        snapshot_stages=snapshot_stages,
    )


def turn_tables_from_rows(
    *,
    session_id: str,
    response_id: str,
    request_id: str | None,
    turn_id: int,
    finished_reason: str,
    arrival_ts: float,
    finalize_ts: float,
    stages: dict[int, dict[str, Any]],
    stage_first_ts: Mapping[int, float],
    stage_last_ts: Mapping[int, float],
    tx_delta: Mapping[tuple[int, int], tuple[float, int, bool]],
    edge_order: Sequence[tuple[int, int]],
    num_stages: int | None = None,
    snapshot_stages: frozenset[int] | None = None,
) -> TurnTables:
    """:func:`build_turn_tables` given each stage's collapsed row (``stages``: stage id -> row,
    sorted by stage id; the turns fold keeps one running accumulator per stage and hands over
    its row). Pure; the rows become the tables' (not copied)."""
    transfers = _edges(stages, tx_delta, edge_order, snapshot_stages)
    e2e_total_ms = max(span_ms(arrival_ts, finalize_ts), 0.0)  # D17: a clock stepped back shows 0
    tokens = int((stages.get(0, {}).get("num_tokens_in") or 0) + sum(r["num_tokens_out"] or 0 for r in stages.values()))
    transfers_bytes = sum(e.size_bytes or 0 for e in transfers)
    e2e = {
        "e2e_total_ms": e2e_total_ms,
        "e2e_total_tokens": tokens,
        "transfers_total_time_ms": sum((e.total_time_ms for e in transfers), 0.0),
        "transfers_total_bytes": transfers_bytes,
    }
    preprocess = _preprocess_ms(stages)
    summary: dict[str, Any] = {
        "e2e_requests": 1,
        "e2e_wall_time_ms": e2e_total_ms,
        "e2e_total_tokens": tokens,
        "e2e_avg_time_per_request_ms": e2e_total_ms,
        "e2e_avg_tokens_per_s": derived(tokens * 1000.0 / e2e_total_ms if e2e_total_ms > 0 else 0.0, tokens),
    }
    if preprocess is not None:
        summary["input_preprocess_time_ms"] = preprocess
    wall_stages = sorted({*stage_first_ts, *stages})
    if num_stages is not None:
        final_stage: int | None = num_stages - 1
    else:
        final_stage = wall_stages[-1] if wall_stages else None
    lo, hi = min(arrival_ts, finalize_ts), max(arrival_ts, finalize_ts)
    for sid in wall_stages:
        first = stage_first_ts.get(sid, stage_last_ts.get(sid))
        last = stage_last_ts.get(sid, first)
        if sid == final_stage:
            last = finalize_ts if last is None else max(last, finalize_ts)
        if first is None or last is None:
            wall = 0.0
        else:
            first, last = min(max(first, lo), hi), min(max(last, lo), hi)
            wall = max(span_ms(first, last), 0.0)
        summary[_wall_key(sid)] = wall
    return TurnTables(
        session_id=session_id,
        response_id=response_id,
        request_id=request_id,
        turn_id=turn_id,
        finished_reason=normalize_reason(finished_reason),
        arrival_ts=arrival_ts,
        finalize_ts=finalize_ts,
        stages=stages,
        transfers=transfers,
        e2e=e2e,
        summary=summary,
        preprocess_ms=preprocess,
    )
