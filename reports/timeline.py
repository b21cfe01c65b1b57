"""A session's timeline as one self-contained HTML page, drawn with plotly (issue 16).

:func:`timeline_figure` lays one session's stored events on a time axis (seconds since the
session's first event, wall clock: every x is an event ``ts``) with one lane per kind of fact:

* ``user`` — input appended (speech, silence, text) and commits (``TurnCommitted``);
* ``response`` — each response from its arrival to its finalize (colour = finished reason);
* ``stage <i>`` — each response's span on stage i from its first to its last token-carrying
  ``StageOutput`` (the turn's engine id, inside arrival … finalize);
* ``listen`` — listen-only units (``ResponseListened``);
* ``cleanup`` — ``AbortRequested`` and each pool's ``AbortResult`` (ok / failed), releases;
* ``session`` — open, close and ``EpochAdvanced``;
* ``audit`` — leaks and warnings of the audit (DOMAIN §4.2, D9) at their first position.

Hover shows the event type, its log position, ts and its main fields. Every text from the log
(ids, model text, reasons, details, the title's session id) goes through
:func:`reports.escape.html_text`: plotly reads tags and entities in its strings, so a session id
``<a href=…>`` shows as text, and controls and bidi overrides show as ``\\uNNNN``; the JSON plotly
embeds in ``<script>`` escapes ``<``, ``>`` and ``/`` itself. :func:`write_timeline`
writes the page with plotly.js inline (``include_plotlyjs=True``): no network at view time, so
it opens from a copied file. Needs neither vllm nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import plotly.graph_objects as go

from events.records import StoredEvent
from events.structs import struct_type
from events.types import (
    AbortRequested,
    AbortResult,
    EpochAdvanced,
    EventBase,
    InputAppended,
    ReleaseResult,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    StageOutput,
    StageRequestLost,
    StageRequestRestored,
    TurnCommitted,
)
from projections.dispatch import dispatch_table
from projections.findings import Finding
from projections.projector import Projector
from projections.turn_tables import TurnTables
from reports.escape import html_text as escape

REASON_COLOURS: dict[str, str] = {
    "stop": "#2e7d32",
    "barge_in": "#ef6c00",
    "cancel": "#6a1b9a",
    "close": "#546e7a",
    "abort": "#c62828",
    "error": "#b71c1c",
}
LANES: tuple[str, ...] = ("audit", "session", "cleanup", "listen", "stage 1", "stage 0", "response", "user")
"""Lanes bottom to top as plotly lists categories (the first is drawn lowest)."""
HOVER_FIELDS: tuple[str, ...] = (
    "turn_id",
    "response_id",
    "request_id",
    "stage_id",
    "request_ids",
    "outcome",
    "reason",
    "finished_reason",
    "cause",
    "source",
    "action",
    "num_new_tokens",
    "audio_frames",
    "text",
    "duration_ms",
    "is_speech",
    "old_epoch",
    "new_epoch",
    "error",
)


@dataclass(frozen=True)
class Mark:
    """One point: lane, x (s since the session's first event), symbol, colour, hover text."""

    lane: str
    x_s: float
    symbol: str
    colour: str
    hover: str
    group: str


@dataclass(frozen=True)
class Span:
    """One bar on a lane from ``start_s`` to ``end_s`` (s since the session's first event)."""

    lane: str
    start_s: float
    end_s: float
    colour: str
    hover: str
    group: str


def event_hover(st: StoredEvent) -> str:
    """``<type> @ position N`` then ts and the event's main fields, one per line (HTML)."""
    e = st.event
    lines = [f"<b>{escape(e.type)}</b> @ position {st.position}", f"ts {e.ts:.6f}"]
    for name in HOVER_FIELDS:
        value = getattr(e, name, None)
        if value is not None and value != "":
            text = str(value)
            lines.append(f"{name}: {escape(text[:80] + ('…' if len(text) > 80 else ''))}")
    return "<br>".join(lines)


def _input_mark(e: InputAppended, x: float, hover: str) -> Mark:
    speech = e.input_kind == "text" or bool(e.is_speech)
    return Mark(
        "user",
        x,
        "circle" if speech else "circle-open",
        "#1565c0" if speech else "#90a4ae",
        hover,
        "input" if speech else "silence",
    )


def _abort_result_mark(e: AbortResult, x: float, hover: str) -> Mark:
    ok = e.outcome != "failed"
    return Mark(
        "cleanup",
        x,
        "triangle-up" if ok else "triangle-down",
        "#2e7d32" if ok else "#b71c1c",
        hover,
        "abort ok" if ok else "abort failed",
    )


def _fixed(lane: str, symbol: str, colour: str, group: str) -> Callable[[EventBase, float, str], Mark]:
    return lambda e, x, hover: Mark(lane, x, symbol, colour, hover, group)


_STAGE_OUTPUT = struct_type(StageOutput)
_RELEASE_MARK = _fixed("cleanup", "square-open", "#6d4c41", "release / restore / lost")
_SESSION_MARK = _fixed("session", "line-ns-open", "#212121", "open / close")
_MARKS: dict[type, Callable[..., Mark]] = dispatch_table(
    {
        InputAppended: _input_mark,
        TurnCommitted: _fixed("user", "diamond", "#0d47a1", "commit"),
        ResponseListened: _fixed("listen", "star", "#00838f", "listen unit"),
        AbortRequested: _fixed("cleanup", "x", "#c62828", "abort requested"),
        AbortResult: _abort_result_mark,
        ReleaseResult: _RELEASE_MARK,
        StageRequestLost: _RELEASE_MARK,
        StageRequestRestored: _RELEASE_MARK,
        EpochAdvanced: _fixed("session", "hexagon", "#4527a0", "epoch"),
        SessionOpened: _SESSION_MARK,
        SessionClosed: _SESSION_MARK,
    }
)
"""The mark each event kind draws, chosen by its struct's class, as the folds do."""


def _event_marks(events: Sequence[StoredEvent], t0: float) -> list[Mark]:
    marks: list[Mark] = []
    for st in events:
        make = _MARKS.get(type(st.event))
        if make is not None:
            marks.append(make(st.event, st.event.ts - t0, event_hover(st)))
    return marks


def _finding_marks(findings: Sequence[Finding], t0: float) -> list[Mark]:
    out = []
    for f in findings:
        leak = f.severity == "leak"
        hover = "<br>".join(
            [
                f"<b>{escape(f.severity)}: {escape(f.kind)}</b> @ position {f.first_position}",
                f"last position {f.last_position}",
                f"request_id: {escape(f.request_id or '')}",
                f"evidence: {', '.join(map(str, f.evidence[:12]))}",
                escape(f.detail),
            ]
        )
        out.append(
            Mark(
                "audit",
                f.first_ts - t0,
                "x-thin-open" if leak else "circle-x-open",
                "#d50000" if leak else "#ff8f00",
                hover,
                "leak" if leak else "warning",
            )
        )
    return out


def _stage_spans(turn: TurnTables, events: Sequence[StoredEvent], t0: float) -> list[Span]:
    """First → last token-carrying output of the turn's engine id on each stage."""
    tokens: dict[int, list[StoredEvent]] = {}
    for st in events:
        if type(st.event) is not _STAGE_OUTPUT:
            continue
        e = cast(StageOutput, st.event)  # its struct: read by attribute, as the model declares
        if e.request_id == turn.request_id and e.num_new_tokens > 0 and turn.arrival_ts <= e.ts <= turn.finalize_ts:
            tokens.setdefault(e.stage_id, []).append(st)
    spans = []
    for stage_id, outs in sorted(tokens.items()):
        first, last = outs[0], outs[-1]
        n = sum(cast(StageOutput, o.event).num_new_tokens for o in outs)
        hover = "<br>".join(
            [
                f"<b>stage {stage_id}</b> response {escape(turn.response_id)}",
                f"first token @ position {first.position} ts {first.event.ts:.6f}",
                f"last token @ position {last.position} ts {last.event.ts:.6f}",
                f"tokens {n}, reason {escape(turn.finished_reason)}",
            ]
        )
        spans.append(
            Span(
                f"stage {stage_id}",
                first.event.ts - t0,
                last.event.ts - t0,
                REASON_COLOURS.get(turn.finished_reason, "#757575"),
                hover,
                f"stage {stage_id} tokens",
            )
        )
    return spans


def _response_span(turn: TurnTables, t0: float) -> Span:
    hover = "<br>".join(
        [
            f"<b>response {escape(turn.response_id)}</b> turn {turn.turn_id}",
            f"reason {escape(turn.finished_reason)}",
            f"request_id {escape(turn.request_id or 'None')}",
            f"arrival ts {turn.arrival_ts:.6f}",
            f"finalize ts {turn.finalize_ts:.6f}",
            f"e2e_total_ms {turn.e2e['e2e_total_ms']:,.3f}",
        ]
    )
    return Span(
        "response",
        turn.arrival_ts - t0,
        turn.finalize_ts - t0,
        REASON_COLOURS.get(turn.finished_reason, "#757575"),
        hover,
        f"response: {escape(turn.finished_reason)}",
    )


def timeline_figure(events: Sequence[StoredEvent], *, title: str | None = None) -> go.Figure:
    """The figure of one session's events (log order). Raises ValueError for no events."""
    if not events:
        raise ValueError("no events to draw")
    session_id = events[0].event.session_id
    projector = Projector().apply_all(events)
    t0 = events[0].event.ts
    marks = _event_marks(events, t0) + _finding_marks(
        [f for f in projector.findings() if f.session_id == session_id], t0
    )
    spans: list[Span] = []
    for turn in projector.turn_tables:
        spans.append(_response_span(turn, t0))
        spans += _stage_spans(turn, events, t0)
    fig = go.Figure()
    shown: set[str] = set()
    for span in spans:
        fig.add_trace(
            go.Bar(
                y=[span.lane],
                x=[max(span.end_s - span.start_s, 0.002)],
                base=[span.start_s],
                orientation="h",
                marker_color=span.colour,
                hovertext=[span.hover],
                hoverinfo="text",
                name=span.group,
                legendgroup=span.group,
                showlegend=span.group not in shown,
                width=0.5,
            )
        )
        shown.add(span.group)
    groups: dict[str, list[Mark]] = {}
    for mark in marks:
        groups.setdefault(mark.group, []).append(mark)
    for group, ms in groups.items():
        fig.add_trace(
            go.Scatter(
                x=[m.x_s for m in ms],
                y=[m.lane for m in ms],
                mode="markers",
                name=group,
                marker={
                    "symbol": [m.symbol for m in ms],
                    "color": [m.colour for m in ms],
                    "size": 11,
                    "line": {"width": 1.5, "color": [m.colour for m in ms]},
                },
                hovertext=[m.hover for m in ms],
                hoverinfo="text",
            )
        )
    lanes = [lane for lane in LANES if lane in {m.lane for m in marks} | {s.lane for s in spans}]
    extra = sorted({s.lane for s in spans} - set(LANES))
    fig.update_layout(
        title=title
        or f"session {escape(session_id)} — {len(events)} events, positions "
        f"{events[0].position}…{events[-1].position}, {len(projector.turn_tables)} responses",
        barmode="overlay",
        template="plotly_white",
        height=520,
        hoverlabel={"align": "left"},
        xaxis={"title": "seconds since the session's first event (wall clock)", "zeroline": False},
        yaxis={"categoryorder": "array", "categoryarray": extra + lanes, "title": None},
        legend={"orientation": "h", "y": -0.18},
        margin={"l": 80, "r": 20, "t": 60, "b": 40},
    )
    return fig


def timeline_html(events: Sequence[StoredEvent]) -> str:
    """The page as one HTML string (plotly.js inline, no network at view time). The same log
    gives the same bytes: the plot's div id is fixed (plotly's default is a random uuid4)."""
    html: str = timeline_figure(events).to_html(
        include_plotlyjs=True,
        full_html=True,
        div_id="duplex-ledger-timeline",
        config={"displaylogo": False, "responsive": True},
    )
    return html


def write_timeline(events: Sequence[StoredEvent], output: Path) -> int:
    """Write the page (:func:`timeline_html`) to ``output``; returns its size in bytes."""
    output.write_text(timeline_html(events), encoding="utf-8")
    return output.stat().st_size
