"""The ``rm_turn_tables`` row of a finalized turn, and the batch fold that collects them: pure
builders with no database driver imported, so a rebuild worker (:mod:`projections.shell.parallel`)
loads only the folds, the event decoder and ``sqlite3`` (its memory and its start-up are
counted in the rebuild's). :mod:`projections.shell.readmodels` re-exports them beside the
table definitions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any

from events.gc_pause import gc_paused
from events.records import StoredEvent
from events.stats import STAT_FIELDS
from events.types import ts_to_us
from projections.collapse import LIST_MEAN_FIELDS
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
_STAT_NAMES = frozenset(STAT_FIELDS)
_LIST_FIELDS = tuple(LIST_MEAN_FIELDS)  # a collapsed row's list fields: always lists, [] when none
_dumps_compact = json.JSONEncoder(separators=(",", ":")).encode

SPARSE_STAGES_KEY = "stage_values"
"""The ``tables_json`` key of the stage rows written sparse (fold version 12): a value a
collapsed row holds by default (None; [] for a list field) is left out. Rows an older fold
wrote hold every key under ``"stages"`` and still decode the same."""


_ABSENT = object()


def _sparse_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A collapsed stage row without its default values (a None list field is written)."""
    out = {k: v for k, v in row.items() if v is not None}
    for name in _LIST_FIELDS:
        value = out.get(name, _ABSENT)
        if value is _ABSENT:
            out[name] = None  # not the default of a list field: written
        elif value == []:
            del out[name]
    return out


def _sparse_stages(t: TurnTables) -> dict[str, dict[str, Any]] | None:
    """``t.stages`` written sparse, or None when a row is not a collapsed row (its keys are
    not exactly ``STAT_FIELDS`` in that order): such rows are written whole."""
    out: dict[str, dict[str, Any]] = {}
    for sid, row in t.stages.items():
        if tuple(row) != STAT_FIELDS:
            return None
        out[str(sid)] = _sparse_row(row)
    return out


def turn_to_json(t: TurnTables) -> str:
    """Lossless JSON of a TurnTables (floats round-trip exactly). A collapsed stage row (every
    ``STAT_FIELDS`` key, in that order) is written under :data:`SPARSE_STAGES_KEY` without its
    default values (None; [] for a list field), which are most of its keys: a row's text is
    then about half as long, and the read model a third of its pages (a row no longer fills a
    4 KiB page alone)."""
    d = {name: getattr(t, name) for name in _TURN_FIELDS}
    sparse = _sparse_stages(t)
    if sparse is None:
        d["stages"] = {str(k): v for k, v in t.stages.items()}
    else:
        del d["stages"]
        d[SPARSE_STAGES_KEY] = sparse
    d["transfers"] = [{name: getattr(e, name) for name in _EDGE_FIELDS} for e in t.transfers]
    return _dumps_compact(d)  # key order matters: the summary prints in it


def _full_row(values: dict[str, Any]) -> dict[str, Any]:
    """A sparse stage row given back whole: every ``STAT_FIELDS`` key in that order, an absent
    one at its default. Raises ValueError on a key outside ``STAT_FIELDS``."""
    if not _STAT_NAMES.issuperset(values):
        raise ValueError(f"tables_json: stage row keys outside STAT_FIELDS: {sorted(set(values) - _STAT_NAMES)}")
    row = dict.fromkeys(STAT_FIELDS)
    for name in _LIST_FIELDS:
        row[name] = []
    row.update(values)  # existing keys only: the STAT_FIELDS order is kept
    return row


def turn_from_json(text: str) -> TurnTables:
    """The TurnTables :func:`turn_to_json` wrote (either stage form: the sparse one of fold
    version 12, or every key of older rows). Raises ValueError on a sparse stage row holding
    a key outside ``STAT_FIELDS``."""
    d = json.loads(text)
    sparse = d.pop(SPARSE_STAGES_KEY, None)
    if sparse is not None:
        d["stages"] = {int(k): _full_row(v) for k, v in sparse.items()}
    else:
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
