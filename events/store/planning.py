"""Pure, in-memory planning of one group-commit batch (no I/O).

Inside the write transaction the recorder loads a :class:`BatchState` (head position, the
current version of every stream the batch touches, the stored copies of every event id it
names), then :func:`plan_call` decides each call in queue order. A call that fails raises
its own typed error and leaves the state untouched, so one bad call never fails the others in
the batch (no savepoints needed: nothing of it was written).

Idempotency rules (documented decision). A re-sent event is "the same" when its stored copy
has the same *content*: stream, type, schema_version, ts (integer µs) and data (equal as JSON
values: key order and spacing do not matter, ``1`` and ``1.0`` or ``true`` and ``1`` differ).
Position, version and recorded_at are the store's, not content (:func:`content_difference`).

* ``append`` (one stream, ``bulk=False``): if *every* event id of the call is already stored
  with the same content, the call succeeds without writing and returns the original
  positions — no version check, since a retry after a lost acknowledgement necessarily
  carries a stale expected version. If only *some* are stored, or any stored copy differs
  (another stream included), the call raises :class:`EventIdConflict`.
* bulk import (``bulk=True``): rows whose event id is stored with the same content are
  skipped and report their original position; a stored copy with other content raises
  :class:`EventIdConflict`; the others are appended at the end of their stream.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from events.chain import GENESIS, link, row_pieces
from events.store.errors import ConcurrencyError, EventIdConflict, StoreError
from events.store.rows import NewRow

_sha256 = hashlib.sha256
_Q = struct.Struct(">q").pack


class Existing(NamedTuple):
    """A stored (or planned-in-this-batch) copy of an event id and its content. A NamedTuple:
    one is built per appended row on the writer thread (a frozen dataclass cost ~1 µs more)."""

    stream_id: str
    version: int
    position: int
    type: str
    schema_version: int
    ts_us: int
    data: str


def content_difference(row: NewRow, stored: Existing) -> str | None:
    """The first content field (stream, type, schema_version, ts, data) in which ``row``
    differs from the stored copy of its event id; None when they are the same event."""
    for name, new, old in (
        ("stream", row.stream_id, stored.stream_id),
        ("type", row.type, stored.type),
        ("schema_version", row.schema_version, stored.schema_version),
        ("ts", row.ts_us, stored.ts_us),
    ):
        if new != old:
            return name
    if row.data != stored.data and _canonical(row.data) != _canonical(stored.data):
        return "data"
    return None


def _canonical(data: str) -> str:
    return json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _conflict(stream: str, rows: list[NewRow], stored: list[Existing | None]) -> EventIdConflict | None:
    """EventIdConflict for the rows whose stored copy differs, naming the fields; else None."""
    differ = [(r.event_id, d) for r, f in zip(rows, stored) if f is not None and (d := content_difference(r, f))]
    if not differ:
        return None
    fields = sorted({d for _, d in differ})
    reason = (
        "event ids already stored in another stream"
        if "stream" in fields
        else f"event ids already stored with different content ({', '.join(fields)} differ)"
    )
    return EventIdConflict(stream, [eid for eid, _ in differ], reason)


class AppendCall(NamedTuple):
    """One caller's request. ``stream_id`` is None for bulk calls spanning many streams. A
    NamedTuple: one is built per append (:meth:`EventStore.append` builds it without a frame)."""

    rows: list[NewRow]
    stream_id: str | None = None
    expected_version: int | None = None
    bulk: bool = False


class CallResult(NamedTuple):
    """One call's outcome (a NamedTuple)."""

    positions: list[int]  # one per row of the call, in order
    appended: int  # rows written (the rest were already stored)


Settled = list[int] | CallResult
"""What a call's caller gets once its batch committed (:func:`plan_calls`): a plain append's
positions (so that :meth:`EventStore.append` hands its future back as it is, issue 23 step 6),
a bulk call's :class:`CallResult` (positions and the count appended)."""


@dataclass(slots=True)
class BatchState:
    head: int
    head_hash: bytes = GENESIS  # chain hash of the row at ``head`` (events.chain)
    versions: dict[str, int] = field(default_factory=dict)  # stream -> current version (absent = 0)
    existing: dict[str, Existing] = field(default_factory=dict)  # event_id -> stored copy
    inserts: list[tuple[Any, ...]] = field(default_factory=list)  # rows to write (schema.ROW_COLUMNS order)
    # event_id -> its row in ``inserts`` (planned in this batch): an Existing is built from it
    # only when a later call names the id again (:func:`copy_of`), not once per row
    planned: dict[str, tuple[Any, ...]] = field(default_factory=dict)


def copy_of(state: BatchState, event_id: str) -> Existing | None:
    """The stored or planned-in-this-batch copy of ``event_id``; None when it has none."""
    stored = state.existing.get(event_id)
    if stored is not None:
        return stored
    row = state.planned.get(event_id)
    if row is None:
        return None
    position, stream_id, version, _, type_, schema_version, ts_us, _, data, _ = row
    return Existing(stream_id, version, position, type_, schema_version, ts_us, data)


def plan_call(state: BatchState, call: AppendCall, now_us: int) -> CallResult:
    """Decide one call against ``state``; on success record its rows in ``state``.

    Raises ConcurrencyError or EventIdConflict (state unchanged)."""
    if call.bulk:
        return _plan_bulk(state, call, now_us)
    assert call.stream_id is not None
    stream = call.stream_id
    existing, planned = state.existing, state.planned
    for row in call.rows:  # the common case, no id stored yet, decided without building lists
        if row.event_id in existing or row.event_id in planned:
            return _plan_resent(state, call, stream)
    current = state.versions.get(stream, 0)
    if call.expected_version is not None and call.expected_version != current:
        raise ConcurrencyError(stream, call.expected_version, current)
    rows = call.rows
    if len(rows) == 1:  # the live path's shape: no comprehension frame
        return CallResult([_accept(state, rows[0], current + 1, now_us)], 1)
    positions = [_accept(state, row, current + i + 1, now_us) for i, row in enumerate(rows)]
    return CallResult(positions, len(positions))


def plan_calls(state: BatchState, calls: Sequence[AppendCall], now_us: int) -> list[Settled | StoreError]:
    """:func:`plan_call` for each of ``calls`` in queue order: the value its caller gets
    (:data:`Settled`: a plain call's positions, a bulk call's CallResult), or the StoreError it
    alone failed with (state untouched by that call). The live path's call (one new event,
    version as expected, its chain pieces encoded) is decided inline, in one pass with locals
    only and the link computed here (:func:`events.chain.link`'s bytes, without its frame):
    issue 23 step 6. A plain call of several such events (the live session log's batches) is
    planned inline alike. Every other call goes through :func:`plan_call`, so the decisions are the
    same (``tests/store/test_planning.py`` checks the two agree call by call)."""
    outcomes: list[Settled | StoreError] = []
    settle = outcomes.append
    existing, planned, versions = state.existing, state.planned, state.versions
    insert = state.inserts.append
    head, head_hash = state.head, state.head_hash
    sha256, pack_q, join = _sha256, _Q, b"".join
    now_q = pack_q(now_us)  # every row of the batch is recorded at the same µs
    for call in calls:
        rows, stream, expected, bulk = call
        if not bulk and len(rows) == 1:
            stream_id, event_id, type_, schema_version, ts_us, data, _, recorded_at_us, pieces = rows[0]
            version = versions.get(stream, 0) + 1  # type: ignore[arg-type]
            if (
                (expected is None or expected == version - 1)
                and pieces is not None
                and recorded_at_us is None
                and event_id not in existing
                and event_id not in planned
            ):
                head += 1
                versions[stream] = version  # type: ignore[index]
                a, b, c = pieces
                head_hash = sha256(join((head_hash, pack_q(head), a, pack_q(version), b, now_q, c))).digest()
                row = (head, stream_id, version, event_id, type_, schema_version, ts_us, now_us, data, head_hash)
                insert(row)
                planned[event_id] = row
                settle([head])
                continue
        elif not bulk and (expected is None or expected == versions.get(stream, 0)) and _fresh(rows, stream, state):  # type: ignore[arg-type]
            version = versions.get(stream, 0)  # type: ignore[arg-type]
            positions = []
            for stream_id, event_id, type_, schema_version, ts_us, data, _, _, pieces in rows:
                head += 1
                version += 1
                a, b, c = pieces  # type: ignore[misc]
                head_hash = sha256(join((head_hash, pack_q(head), a, pack_q(version), b, now_q, c))).digest()
                row = (head, stream_id, version, event_id, type_, schema_version, ts_us, now_us, data, head_hash)
                insert(row)
                planned[event_id] = row
                positions.append(head)
            versions[stream] = version  # type: ignore[index]
            settle(positions)
            continue
        state.head, state.head_hash = head, head_hash
        try:
            result = plan_call(state, call, now_us)
            settle(result if bulk else result.positions)
        except StoreError as exc:
            settle(exc)
        head, head_hash = state.head, state.head_hash
    state.head, state.head_hash = head, head_hash
    return outcomes


def _fresh(rows: list[NewRow], stream: str, state: BatchState) -> bool:
    """True when every one of a plain call's several ``rows`` is new (its id neither stored,
    nor planned, nor repeated in the call), of the call's ``stream``, stamped at commit and has
    its chain pieces: :func:`plan_calls` then plans the call inline."""
    ids = set()
    for stream_id, event_id, _, _, _, _, _, recorded_at_us, pieces in rows:
        if pieces is None or recorded_at_us is not None or stream_id != stream:
            return False
        ids.add(event_id)
    return len(ids) == len(rows) and ids.isdisjoint(state.planned) and ids.isdisjoint(state.existing)


def _plan_resent(state: BatchState, call: AppendCall, stream: str) -> CallResult:
    """A plain call naming an event id already stored (or planned): its original positions
    when every row is the same event (module doc); EventIdConflict otherwise."""
    found = [copy_of(state, r.event_id) for r in call.rows]
    present = [r.event_id for r, f in zip(call.rows, found) if f is not None]
    conflict = _conflict(stream, call.rows, found)
    if conflict is not None:
        raise conflict
    if len(present) != len(call.rows):
        raise EventIdConflict(stream, present, "only part of this batch is already stored")
    return CallResult([f.position for f in found if f is not None], 0)


def _plan_bulk(state: BatchState, call: AppendCall, now_us: int) -> CallResult:
    versions: dict[str, int] = {}
    planned: list[tuple[NewRow, int] | Existing] = []
    for row in call.rows:
        stored = copy_of(state, row.event_id)
        if stored is not None:
            conflict = _conflict(row.stream_id, [row], [stored])
            if conflict is not None:
                raise conflict
            planned.append(stored)
            continue
        current = versions.get(row.stream_id, state.versions.get(row.stream_id, 0))
        if row.version is not None and row.version != current + 1:
            raise ConcurrencyError(row.stream_id, row.version - 1, current, row.event_id)
        versions[row.stream_id] = current + 1
        planned.append((row, current + 1))
    positions = [p.position if isinstance(p, Existing) else _accept(state, p[0], p[1], now_us) for p in planned]
    return CallResult(positions, sum(1 for p in planned if not isinstance(p, Existing)))


def _accept(state: BatchState, row: NewRow, version: int, now_us: int) -> int:
    position = state.head = state.head + 1
    stream_id, event_id, type_, schema_version, ts_us, data, _, recorded_at_us, pieces = row
    state.versions[stream_id] = version
    if recorded_at_us is None:
        recorded_at_us = now_us
    if pieces is None:
        pieces = row_pieces(stream_id, event_id, type_, schema_version, ts_us, data)
    head_hash = state.head_hash = link(state.head_hash, position, version, recorded_at_us, pieces)
    planned = (position, stream_id, version, event_id, type_, schema_version, ts_us, recorded_at_us, data, head_hash)
    state.inserts.append(planned)
    state.planned[event_id] = planned
    return position
