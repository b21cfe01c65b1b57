"""The ``[DuplexSessionSummary]`` rollup of a closed session (issue 16), as text and JSON.

Built from :class:`projections.metrics.SessionRollup` (figures fixed at ``SessionClosed``) and
the request ids the audit holds as leaked for the session. Text: a ``[title]`` line and the grid
of :mod:`reports.render_text` (``Field | Value``), rows in a fixed order, every row shown except
the mean/p50/p99 of an empty distribution. Units in the names: ``_ms`` milliseconds (wall clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from events.types import FINISHED_REASONS
from projections.metrics import Distribution, SessionRollup
from reports.render_text import Table, format_cell, render_table

DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    ("vllm_ttft_ms", "ttft_ms"),
    ("audio_ttfp_ms", "ttfp_ms"),
    ("vllm_tpot_ms", "tpot_ms"),
)
"""(printed name, SessionRollup attribute) of the three latency distributions."""


def _distribution_rows(name: str, d: Distribution) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [(f"{name}_count", d.count)]
    rows += [(f"{name}_{k}", v) for k, v in (("mean", d.mean), ("p50", d.p50), ("p99", d.p99)) if v is not None]
    return rows


def summary_rows(r: SessionRollup, leaked_ids: Sequence[str]) -> list[tuple[str, Any]]:
    """(field, raw value) in print order."""
    rows: list[tuple[str, Any]] = [("turns_total", r.turns)]
    rows += [(f"turns_{reason}", r.turns_by_reason.get(reason, 0)) for reason in FINISHED_REASONS]
    for name, attr in DISTRIBUTIONS:
        rows += _distribution_rows(name, getattr(r, attr))
    rows += [
        ("listen_units", r.listen_units),
        ("session_wall_ms", r.session_wall_ms),
        ("request_ids_leaked", len(leaked_ids)),
    ]
    rows += [("leaked_request_id", rid) for rid in leaked_ids]
    return [(k, v) for k, v in rows if v is not None]


def summary_table(r: SessionRollup, leaked_ids: Sequence[str]) -> Table:
    title = f"DuplexSessionSummary [session={r.session_id} reason={r.close_reason} model={r.model_name}]"
    return Table(title, ("Value",), tuple((k, (format_cell(v),)) for k, v in summary_rows(r, leaked_ids)))


def render_summaries_text(rollups: Iterable[tuple[SessionRollup, Sequence[str]]]) -> str:
    """One ``[DuplexSessionSummary …]`` table per (rollup, leaked ids), each ending with a newline."""
    return "".join(render_table(summary_table(r, leaked)) + "\n" for r, leaked in rollups)


def summary_to_dict(r: SessionRollup, leaked_ids: Sequence[str]) -> dict[str, Any]:
    """JSON row of one rollup: ``turns`` by reason (and ``total``), the three distributions as
    ``{count, mean, p50, p99}`` (ms; null when empty), ``listen_units``, ``session_wall_ms``,
    ``leaked_request_ids``."""
    return {
        "session_id": r.session_id,
        "model_name": r.model_name,
        "close_reason": r.close_reason,
        "opened_ts_s": r.opened_ts,
        "closed_ts_s": r.closed_ts,
        "turns": {"total": r.turns, **{reason: r.turns_by_reason.get(reason, 0) for reason in FINISHED_REASONS}},
        **{name: getattr(r, attr).to_dict() for name, attr in DISTRIBUTIONS},
        "listen_units": r.listen_units,
        "session_wall_ms": r.session_wall_ms,
        "leaked_request_ids": list(leaked_ids),
    }


def render_json_with_sessions(turns: Iterable[Any], sessions: Iterable[tuple[SessionRollup, Sequence[str]]]) -> str:
    """The ``tables --format json`` document (:func:`reports.render_formats.render_json`) with a
    ``sessions`` list of :func:`summary_to_dict` rows after ``turns``."""
    import json

    from reports.overflow import json_row
    from reports.render_formats import JSON_FORMAT, JSON_VERSION

    doc = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "turns": [json_row(t.to_dict()) for t in turns],
        "sessions": [json_row(summary_to_dict(r, leaked)) for r, leaked in sessions],
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
