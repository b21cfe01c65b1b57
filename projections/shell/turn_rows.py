"""The ``rm_turn_tables`` row of a finalized turn, and the batch fold that collects them: pure
builders with no database driver imported, so a rebuild worker (:mod:`projections.shell.parallel`)
loads only the folds, the event decoder and ``sqlite3`` (its memory and its start-up are
counted in the rebuild's). :mod:`projections.shell.readmodels` re-exports them beside the
table definitions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from events.gc_pause import gc_paused
from events.records import StoredEvent
from events.types import ts_to_us
from projections.projector import Projector
from projections.turn_tables import TransferEdge, TurnTables

TURN_COLUMNS: tuple[str, ...] = (
    "session_id",
    "response_id",
    "request_id",
    "turn_id",
    "finished_reason",
    "arrival_ts_us",
    "finalize_ts_us",
    "finalize_position",
    "tables_json",
)
"""The ``rm_turn_tables`` columns in table order (the values of :func:`turn_values`)."""

_TURN_FIELDS = tuple(f.name for f in fields(TurnTables))
_EDGE_FIELDS = tuple(f.name for f in fields(TransferEdge))
_dumps_compact = json.JSONEncoder(separators=(",", ":")).encode


def turn_to_json(t: TurnTables) -> str:
    """Lossless JSON of a TurnTables (floats round-trip exactly)."""
    d = {name: getattr(t, name) for name in _TURN_FIELDS}
    d["stages"] = {str(k): v for k, v in t.stages.items()}
    d["transfers"] = [{name: getattr(e, name) for name in _EDGE_FIELDS} for e in t.transfers]
    return _dumps_compact(d)  # key order matters: the summary prints in it


def turn_from_json(text: str) -> TurnTables:
    """The TurnTables :func:`turn_to_json` wrote."""
    d = json.loads(text)
    d["stages"] = {int(k): v for k, v in d["stages"].items()}
    d["transfers"] = tuple(TransferEdge(**e) for e in d["transfers"])
    return TurnTables(**d)


def turn_values(t: TurnTables, position: int) -> tuple[Any, ...]:
    """The row of ``t`` finalized at log ``position``, in :data:`TURN_COLUMNS` order."""
    return (
        t.session_id,
        t.response_id,
        t.request_id or "",
        t.turn_id,
        t.finished_reason,
        ts_to_us(t.arrival_ts),
        ts_to_us(t.finalize_ts),
        position,
        turn_to_json(t),
    )


def turn_row(t: TurnTables, position: int) -> dict[str, Any]:
    """:func:`turn_values` as a ``{column: value}`` dict."""
    return dict(zip(TURN_COLUMNS, turn_values(t, position)))


def fold_batch(
    projector: Projector,
    events: Iterable[StoredEvent],
    *,
    after_position: int = 0,
    row: Callable[[TurnTables, int], Any] = turn_row,
) -> tuple[list[Any], dict[str, None]]:
    """Apply ``events`` (those after ``after_position``: redelivered ones are skipped) and
    return the turn rows finalized on the way (``row(turn, position)``: a dict by default,
    :func:`turn_values` for a plain ``sqlite3`` writer) and the sessions touched (in first-seen
    order). The cyclic garbage collector is paused meanwhile
    (:func:`events.gc_pause.gc_paused`: it walked the whole fold state every few thousand
    events)."""
    turn_rows: list[Any] = []
    touched: dict[str, None] = {}
    apply, turns = projector.apply, projector.turns
    with gc_paused():
        for stored in events:
            if stored.position <= after_position:
                continue
            apply(stored)
            touched[stored.stream_id] = None
            if turns.finalized:
                turn_rows.extend(row(t, stored.position) for t in turns.take_finalized())
    return turn_rows, touched
