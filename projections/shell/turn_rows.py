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
"""The ``tables_json`` key of the stage rows written sparse (the compact form of fold version
12, :func:`turn_to_json`): a value a collapsed row holds by default (None; [] for a list
field) is left out. Rows an older fold wrote hold every key under ``"stages"`` and still
decode the same."""


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


_IN_COLUMNS = ("session_id", "response_id", "turn_id", "finished_reason")
"""TurnTables fields the compact form leaves to the row's own columns (``request_id`` too, when
it is a non-empty id: its column holds ``""`` for a turn without one)."""
_COMPACT_FIELDS = tuple(n for n in _TURN_FIELDS if n not in (*_IN_COLUMNS, "request_id", "stages", "transfers"))


def turn_to_json(t: TurnTables) -> str:
    """Lossless JSON of a TurnTables (floats round-trip exactly), as ``rm_turn_tables`` holds it
    beside its columns. Compact form (fold version 12), when every stage row is a collapsed row
    (every ``STAT_FIELDS`` key, in that order): the stage rows under :data:`SPARSE_STAGES_KEY`
    without their default values (None; [] for a list field), the edges under ``"edges"`` as
    arrays in ``TransferEdge`` field order, and the ids the row's columns hold left out (read
    back with :func:`turn_from_json`'s ``columns``): a row's text is under half as long, and
    the read model a quarter of its pages (a row no longer fills a 4 KiB page alone). Any
    other turn is written whole, with every key, as older folds wrote every turn."""
    sparse = _sparse_stages(t)
    if sparse is None:
        d = {name: getattr(t, name) for name in _TURN_FIELDS}
        d["stages"] = {str(k): v for k, v in t.stages.items()}
        d["transfers"] = [{name: getattr(e, name) for name in _EDGE_FIELDS} for e in t.transfers]
        return _dumps_compact(d)  # key order matters: the summary prints in it
    d = {} if t.request_id else {"request_id": t.request_id}
    for name in _COMPACT_FIELDS:
        d[name] = getattr(t, name)
    d[SPARSE_STAGES_KEY] = sparse
    d["edges"] = [[getattr(e, name) for name in _EDGE_FIELDS] for e in t.transfers]
    return _dumps_compact(d)


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


def turn_from_json(text: str, columns: Mapping[Any, Any] | None = None) -> TurnTables:
    """The TurnTables :func:`turn_to_json` wrote, in either form (the compact one of fold
    version 12, or the whole one older folds wrote). ``columns``: the row's columns (a
    :func:`turn_row` or a table row), which the compact form needs. Raises ValueError on a
    compact text without ``columns``, a stage row holding a key outside ``STAT_FIELDS``, or an
    edge of another length than ``TransferEdge``'s fields."""
    d = json.loads(text)
    sparse = d.pop(SPARSE_STAGES_KEY, None)
    if sparse is None:
        d["stages"] = {int(k): v for k, v in d["stages"].items()}
        d["transfers"] = tuple(TransferEdge(**e) for e in d["transfers"])
        return TurnTables(**d)
    if columns is None:
        raise ValueError("tables_json in the compact form is read with its row's columns")
    for name in _IN_COLUMNS:
        d[name] = columns[name]
    if "request_id" not in d:
        d["request_id"] = columns["request_id"]
    d["stages"] = {int(k): _full_row(v) for k, v in sparse.items()}
    d["transfers"] = tuple(_edge(e) for e in d.pop("edges"))
    return TurnTables(**d)


def _edge(values: list[Any]) -> TransferEdge:
    if len(values) != len(_EDGE_FIELDS):
        raise ValueError(f"tables_json: an edge of {len(values)} values, not {len(_EDGE_FIELDS)}")
    return TransferEdge(*values)


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
