"""Append throughput: duplex-ledger's store vs. plain sqlite3 (ceiling) vs. eventsourcing.

32 concurrent sessions each append their own ~200-byte events (StageOutput with a text
delta), ``--per-call`` events per append call, awaiting each call before the next (an append
returns only once durable). Rows, all in one run on the same prepared events:

* ``duplex-ledger``: EventStore on SQLite, synchronous FULL and NORMAL, one row per
  ``--per-call`` value (32 coroutines; group commit does the batching).
* ``sqlite3 executemany``: the same rows inserted into the same ``events`` table (same
  indexes and triggers) in ONE transaction — the ceiling, no durability per call.
* ``eventsourcing``: v9.5.6 ``SQLiteApplicationRecorder`` (via ``SQLiteDatastore``), 32
  threads calling ``insert_events`` with the same batches.
* read-back: ``EventStore.read_all`` decoding every event into its pydantic model.

* ``--chain-cost``: instead, the store alone with and without the hash chain (issue 12: the
  SHA-256 link per row and the SQLite insert trigger refusing replacements), interleaved over
  ``--rounds`` rounds; prints the medians and the slowdown.

Usage: ``.venv/bin/python benchmarks/bench_append.py [--sessions 32] [--events 400]
[--per-call 1,8] [--sync FULL,NORMAL] [--chain-cost --rounds 5]``. Needs the ``bench`` extra
(eventsourcing), except with ``--chain-cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from events.store import EventStore
from events.store.migrate import upgrade
from events.store.rows import NewRow
from events.types import EventBase, StageOutput

REQUEST_ID = "duplex-s.czE.i.0.e.0.r.stage0_t3"


def make_events(sessions: int, per_session: int) -> dict[str, list[EventBase]]:
    """~200 bytes of payload JSON per event."""
    out: dict[str, list[EventBase]] = {}
    for s in range(sessions):
        sid = f"bench-session-{s:02d}"
        out[sid] = [
            StageOutput(
                session_id=sid, ts=1757000000 + k / 1000, stage_id=0, request_id=REQUEST_ID,
                num_new_tokens=3, text_delta=f"token chunk {k:05d} ", model_turn_id=k // 50,
            )
            for k in range(per_session)
        ]
    return out


def fresh_url(root: Path, name: str) -> tuple[str, Path]:
    path = root / f"{name}.db"
    return f"sqlite+aiosqlite:///{path}", path


def _no_chain(*_args: object) -> bytes:
    return bytes(32)


async def bench_store(root: Path, events: dict[str, list[EventBase]], per_call: int, sync: str,
                      chain: bool = True) -> tuple[float, str]:
    """``chain=False``: the chain's cost taken out (a constant instead of the SHA-256 link,
    the SQLite ``events_no_replace`` trigger dropped), for --chain-cost."""
    from events.store import planning

    url, path = fresh_url(root, f"store-{sync}-{per_call}-{'chain' if chain else 'plain'}")
    if path.exists():
        path.unlink()
    await upgrade(url)
    if not chain:
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER events_no_replace")
    linked = planning.row_hash
    planning.row_hash = linked if chain else _no_chain  # type: ignore[assignment]
    try:
        return await _bench_store(url, events, per_call, sync)
    finally:
        planning.row_hash = linked


async def _bench_store(url: str, events: dict[str, list[EventBase]], per_call: int, sync: str) -> tuple[float, str]:
    store = await EventStore.open(url, synchronous=sync)  # type: ignore[arg-type]
    total = sum(len(v) for v in events.values())

    async def session(sid: str, evs: list[EventBase]) -> None:
        for k in range(0, len(evs), per_call):
            await store.append(sid, evs[k : k + per_call], expected_version=k)

    t0 = time.perf_counter()
    await asyncio.gather(*(session(sid, evs) for sid, evs in events.items()))
    elapsed = time.perf_counter() - t0
    assert await store.head_position() == total, "events lost"
    await store.close()
    return total / elapsed, url


async def bench_read(url: str) -> float:
    store = await EventStore.open(url)
    t0 = time.perf_counter()
    n = 0
    async for _ in store.read_all(batch_size=2000):
        n += 1
    elapsed = time.perf_counter() - t0
    await store.close()
    return n / elapsed


def bench_sqlite_ceiling(root: Path, events: dict[str, list[EventBase]], sync: str) -> float:
    url, path = fresh_url(root, f"ceiling-{sync}")
    asyncio.run(upgrade(url))
    rows = []
    pos = 0
    for sid, evs in events.items():
        for v, e in enumerate(evs, start=1):
            r = NewRow.from_event(e)
            pos += 1
            rows.append((pos, r.stream_id, v, r.event_id, r.type, r.schema_version, r.ts_us, 0, r.data))
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous={sync}")
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO events (position, stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return len(rows) / elapsed


def bench_eventsourcing(root: Path, events: dict[str, list[EventBase]], per_call: int, sync: str) -> float:
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteConnectionPool, SQLiteDatastore

    original: Callable = SQLiteConnectionPool._create_connection

    def create_connection(self):  # type: ignore[no-untyped-def]
        c = original(self)
        c._sqlite_conn.execute(f"PRAGMA synchronous={sync}")
        return c

    SQLiteConnectionPool._create_connection = create_connection  # same durability level as ours
    try:
        datastore = SQLiteDatastore(str(root / f"es-{sync}-{per_call}.db"), pool_size=40, max_overflow=10, lock_timeout=30)
        recorder = SQLiteApplicationRecorder(datastore)
        recorder.create_table()
        errors: list[BaseException] = []

        def session(sid: str, evs: list[EventBase]) -> None:
            # Same work per event as our append: serialise the model, then store it.
            oid = uuid.uuid5(uuid.NAMESPACE_URL, sid)
            try:
                for k in range(0, len(evs), per_call):
                    recorder.insert_events(
                        [
                            StoredEvent(originator_id=oid, originator_version=k + i + 1, topic=e.type,  # type: ignore[attr-defined]
                                        state=NewRow.from_event(e).data.encode())
                            for i, e in enumerate(evs[k : k + per_call])
                        ]
                    )
            except BaseException as exc:  # report, do not hang
                errors.append(exc)

        threads = [threading.Thread(target=session, args=item) for item in events.items()]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            return float("nan")
        total = sum(len(v) for v in events.values())
        assert recorder.max_notification_id() == total
        datastore.close()
        return total / elapsed
    finally:
        SQLiteConnectionPool._create_connection = original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--events", type=int, default=400, help="events per session")
    ap.add_argument("--per-call", default="1,8", help="events per append call (comma list)")
    ap.add_argument("--sync", default="FULL,NORMAL", help="SQLite synchronous levels (comma list)")
    ap.add_argument("--dir", default=None, help="where the database files go (default: a temp dir)")
    ap.add_argument("--chain-cost", action="store_true", help="the store with and without the hash chain only")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds for --chain-cost")
    args = ap.parse_args()
    if args.chain_cost:
        chain_cost(args)
        return
    events = make_events(args.sessions, args.events)
    size = sum(len(NewRow.from_event(e).data) for e in next(iter(events.values()))) / args.events
    per_calls = [int(x) for x in args.per_call.split(",")]
    print(f"{args.sessions} sessions x {args.events} events, payload ~{size:.0f} bytes/event")
    print(f"{'row':48} {'events/s':>12}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        read_url = None
        for sync in args.sync.split(","):
            print(f"{'sqlite3 executemany, 1 txn (ceiling) ' + sync:48} {bench_sqlite_ceiling(root, events, sync):12,.0f}")
            for pc in per_calls:
                rate, url = asyncio.run(bench_store(root, events, pc, sync))
                read_url = read_url or url
                print(f"{f'duplex-ledger store {sync}, {pc}/call':48} {rate:12,.0f}")
                es = bench_eventsourcing(root, events, pc, sync)
                print(f"{f'eventsourcing SQLite recorder {sync}, {pc}/call':48} {es:12,.0f}")
        assert read_url is not None
        print(f"{'read-back, decoded into models':48} {asyncio.run(bench_read(read_url)):12,.0f}")


def chain_cost(args: argparse.Namespace) -> None:
    """The store with and without the chain, interleaved (with first in even rounds), medians."""
    import statistics

    events = make_events(args.sessions, args.events)
    print(f"{args.sessions} sessions x {args.events} events; {args.rounds} interleaved rounds")
    print(f"{'row':40} {'with chain':>12} {'without':>12} {'slowdown':>9}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for sync in args.sync.split(","):
            for pc in (int(x) for x in args.per_call.split(",")):
                rates: dict[bool, list[float]] = {True: [], False: []}
                for r in range(args.rounds):
                    for chain in ((True, False) if r % 2 == 0 else (False, True)):
                        rates[chain].append(asyncio.run(bench_store(Path(tmp), events, pc, sync, chain))[0])
                on, off = statistics.median(rates[True]), statistics.median(rates[False])
                print(f"{f'duplex-ledger store {sync}, {pc}/call':40} {on:12,.0f} {off:12,.0f} {off / on - 1:9.1%}")


if __name__ == "__main__":
    main()
