"""Parallel full rebuild of a SQLite ledger: one worker process per partition of the sessions.

Every fold keeps its state per session, and an event only ever touches its own session's
state, so the log splits into independent sub-logs by session. :func:`plan_partitions`
deals the sessions out by event count (largest first, each to the lightest partition), so
the workers finish together even when a few sessions are much longer than the rest. Each
worker (a spawned process, so it shares no GIL, thread or connection with the caller) reads
the log file read-only with plain ``sqlite3``, keeps the rows of its sessions (SQLite
filters them against a temporary table of the partition's session ids, before Python sees
a row), decodes them into read-side twins and folds them in log order with its own
:class:`Projector`; it returns its projector and its finalized turn rows. The caller merges the projectors
(:meth:`Projector.merged`) and writes every read-model row and the checkpoint in ONE
transaction, exactly as the sequential runner's last batch would have (CASE-16: a crash
before the commit leaves no rows and no checkpoint, and the next run starts over).

Only the log-wide "now" is shared between sessions: the resources fold evaluates orphans
against the ts of the last event applied, which the merge takes from the partition holding
the log's last position — the same value a sequential fold ends with.

Used by :meth:`ProjectionRunner.rebuild` for SQLite logs of at least
:data:`PARALLEL_MIN_EVENTS` events (spawning workers costs ~1 s); PostgreSQL rebuilds run
sequentially.
"""

from __future__ import annotations

import gc
import heapq
import os
import pickle
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from events.store.rows import StoredRow, decode_rows
from projections.projector import Projector
from projections.shell import readmodels

PARALLEL_MIN_EVENTS = 200_000
"""Logs shorter than this are rebuilt sequentially by default."""

# ``+stream_id``: no index for this term, so SQLite scans the table in position order (one
# pass, no sort) and checks each row against the temporary table in C.
_SELECT = (
    "SELECT position, stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, data, hash "
    "FROM events WHERE position <= ? AND +stream_id IN temp.dl_partition ORDER BY position"
)


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


_TURN_COLUMNS = tuple(c.name for c in readmodels.turn_tables.c)


@dataclass
class PartitionResult:
    """A worker's projector, and the file its finalized turn rows were spooled to (so neither
    the worker nor the caller holds every turn table in memory)."""

    projector: Projector
    turns_path: str
    turns: int
    events: int


def fold_partition(
    db_path: str, part: int, sessions: Sequence[str], until_position: int, spool_dir: str, batch_size: int = 20_000
) -> bytes:
    """Worker: fold the events of ``sessions`` (partition number ``part``) with position <=
    ``until_position``, spooling finalized turn rows to a SQLite file in ``spool_dir``;
    returns a pickled :class:`PartitionResult`. Raises what decoding raises (the caller sees
    it)."""
    gc.disable()  # the folds allocate many short-lived acyclic objects (see events.gc_pause)
    conn = _read_only(db_path)
    conn.execute("CREATE TEMP TABLE dl_partition (stream_id TEXT PRIMARY KEY) WITHOUT ROWID")
    conn.executemany("INSERT INTO temp.dl_partition VALUES (?)", ((s,) for s in sessions))
    spool_path = os.path.join(spool_dir, f"turns-{part}.db")
    spool = sqlite3.connect(spool_path)
    spool.execute(f"CREATE TABLE turns ({', '.join(_TURN_COLUMNS)})")
    insert = f"INSERT INTO turns VALUES ({', '.join('?' * len(_TURN_COLUMNS))})"
    projector = Projector()
    events = n_turns = 0
    try:
        cursor = conn.execute(_SELECT, (until_position,))
        while rows := cursor.fetchmany(batch_size):
            turn_rows, _ = readmodels.fold_batch(projector, decode_rows(map(StoredRow._make, rows), as_struct=True))
            spool.executemany(insert, [tuple(row[c] for c in _TURN_COLUMNS) for row in turn_rows])
            events += len(rows)
            n_turns += len(turn_rows)
        spool.commit()
    finally:
        conn.close()
        spool.close()
    return pickle.dumps(PartitionResult(projector, spool_path, n_turns, events), protocol=pickle.HIGHEST_PROTOCOL)


def spooled_turn_rows(paths: list[str], chunk: int = 5000) -> Iterator[dict[str, Any]]:
    """The turn rows the workers spooled, streamed (read on the caller's write thread)."""
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            cursor = conn.execute(f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns")
            while rows := cursor.fetchmany(chunk):
                for r in rows:
                    yield dict(zip(_TURN_COLUMNS, r))
        finally:
            conn.close()


def pool(workers: int) -> ProcessPoolExecutor:
    """Spawned workers: the caller runs an event loop and threads, which must not be forked."""
    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
