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
* ``bare group commit``: the ceiling of W (:mod:`benchmarks.group_commit_ceiling`): 32
  producers, one writer thread, plain sqlite3, ``BEGIN IMMEDIATE`` + ``executemany`` of what is
  queued, each producer awaiting its own commit. The store's row is printed as a ratio to it,
  both the median of ``--repeats`` alternating runs in this process, with the spread of the
  per-repeat ratios (lowest–highest); next to it the process CPU per event (all threads),
  which a loaded machine distorts less than wall time, and its split into the event loop's
  thread and the writer thread (each thread's own CPU clock).
* read-back: ``EventStore.read_all`` decoding every event into its pydantic model, as a ratio
  to plain sqlite3 reading the rows plus ``json.loads`` of each payload (alternating, median).

* ``--chain-cost``: instead, the store alone with and without the hash chain (issue 12: the
  SHA-256 link per row and the SQLite insert trigger refusing replacements, "the guard"),
  interleaved over ``--rounds`` rounds, in four arms (link + guard, link only, guard only,
  neither); prints the medians of process CPU per event and throughput, each against neither.
* ``--guard-variants``: instead, the guard's shapes in plain ``sqlite3``
  (:mod:`benchmarks.guard_variants`; its options follow, e.g. ``--rounds``).

The same figure on a plain workload (a plain table, each producer serialising its own event,
CPU per append split into the loop's and the writer thread's): :mod:`benchmarks.bench_append_plain`.

Usage: ``.venv/bin/python benchmarks/bench_append.py [--sessions 32] [--events 400]
[--per-call 1,8] [--sync FULL,NORMAL] [--repeats 3] [--no-peer] [--chain-cost --rounds 5] [--guard-variants]``. Needs the ``bench`` extra
(eventsourcing), except with ``--chain-cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import group_commit_ceiling, guard_variants
from benchmarks.group_commit_ceiling import Sample
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
                session_id=sid,
                ts=1757000000 + k / 1000,
                stage_id=0,
                request_id=REQUEST_ID,
                num_new_tokens=3,
                text_delta=f"token chunk {k:05d} ",
                model_turn_id=k // 50,
            )
            for k in range(per_session)
        ]
    return out


def fresh_url(root: Path, name: str) -> tuple[str, Path]:
    path = root / f"{name}.db"
    return f"sqlite+aiosqlite:///{path}", path


class _NoChain:
    """Stands for ``hashlib.sha256`` in the planner when the chain is off: a constant digest."""

    def __init__(self, _data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return bytes(32)


def _no_chain(*_args: object) -> bytes:
    return bytes(32)


async def bench_store(
    root: Path,
    events: dict[str, list[EventBase]],
    per_call: int,
    sync: str,
    chain: bool = True,
    trigger: bool | None = None,
) -> tuple[Sample, str]:
    """(the run's :class:`~benchmarks.group_commit_ceiling.Sample`, the store's URL).
    ``chain=False``: the chain's cost taken out (a constant instead of the SHA-256 link, the
    SQLite ``events_no_replace`` trigger dropped; the pieces encoded on the caller's side,
    ~0.3 µs an event, stay), for --chain-cost. ``trigger`` (default: as ``chain``) keeps or drops the trigger alone."""
    from events.store import planning

    url, path = fresh_url(root, f"store-{sync}-{per_call}-{'chain' if chain else 'plain'}")
    if path.exists():
        path.unlink()
    await upgrade(url)
    if not (chain if trigger is None else trigger):
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER events_no_replace")
    saved = planning._sha256, planning.link
    if not chain:
        planning._sha256, planning.link = _NoChain, _no_chain  # type: ignore[assignment]
    try:
        return await _bench_store_threads(url, events, per_call, sync)
    finally:
        planning._sha256, planning.link = saved


async def _bench_store_threads(
    url: str, events: dict[str, list[EventBase]], per_call: int, sync: str
) -> tuple[Sample, str]:
    """(the run's Sample, the store's URL). The writer thread plans, links and inserts: the
    chain's whole cost lands there, away from the loop thread's noise. Its CPU is the
    thread's whole life (it starts with the store's first write)."""
    # tolerate_missing: the "no guard" arms drop events_no_replace on purpose
    store = await EventStore.open(url, synchronous=sync, tolerate_missing=True)  # type: ignore[arg-type]
    total = sum(len(v) for v in events.values())

    async def session(sid: str, evs: list[EventBase]) -> None:
        for k in range(0, len(evs), per_call):
            await store.append(sid, evs[k : k + per_call], expected_version=k)

    t0, cpu0, loop0 = time.perf_counter(), time.process_time(), time.thread_time()
    await asyncio.gather(*(session(sid, evs) for sid, evs in events.items()))
    elapsed, cpu_s, loop_s = time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - loop0
    writer_s = _thread_cpu_s(store)
    assert await store.head_position() == total, "events lost"
    await store.close()
    per_event = 1e6 / total
    return Sample(total / elapsed, cpu_s * per_event, loop_s * per_event, writer_s * per_event), url


def _thread_cpu_s(store: EventStore) -> float:
    """CPU seconds of the store's writer thread so far (its whole life: it starts with the
    store's first write); NaN when the backend has none."""
    thread = store.recorder.backend.writer_thread
    ident = getattr(getattr(thread, "_thread", None), "ident", None)
    if ident is None:
        return float("nan")
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


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
    for evs in events.values():
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
        datastore = SQLiteDatastore(
            str(root / f"es-{sync}-{per_call}.db"), pool_size=40, max_overflow=10, lock_timeout=30
        )
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
                            StoredEvent(
                                originator_id=oid,
                                originator_version=k + i + 1,
                                topic=e.type,  # type: ignore[attr-defined]
                                state=NewRow.from_event(e).data.encode(),
                            )
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


def bare_rows(events: dict[str, list[EventBase]]) -> dict[str, list[group_commit_ceiling.Row]]:
    """The events as the bare group commit's prepared rows (payload JSON dumped up front)."""
    out = {}
    for sid, evs in events.items():
        rows = [NewRow.from_event(e) for e in evs]
        out[sid] = [
            (r.stream_id, v, r.event_id, r.type, r.schema_version, r.ts_us, r.data) for v, r in enumerate(rows, start=1)
        ]
    return out


async def bench_bare(root: Path, rows: dict[str, list[group_commit_ceiling.Row]], per_call: int, sync: str) -> Sample:
    url, path = fresh_url(root, f"bare-{sync}-{per_call}")
    if path.exists():
        path.unlink()
    await upgrade(url)
    return await group_commit_ceiling.run(path, sync, rows, per_call)


def paired(
    root: Path, events: dict[str, list[EventBase]], per_call: int, sync: str, repeats: int
) -> tuple[Sample, Sample, str, tuple[float, float]]:
    """(bare ceiling, store, a store URL, the spread of the store/bare throughput ratio over the
    repeats as (lowest, highest)): each :class:`Sample` the medians of ``repeats`` alternating
    runs, field by field; each repeat's ratio is its store run against its bare run."""
    rows = bare_rows(events)
    runs: dict[str, list[Sample]] = {"bare": [], "store": []}
    url = ""
    for r in range(repeats):
        for which in ("bare", "store") if r % 2 == 0 else ("store", "bare"):
            if which == "bare":
                runs["bare"].append(asyncio.run(bench_bare(root, rows, per_call, sync)))
            else:
                sample, url = asyncio.run(bench_store(root, events, per_call, sync))
                runs["store"].append(sample)

    def medians(samples: list[Sample]) -> Sample:
        return Sample(*(statistics.median(s[i] for s in samples) for i in range(len(Sample._fields))))

    ratios = [s.rate / b.rate for s, b in zip(runs["store"], runs["bare"])]
    return medians(runs["bare"]), medians(runs["store"]), url, (min(ratios), max(ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--events", type=int, default=400, help="events per session")
    ap.add_argument("--per-call", default="1,8", help="events per append call (comma list)")
    ap.add_argument("--sync", default="FULL,NORMAL", help="SQLite synchronous levels (comma list)")
    ap.add_argument("--dir", default=None, help="where the database files go (default: a temp dir)")
    ap.add_argument("--chain-cost", action="store_true", help="the store with and without the hash chain only")
    ap.add_argument("--guard-variants", action="store_true", help="the guard trigger's shapes (guard_variants.py)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds for --chain-cost")
    ap.add_argument("--repeats", type=int, default=3, help="alternating repeats of store vs bare group commit")
    ap.add_argument("--no-peer", action="store_true", help="skip the eventsourcing and executemany rows")
    if "--guard-variants" in sys.argv:
        sys.argv.remove("--guard-variants")
        guard_variants.main()
        return
    args = ap.parse_args()
    if args.chain_cost:
        chain_cost(args)
        return
    events = make_events(args.sessions, args.events)
    size = sum(len(NewRow.from_event(e).data) for e in next(iter(events.values()))) / args.events
    per_calls = [int(x) for x in args.per_call.split(",")]
    print(
        f"{args.sessions} sessions x {args.events} events, payload ~{size:.0f} bytes/event; "
        f"store vs bare group commit: median of {args.repeats} alternating repeats"
    )
    print(
        f"{'row':48} {'events/s':>12} {'ratio':>7} {'spread':>11} {'CPU µs/ev':>10} {'ratio':>7} "
        f"{'loop µs':>8} {'writer µs':>9}"
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        read_url = None
        for sync in args.sync.split(","):
            if not args.no_peer:
                print(
                    f"{'sqlite3 executemany, 1 txn (insert ceiling) ' + sync:48} "
                    f"{bench_sqlite_ceiling(root, events, sync):12,.0f}"
                )
            for pc in per_calls:
                bare, store, url, (low, high) = paired(root, events, pc, sync, args.repeats)
                read_url = read_url or url
                print(
                    f"{f'bare group commit (ceiling) {sync}, {pc}/call':48} {bare.rate:12,.0f} {1.0:7.2f} {'':>11} "
                    f"{bare.cpu_us:10.1f} {1.0:7.2f} {bare.loop_us:8.1f} {bare.writer_us:9.1f}"
                )
                print(
                    f"{f'duplex-ledger store {sync}, {pc}/call':48} {store.rate:12,.0f} {store.rate / bare.rate:7.2f} "
                    f"{f'{low:.2f}–{high:.2f}':>11} {store.cpu_us:10.1f} {bare.cpu_us / store.cpu_us:7.2f} "
                    f"{store.loop_us:8.1f} {store.writer_us:9.1f}"
                )
                if not args.no_peer:
                    es = bench_eventsourcing(root, events, pc, sync)
                    print(f"{f'eventsourcing SQLite recorder {sync}, {pc}/call':48} {es:12,.0f} {es / bare.rate:7.2f}")
        assert read_url is not None
        ceiling, ours = read_back(read_url, args.repeats)
        print(f"{'read-back ceiling: sqlite3 rows + json.loads':48} {ceiling:12,.0f} {1.0:7.2f}")
        print(f"{'read-back, read_all decoded into models':48} {ours:12,.0f} {ours / ceiling:7.2f}")


def read_ceiling(url: str) -> float:
    """Events/s of the read-back ceiling: every row through plain sqlite3, payload json.loads."""
    path = url.split("///", 1)[1]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    loads = json.loads
    t0 = time.perf_counter()
    n = 0
    for row in conn.execute(
        "SELECT position, stream_id, version, event_id, type, schema_version, ts_us,"
        " recorded_at_us, data, hash FROM events ORDER BY position"
    ):
        loads(row[8])
        n += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    return n / elapsed


def read_back(url: str, repeats: int) -> tuple[float, float]:
    """(ceiling ev/s, read_all ev/s): medians of ``repeats`` alternating runs."""
    rates: dict[str, list[float]] = {"ceiling": [], "ours": []}
    for r in range(repeats):
        for which in ("ceiling", "ours") if r % 2 == 0 else ("ours", "ceiling"):
            rates[which].append(read_ceiling(url) if which == "ceiling" else asyncio.run(bench_read(url)))
    return statistics.median(rates["ceiling"]), statistics.median(rates["ours"])


CHAIN_ARMS: dict[str, tuple[bool, bool]] = {
    "link + guard": (True, True),
    "link only": (True, False),
    "guard only": (False, True),
    "neither": (False, False),
}
"""--chain-cost arms: name -> (SHA-256 link computed, ``events_no_replace`` trigger kept)."""


def chain_cost(args: argparse.Namespace) -> None:
    """The store with and without the chain, interleaved (rotating the arm order per round),
    medians: throughput and process CPU per event (all threads; less distorted by a loaded
    machine). Four arms (:data:`CHAIN_ARMS`) split the cost: the SHA-256 link and the
    ``events_no_replace`` guard each alone and together, each row against neither; also the
    SQLite writer thread's CPU per event (where the link and the trigger run) and its
    difference to neither in µs."""
    events = make_events(args.sessions, args.events)
    print(
        f"{args.sessions} sessions x {args.events} events; {args.rounds} interleaved rounds; "
        f"process CPU µs per event and ev/s, medians; each arm against 'neither'"
    )
    print(
        f"{'row':34} {'arm':14} {'CPU µs/ev':>10} {'ev/s':>9} {'CPU vs neither':>15} {'ev/s vs neither':>16} "
        f"{'writer µs/ev':>10} {'vs neither':>9}"
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for sync in args.sync.split(","):
            for pc in (int(x) for x in args.per_call.split(",")):
                runs: dict[str, list[Sample]] = {name: [] for name in CHAIN_ARMS}
                names = list(CHAIN_ARMS)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        chain, trigger = CHAIN_ARMS[name]
                        runs[name].append(asyncio.run(bench_store(Path(tmp), events, pc, sync, chain, trigger))[0])
                rate = {n: statistics.median(x.rate for x in runs[n]) for n in names}
                cpu = {n: statistics.median(x.cpu_us for x in runs[n]) for n in names}
                writer = {n: statistics.median(x.writer_us for x in runs[n]) for n in names}
                for n in names:
                    print(
                        f"{f'duplex-ledger store {sync}, {pc}/call':34} {n:14} {cpu[n]:10.1f} {rate[n]:9,.0f} "
                        f"{cpu[n] / cpu['neither'] - 1:+15.1%} {rate[n] / rate['neither'] - 1:+16.1%} "
                        f"{writer[n]:10.1f} {writer[n] - writer['neither']:+9.1f}"
                    )


if __name__ == "__main__":
    main()
