"""Parallel full rebuild of a SQLite ledger: the sessions in partitions, one worker process
each but the last (the caller folds that one on a thread).

Every fold keeps its state per session, and an event only ever touches its own session's
state, so the log splits into independent sub-logs by session. :func:`plan_partitions`
deals the sessions out by event count (largest first, each to the lightest partition), so
the workers finish together even when a few sessions are much longer than the rest. Each
worker (a spawned process, so it shares no GIL, thread or connection with the caller) reads
the log file read-only with plain ``sqlite3``, keeps the rows of its sessions (SQLite
filters them against a temporary table of the partition's session ids, before Python sees
a row), decodes them into event structs and folds them in log order with its own
:class:`Projector` (the caller folds the last partition itself, on a thread: one spawn
fewer, and its state never crosses a process). It spools its finalized turn rows to a scratch SQLite file and hands its
projector back as plain data, through the checkpoint's own codec (:func:`encode_result`: no
pickle; the caller decodes it against the same allow-list as a checkpoint found in a file).
A worker loads no database driver beyond ``sqlite3`` (:mod:`projections.shell.turn_rows`)
and holds :data:`WORKER_BATCH` rows at a time. The caller merges the projectors
(:meth:`Projector.merged`) and writes every read-model row (the spooled turn rows go from
file to table through ``sqlite3``'s ``executemany``) and the checkpoint in ONE
transaction, exactly as the sequential runner's last batch would have (CASE-16: a crash
before the commit leaves no rows and no checkpoint, and the next run starts over).

A checked fold (``verify`` on a large log: :func:`fold_partition_checked`) also checks the
hash chain's links of one range of positions per partition, from the same scan: the
partition's rows before its range, every row of the range (with its hash; the partition's
own folded), then the partition's rows after it, in position order
(:class:`events.chain_walk.SegmentCheck`). The rows are read once.

Only the log-wide "now" is shared between sessions: the resources fold evaluates orphans
against the ts of the last event applied, which the merge takes from the partition holding
the log's last position — the same value a sequential fold ends with.

Used by :meth:`ProjectionRunner.rebuild` for SQLite logs of at least
:data:`PARALLEL_MIN_EVENTS` events (a worker's start costs ≈ 0.3 s of CPU); PostgreSQL rebuilds run
sequentially.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from events.gc_pause import gc_paused
from events.records import StoredEvent, decode_row
from projections.projector import Projector
from projections.shell import checkpoint
from projections.shell.turn_rows import TURN_COLUMNS, fold_batch, turn_values

if TYPE_CHECKING:
    from events.chain_walk import SegmentCheck

PARALLEL_MIN_EVENTS = 200_000
"""Logs shorter than this are rebuilt sequentially by default."""

WORKER_BATCH = 2_000
"""Rows a worker fetches, decodes and folds at a time: what it holds in flight besides the
fold state (≈ 1.5 KB a row as tuple, text and struct; 20,000 rows cost ≈ 30 MB of peak RSS
per worker for no measurable CPU gain)."""

_COLUMNS = ("position", "stream_id", "version", "event_id", "type", "schema_version", "ts_us", "recorded_at_us", "data")
# ``+stream_id``: no index for this term, so SQLite scans the table in position order (one
# pass, no sort) and checks each row against the temporary table in C. The chain hash is
# not read: the fold never looks at it.
_SELECT = (
    f"SELECT {', '.join(_COLUMNS)} FROM events WHERE position BETWEEN ? AND ? AND +stream_id IN temp.dl_partition "
    "ORDER BY position"
)
# A checked fold's chain range (row lo - 1 included, as events.chain_walk.check_sqlite_segment
# reads it): every session's rows, with their hash.
_SELECT_RANGE = f"SELECT {', '.join(_COLUMNS)}, hash FROM events WHERE position BETWEEN ? AND ? ORDER BY position"
_LOWEST_POSITION = -(2**63)
"""The lowest 64-bit position (a row below 1 was written around the store, yet is folded)."""

RESULT_MAGIC = "duplex-ledger-partition"
"""First item of a worker's result (:func:`encode_result`)."""


def _read_only(db_path: str) -> sqlite3.Connection:
    """A read-only connection to the ledger file (a file URI: a path with ``?``, ``#`` or
    ``%`` in it is escaped, not parsed)."""
    return sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)


def session_sizes(db_path: str) -> list[tuple[str, int]]:
    """``[(session_id, events)]`` of every stream of the log (its head version, read from the
    ``(stream_id, version)`` index without touching the table)."""
    conn = _read_only(db_path)
    try:
        return conn.execute("SELECT stream_id, max(version) FROM events GROUP BY stream_id").fetchall()
    finally:
        conn.close()


def plan_partitions(sizes: Iterable[tuple[str, int]], parts: int) -> list[list[str]]:
    """Split sessions into at most ``parts`` non-empty partitions of nearly equal event
    counts: largest session first, each to the partition with the fewest events so far
    (ties: lower partition number). Deterministic for the same sizes; each partition's ids
    are sorted. ``parts`` must be >= 1 (ValueError otherwise)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    plan: list[list[str]] = [[] for _ in range(parts)]
    loads = [(0, i) for i in range(parts)]
    for session_id, size in sorted(sizes, key=lambda s: (-s[1], s[0])):
        load, i = heapq.heappop(loads)
        plan[i].append(session_id)
        heapq.heappush(loads, (load + size, i))
    return [sorted(p) for p in plan if p]


def default_workers() -> int:
    """Worker processes for a parallel rebuild: the CPUs this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """A worker's projector, and the file its finalized turn rows were spooled to (so neither
    the worker nor the caller holds every turn table in memory); ``segment``: what the chain
    check of a range of positions found from the fold's scan (:func:`folded_partition`'s
    ``chain``, as :func:`events.chain_walk.check_sqlite_segment_plain` values), None when none
    was asked."""

    projector: Projector
    turns_path: str
    turns: int
    events: int
    segment: tuple[Any, ...] | None = None


def encode_result(result: PartitionResult) -> bytes:
    """What a worker hands back: plain data, never code. MessagePack
    ``[RESULT_MAGIC, checkpoint.FORMAT_VERSION, turns_path, turns, events, state]``, where
    ``state`` is the projector as the checkpoint writes it
    (:func:`projections.shell.checkpoint.encode_state`)."""
    body = checkpoint.encode_state(result.projector)
    return msgspec.msgpack.encode(
        [RESULT_MAGIC, checkpoint.FORMAT_VERSION, result.turns_path, result.turns, result.events, body]
    )


def decode_result(blob: bytes) -> PartitionResult:
    """The :class:`PartitionResult` :func:`encode_result` wrote, its state rebuilt only from
    the checkpoint's allow-list (:func:`projections.shell.checkpoint.decode_state`). Raises
    CheckpointRefused for anything else."""
    try:
        header = msgspec.msgpack.decode(blob)
    except msgspec.DecodeError as exc:
        raise checkpoint.CheckpointRefused(f"not a partition result ({exc})") from None
    if type(header) is not list or len(header) != 6 or header[0] != RESULT_MAGIC:
        raise checkpoint.CheckpointRefused("not a partition result")
    _, fmt, turns_path, turns, events, body = header
    if fmt != checkpoint.FORMAT_VERSION:
        raise checkpoint.CheckpointRefused(
            f"partition result format {fmt!r}, this code reads {checkpoint.FORMAT_VERSION}"
        )
    if type(turns_path) is not str or type(turns) is not int or type(events) is not int or type(body) is not bytes:
        raise checkpoint.CheckpointRefused("malformed partition result")
    projector = checkpoint.decode_state(body)
    if type(projector) is not Projector:
        raise checkpoint.CheckpointRefused(f"partition state is a {type(projector).__name__}, not a Projector")
    return PartitionResult(projector, turns_path, turns, events)


def _retyped(row: Sequence[Any]) -> str:
    """Raise ValueError for a row whose stream id or version is not of the type the store
    writes (as :func:`events.store.rows.decode_rows` does: an edit, issue 22)."""
    from events.chain_walk import SqliteRow, retyped

    raise ValueError(
        f"position {row[0]}: {retyped(SqliteRow._make((*row, None))) or 'a value of another storage type'}: "
        "the row was edited (run `duplex-ledger verify`)"
    )


def decode_tuples(rows: Sequence[tuple[Any, ...]]) -> list[StoredEvent]:
    """Rows of :data:`_COLUMNS` as plain ``sqlite3`` returns them, decoded into event
    structs exactly as :func:`events.store.rows.decode_rows` decodes a ``StoredRow`` (without
    building one per row, and without loading the store's driver into a worker). Raises what
    decoding raises."""
    new, decode = tuple.__new__, decode_row
    return [
        new(
            StoredEvent,
            (
                position,
                stream_id if type(stream_id) is str and type(version) is int else _retyped(row),
                version,
                recorded_at_us / 1_000_000,
                decode(type_, schema_version, stream_id, event_id, ts_us, data),
            ),
        )
        for row in rows
        for position, stream_id, version, event_id, type_, schema_version, ts_us, recorded_at_us, data in (row,)
    ]


def fold_partition(
    db_path: str,
    part: int,
    sessions: Sequence[str],
    until_position: int,
    spool_dir: str,
    batch_size: int = WORKER_BATCH,
) -> bytes:
    """Worker: :func:`folded_partition`, handed back as its :func:`encode_result` bytes."""
    with gc_paused():
        return encode_result(folded_partition(db_path, part, sessions, until_position, spool_dir, batch_size))


def fold_partition_checked(
    db_path: str,
    part: int,
    sessions: Sequence[str],
    until_position: int,
    spool_dir: str,
    chain: tuple[int, int],
    watch: Sequence[int] = (),
    batch_size: int = WORKER_BATCH,
) -> tuple[bytes, tuple[Any, ...]]:
    """Worker: :func:`fold_partition`, and the hash chain's links of rows ``chain`` = (lo, hi)
    checked from the same scan (:func:`folded_partition`'s ``chain``: each link depends on two
    stored rows only, so the ranges of all partitions together check the whole chain).
    ``watch``: positions whose stored hash to hand back. Both as plain data."""
    with gc_paused():
        result = folded_partition(db_path, part, sessions, until_position, spool_dir, batch_size, chain, watch)
        return encode_result(result), result.segment  # type: ignore[return-value]  # set: chain given


def chain_ranges(head: int, parts: int) -> list[tuple[int, int]]:
    """Positions 1..``head`` cut into ``parts`` consecutive ranges (lo, hi) of nearly equal
    length, one per partition of a checked fold, in partition order (an empty range is
    (lo, lo - 1)). ``parts`` must be >= 1 (ValueError otherwise)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    bounds = [head * i // parts for i in range(parts + 1)]
    return [(bounds[i] + 1, bounds[i + 1]) for i in range(parts)]


def folded_partition(
    db_path: str,
    part: int,
    sessions: Sequence[str],
    until_position: int,
    spool_dir: str,
    batch_size: int = WORKER_BATCH,
    chain: tuple[int, int] | None = None,
    watch: Sequence[int] = (),
) -> PartitionResult:
    """Fold the events of ``sessions`` (partition number ``part``) with position <=
    ``until_position``, spooling finalized turn rows to a SQLite file in ``spool_dir``
    (in a worker process, or on a thread of the caller for the partition it folds itself).
    ``chain`` = (lo, hi): also check the hash chain's links of rows lo..hi (every session's),
    read by the same scan (:class:`events.chain_walk.SegmentCheck`; the ``watch`` positions'
    stored hashes kept), in the result's ``segment`` as
    :func:`~events.chain_walk.check_sqlite_segment_plain` gives it. Raises what decoding
    raises (the caller sees it)."""
    if chain is None:
        return _folded(db_path, part, sessions, until_position, spool_dir, batch_size, None)
    from events.chain_walk import SegmentCheck, check_sqlite_segment_plain

    try:
        return _folded(db_path, part, sessions, until_position, spool_dir, batch_size, SegmentCheck(*chain, watch))
    except sqlite3.Error:
        # A row sqlite3 cannot read (text that is not UTF-8, a damaged page): the fold and the
        # chain check read apart, so each meets it as it does on its own (the fold raises
        # when the row is one of its sessions'; the range is not intact).
        os.remove(_spool_path(spool_dir, part))
    result = _folded(db_path, part, sessions, until_position, spool_dir, batch_size, None)
    return dataclasses.replace(result, segment=check_sqlite_segment_plain(db_path, *chain, watch))


def _spool_path(spool_dir: str, part: int) -> str:
    return os.path.join(spool_dir, f"turns-{part}.db")


def _folded(
    db_path: str,
    part: int,
    sessions: Sequence[str],
    until_position: int,
    spool_dir: str,
    batch_size: int,
    check: SegmentCheck | None,
) -> PartitionResult:
    """:func:`folded_partition`: one scan, the chain range's rows fed to ``check``."""
    conn = _read_only(db_path)
    conn.execute("CREATE TEMP TABLE dl_partition (stream_id TEXT PRIMARY KEY) WITHOUT ROWID")
    conn.executemany("INSERT INTO temp.dl_partition VALUES (?)", ((s,) for s in sessions))
    spool_path = _spool_path(spool_dir, part)
    spool = sqlite3.connect(spool_path)
    spool.execute("PRAGMA journal_mode=OFF")  # a scratch file: lost with the rebuild if it fails
    spool.execute(f"CREATE TABLE turns ({', '.join(TURN_COLUMNS)})")
    insert = f"INSERT INTO turns VALUES ({', '.join('?' * len(TURN_COLUMNS))})"
    projector = Projector()
    events = n_turns = 0

    def fold(rows: Sequence[tuple[Any, ...]]) -> None:
        nonlocal events, n_turns
        turn_rows, _ = fold_batch(projector, decode_tuples(rows), row=turn_values)
        if turn_rows:
            spool.executemany(insert, turn_rows)
        events += len(rows)
        n_turns += len(turn_rows)

    # The collector paused for the whole fold (events.gc_pause): what is built is acyclic.
    with gc_paused():
        try:
            if check is None:
                for rows in _batches(conn.execute(_SELECT, (_LOWEST_POSITION, until_position)), batch_size):
                    fold(rows)
            else:
                # One scan in position order, in three reads: the partition's rows before the
                # chain range, every row of the range (the partition's folded), the
                # partition's rows after it.
                first, hi = check.first_position, check.hi
                if first > _LOWEST_POSITION:
                    before = (_LOWEST_POSITION, min(first - 1, until_position))
                    for rows in _batches(conn.execute(_SELECT, before), batch_size):
                        fold(rows)
                # A row of the range whose stream id is not text is no partition's (SQLite would
                # compare it as text): the range is not intact, and the ordered walk names it.
                own = set(sessions)
                for rows in _batches(conn.execute(_SELECT_RANGE, (first, hi)), batch_size):
                    check.feed(rows)
                    fold([row[:9] for row in rows if row[1] in own and row[0] <= until_position])
                if hi < until_position:
                    for rows in _batches(conn.execute(_SELECT, (hi + 1, until_position)), batch_size):
                        fold(rows)
            spool.commit()
        finally:
            conn.close()
            spool.close()
    segment = None if check is None else check.plain()
    return PartitionResult(projector, spool_path, n_turns, events, segment)


def _batches(cursor: sqlite3.Cursor, size: int) -> Iterator[list[Any]]:
    while rows := cursor.fetchmany(size):
        yield rows


def spooled_turn_values(paths: list[str]) -> Iterator[tuple[Any, ...]]:
    """The turn rows the workers spooled, as :data:`TURN_COLUMNS` tuples, streamed (read on
    the caller's write thread, straight into ``readmodels.write_batch``)."""
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            yield from conn.execute(f"SELECT {', '.join(TURN_COLUMNS)} FROM turns")
        finally:
            conn.close()


def spooled_turn_rows(paths: list[str]) -> Iterator[dict[str, Any]]:
    """:func:`spooled_turn_values` as ``{column: value}`` dicts (the rows a fresh fold compares)."""
    for values in spooled_turn_values(paths):
        yield dict(zip(TURN_COLUMNS, values))


def pool(workers: int) -> ProcessPoolExecutor:
    """Spawned workers: the caller runs an event loop and threads, which must not be forked."""
    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
