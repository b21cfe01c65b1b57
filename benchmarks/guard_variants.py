"""Micro-bench of the SQLite guard that refuses an insert replacing a stored row (issue 12).

``INSERT OR REPLACE`` / ``REPLACE INTO`` resolve a conflict on a UNIQUE index or the primary
key by deleting the stored row; the ledger refuses that with a BEFORE INSERT trigger. This
measures what the guard costs per inserted row, variant by variant, in plain ``sqlite3`` on
the ledger's ``events`` table: same process, the variants alternated in every round (order
rotated), CPU time of the inserting thread per row, medians; the guard's cost is the
difference in CPU inside ``executemany`` against ``neither``, shown in µs/row and as a share
of ``neither``'s whole row (inserts + commit). Each round inserts
``--rows`` rows into each variant's log, pre-filled with ``--prefill`` rows over 32 streams,
in transactions of ``--batch`` rows, the variants taking turns batch by batch (32: the group commit's batch with 32 sessions) (``BEGIN IMMEDIATE`` + one ``executemany``, as the store's
group commit does), WAL, ``synchronous`` FULL and NORMAL.

Variants (:data:`VARIANTS`; ``neither`` is today's schema without any guard):

* ``exists3`` — the 0003 trigger: WHEN EXISTS position / EXISTS event_id / EXISTS (stream, version).
* ``body3`` — the same three probes in the body (``SELECT RAISE … WHERE …``), no WHEN clause.
* ``maxpos`` — the position probe as ``NEW.position <= (SELECT max(position) …)`` (the
  rightmost rowid: the same leaf every time, since the writer inserts head + 1).
* ``maxpos+maxver`` — also the stream probe as ``NEW.version <= (SELECT max(version) …
  WHERE stream_id = NEW.stream_id)``.
* ``plain-idx`` — event_id and (stream_id, version) indexes NOT unique (so REPLACE has no
  conflict to resolve but the rowid); the trigger enforces uniqueness itself: position via
  max, event_id and (stream, version) probes. Each probe replaces a unique check the index
  no longer does.
* ``plain-idx eid`` — as ``plain-idx`` without the (stream, version) probe: that pair's
  uniqueness is then the writer's (it allocates versions under the write lock) and verify's.
* ``plain-idx no-guard`` — plain indexes, no trigger (for reference: not a safe schema).
* ``trigger floor`` — a trigger whose WHEN is a constant false: the cost of firing at all.
* ``… multirow`` — the batch as one multi-row ``INSERT … VALUES`` statement, not ``executemany``.

Usage: ``.venv/bin/python benchmarks/guard_variants.py [--rounds 7] [--rows 4000] [--batch 16]``
(also ``bench_append.py --guard-variants``).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

_TABLE = (
    "CREATE TABLE events (position INTEGER NOT NULL PRIMARY KEY, stream_id TEXT NOT NULL, version BIGINT NOT NULL,"
    " event_id TEXT NOT NULL, type TEXT NOT NULL, schema_version INTEGER NOT NULL, ts_us BIGINT NOT NULL,"
    " recorded_at_us BIGINT NOT NULL, data TEXT NOT NULL, hash BLOB{unique})"
)
_UNIQUE = (
    ", CONSTRAINT uq_events_stream_version UNIQUE (stream_id, version), CONSTRAINT uq_events_event_id UNIQUE (event_id)"
)
_PLAIN = (
    "CREATE INDEX ix_events_stream_version ON events (stream_id, version)",
    "CREATE INDEX ix_events_event_id ON events (event_id)",
)
_COMMON = (
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'no'); END",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'no'); END",
    "CREATE INDEX ix_events_lifecycle ON events (position) "
    "WHERE type IN ('SessionOpened', 'SessionTakenOver', 'SessionClosed')",
)
_RAISE = "SELECT RAISE(ABORT, 'events is append-only: an insert may not replace a stored row')"
_POS = "EXISTS (SELECT 1 FROM events WHERE position = NEW.position)"
_MAXPOS = "NEW.position <= (SELECT max(position) FROM events)"
_EID = "EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)"
_SV = "EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)"
_MAXVER = "NEW.version <= (SELECT max(version) FROM events WHERE stream_id = NEW.stream_id)"


def _when(*checks: str) -> str:
    return f"CREATE TRIGGER events_no_replace BEFORE INSERT ON events WHEN {' OR '.join(checks)} BEGIN {_RAISE}; END"


VARIANTS: dict[str, tuple[bool, str | None] | tuple[bool, str | None, bool]] = {
    "neither": (True, None),
    "plain-idx no-guard": (False, None),
    "trigger floor": (True, _when("0")),
    "exists3": (True, _when(_POS, _EID, _SV)),
    "body3": (
        True,
        f"CREATE TRIGGER events_no_replace BEFORE INSERT ON events BEGIN {_RAISE} WHERE {_POS} OR {_EID} OR {_SV}; END",
    ),
    "maxpos": (True, _when(_MAXPOS, _EID, _SV)),
    "maxpos+maxver": (True, _when(_MAXPOS, _EID, _MAXVER)),
    "plain-idx": (False, _when(_MAXPOS, _EID, _SV)),
    "plain-idx eid": (False, _when(_MAXPOS, _EID)),
    "neither multirow": (True, None, True),
    "exists3 multirow": (True, _when(_POS, _EID, _SV), True),
    "plain-idx multirow": (False, _when(_POS, _EID, _SV), True),
}
"""name -> (event_id and (stream_id, version) indexes unique, the guard trigger's DDL or None[,
multirow]): ``multirow`` inserts a batch with one ``INSERT … VALUES (…), (…), …`` statement
instead of ``executemany`` (SQLite sets a trigger's frame up once per statement run)."""

_INSERT = (
    "INSERT INTO events (position, stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, "
    "data, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DATA = '{"stage_id":0,"request_id":"duplex-s.czE.i.0.e.0.r.stage0_t3","num_new_tokens":3,"text_delta":"token chunk 00001 ","model_turn_id":0}'


def _multirow(count: int) -> str:
    return _INSERT.split(" VALUES ")[0] + " VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * count)


def _rows(start: int, count: int, versions: list[int]) -> list[tuple[object, ...]]:
    """``count`` rows from position ``start``, round-robin over the streams (versions advanced)."""
    out: list[tuple[object, ...]] = []
    for position in range(start, start + count):
        stream = position % len(versions)
        versions[stream] += 1
        out.append(
            (position, f"bench-session-{stream:02d}", versions[stream], str(uuid.uuid4()), "StageOutput", 1,
             1757000000000000 + position, 1757000000000000 + position, _DATA, bytes(32))
        )  # fmt: skip
    return out


def _database(path: Path, variant: str, sync: str, prefill: int) -> tuple[sqlite3.Connection, list[int]]:
    unique, trigger = VARIANTS[variant][:2]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute(_TABLE.format(unique=_UNIQUE if unique else ""))
    for ddl in (*_COMMON, *(() if unique else _PLAIN), *((trigger,) if trigger else ())):
        conn.execute(ddl)
    versions = [0] * 32
    conn.execute("BEGIN")
    conn.executemany(_INSERT, _rows(1, prefill, versions))
    conn.execute("COMMIT")
    return conn, versions


def measure(
    root: Path, names: list[str], sync: str, prefill: int, rounds: int, rows: int, batch: int
) -> dict[str, list[tuple[float, float]]]:
    """Per variant, per round: (CPU µs of this thread per inserted row, of which inside
    ``executemany``). Every variant has its own database file, all open at once; each round
    inserts ``rows`` rows into each, one batch per variant in turn (order rotated every batch),
    so a load spike on the machine falls on every variant alike. The guard's cost is all inside
    the inserts; the commit (WAL append, sync) is the same for every variant."""
    conns: dict[str, tuple[sqlite3.Connection, list[int]]] = {}
    for name in names:
        path = root / f"{name.replace(' ', '_').replace('+', '_')}-{sync}.db"
        conns[name] = _database(path, name, sync, prefill)
    clock = time.thread_time
    out: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    position = prefill + 1
    for _ in range(rounds):
        total = dict.fromkeys(names, 0.0)
        insert = dict.fromkeys(names, 0.0)
        for k in range(rows // batch):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                conn, versions = conns[name]
                chunk = _rows(position, batch, list(versions))
                t0 = clock()
                conn.execute("BEGIN IMMEDIATE")
                t1 = clock()
                if len(VARIANTS[name]) > 2:
                    conn.execute(_multirow(len(chunk)), [v for row in chunk for v in row])
                else:
                    conn.executemany(_INSERT, chunk)
                t2 = clock()
                conn.execute("COMMIT")
                total[name] += clock() - t0
                insert[name] += t2 - t1
            for name in names:  # every database got the same rows: advance the versions once
                _rows(position, batch, conns[name][1])
            position += batch
        per_row = 1e6 / (rows // batch * batch)
        for name in names:
            out[name].append((total[name] * per_row, insert[name] * per_row))
    for conn, _ in conns.values():
        conn.close()
    return out


def check_refusals(root: Path, variant: str) -> list[str]:
    """The replacement tricks a variant does not refuse, and what they did (empty: all refused)."""
    conn, _ = _database(root / f"check-{variant.replace(' ', '_').replace('+', '_')}.db", variant, "NORMAL", 3)
    tricks = {
        "INSERT OR REPLACE same position": "INSERT OR REPLACE INTO events SELECT position, stream_id, version, "
        "'x' || event_id, type, schema_version, ts_us, recorded_at_us, 'edited', hash FROM events WHERE position = 2",
        "REPLACE INTO new position, stored event_id": "REPLACE INTO events SELECT 99, 's-new', 1, event_id, type, "
        "schema_version, ts_us, recorded_at_us, data, hash FROM events WHERE position = 2",
        "REPLACE INTO new position, stored (stream, version)": "REPLACE INTO events SELECT 99, stream_id, version, "
        "'new-id', type, schema_version, ts_us, recorded_at_us, data, hash FROM events WHERE position = 2",
    }
    stored = conn.execute("SELECT * FROM events WHERE position <= 3 ORDER BY position").fetchall()
    through = []
    for name, sql in tricks.items():
        conn.execute("SAVEPOINT trick")
        try:
            conn.execute(sql)
        except sqlite3.IntegrityError:
            continue
        finally:
            after = conn.execute("SELECT * FROM events WHERE position <= 3 ORDER BY position").fetchall()
            conn.execute("ROLLBACK TO trick")
            conn.execute("RELEASE trick")
        through.append(
            name + (": a stored row replaced" if after != stored else ": inserted beside (verify's to catch)")
        )
    conn.close()
    return through


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", type=int, default=1600, help="rows inserted per variant per round")
    ap.add_argument("--batch", type=int, default=32, help="rows per transaction")
    ap.add_argument("--prefill", type=int, default=20_000, help="rows already in the log")
    ap.add_argument("--sync", default="FULL,NORMAL")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: all)")
    args = ap.parse_args()
    names = args.variants.split(",")
    print(
        f"guard variants: {args.rounds} rounds x {args.rows} rows, {args.batch} rows/txn, "
        f"prefill {args.prefill}; thread CPU µs per row, median; vs 'neither'"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in names:
            if VARIANTS[name][1] is not None and name != "trigger floor" and (leaks := check_refusals(root, name)):
                print(f"  {name}: not refused: {leaks}")
        for sync in args.sync.split(","):
            runs = measure(root, names, sync, args.prefill, args.rounds, args.rows, args.batch)
            total = {n: statistics.median(t for t, _ in runs[n]) for n in names}
            insert = {n: statistics.median(i for _, i in runs[n]) for n in names}
            print(
                f"  {sync:6} {'variant':16} {'total µs/row':>12} {'insert µs/row':>13} {'guard µs':>9} {'vs neither':>10}"
            )
            for name in names:
                guard = insert[name] - insert.get("neither", insert[name])
                share = guard / total["neither"] if "neither" in total else 0.0
                print(f"  {sync:6} {name:16} {total[name]:12.2f} {insert[name]:13.2f} {guard:+9.2f} {share:+10.1%}")


if __name__ == "__main__":
    main()
