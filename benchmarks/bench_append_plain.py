"""Append on a plain workload: the store vs. plain ``sqlite3`` group commit (issue 23 step 6).

The independent check of the append figure: ``--streams`` concurrent streams (32), each
appending ``--events`` events (200) one per awaited append, ~200 bytes of payload each, SQLite
in WAL mode at ``synchronous=FULL`` (``--sync``). Two arms, alternating in one process
(``--rounds``, the order flipped every round), medians:

* ``plain``: what an application without the ledger writes: 32 asyncio producers, each
  serialising its event (``model_dump_json``, the event as one JSON text) and putting
  ``(stream_id, version, event_id, data)`` on a queue, then awaiting its own future; one writer
  thread takes everything queued, commits it with ``BEGIN IMMEDIATE`` + ``executemany`` +
  ``COMMIT`` into a plain table (``UNIQUE (stream_id, version)``, ``UNIQUE (event_id)``) and
  resolves the batch's futures with one ``call_soon_threadsafe``.
* ``store``: :meth:`EventStore.append` of the same events (``expected_version`` checked), on a
  fresh ledger file.

Printed per arm: appends/s (wall), CPU µs per append on the event loop's thread and on the
writer thread (``pthread_getcpuclockid``; less noisy than wall on a loaded machine), and the
store/plain ratios (throughput; CPU as plain/store, so 1.0 = as cheap).

Usage: ``.venv/bin/python benchmarks/bench_append_plain.py [--streams 32] [--events 200]
[--sync FULL] [--rounds 5] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.group_commit_ceiling import resolve_futures, take_batch, thread_cpu_s  # noqa: E402
from events.store import EventStore
from events.types import EventBase, StageOutput

PLAIN_TABLE = (
    "CREATE TABLE events (position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, version INTEGER NOT NULL,"
    " event_id TEXT NOT NULL, data TEXT NOT NULL, UNIQUE (stream_id, version), UNIQUE (event_id))"
)
PLAIN_INSERT = "INSERT INTO events (stream_id, version, event_id, data) VALUES (?, ?, ?, ?)"
Sample = tuple[float, float, float]  # appends/s, loop-thread CPU µs/append, writer-thread CPU µs/append


def make_events(streams: int, per_stream: int) -> dict[str, list[EventBase]]:
    """``streams`` streams of ``per_stream`` StageOutput events, ~200 bytes of payload each."""
    return {
        f"plain-{s:02d}": [
            StageOutput(
                session_id=f"plain-{s:02d}",
                ts=1757000000 + k / 1000,
                stage_id=0,
                request_id="duplex-s.czE.i.0.e.0.r.stage0_t3",
                num_new_tokens=3,
                text_delta=f"token chunk {k:05d} ",
                model_turn_id=k // 50,
            )
            for k in range(per_stream)
        ]
        for s in range(streams)
    }


def _plain_writer(path: Path, sync: str, inbox: queue.SimpleQueue[Any], loop: asyncio.AbstractEventLoop) -> None:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={sync}")
    while (batch := take_batch(inbox)) is not None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(PLAIN_INSERT, [row for row, _ in batch])
        conn.execute("COMMIT")
        loop.call_soon_threadsafe(resolve_futures, [f for _, f in batch])
    conn.close()


async def run_plain(path: Path, sync: str, events: dict[str, list[EventBase]]) -> Sample:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(PLAIN_TABLE)
    loop = asyncio.get_running_loop()
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    thread = threading.Thread(target=_plain_writer, args=(path, sync, inbox, loop), daemon=True)
    thread.start()

    async def producer(stream_id: str, evs: list[EventBase]) -> None:
        for version, event in enumerate(evs, start=1):
            future: asyncio.Future[None] = loop.create_future()
            inbox.put(((stream_id, version, str(event.event_id), event.model_dump_json()), future))
            await future

    writer0 = thread_cpu_s(thread)
    t0, loop0 = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(producer(s, evs) for s, evs in events.items()))
    elapsed, loop_s = time.perf_counter() - t0, time.thread_time() - loop0
    writer_s = thread_cpu_s(thread) - writer0
    inbox.put(None)
    await asyncio.to_thread(thread.join)
    total = sum(len(v) for v in events.values())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == total, "events lost"
    return total / elapsed, loop_s / total * 1e6, writer_s / total * 1e6


async def run_store(path: Path, sync: str, events: dict[str, list[EventBase]]) -> Sample:
    store = await EventStore.open(f"sqlite+aiosqlite:///{path}", create=True, synchronous=sync)  # type: ignore[arg-type]
    await store.head_position()
    backend_thread = store.recorder.backend.writer_thread

    async def producer(stream_id: str, evs: list[EventBase]) -> None:
        append = store.append
        for version, event in enumerate(evs):
            await append(stream_id, [event], expected_version=version)

    t0, loop0 = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(producer(s, evs) for s, evs in events.items()))
    elapsed, loop_s = time.perf_counter() - t0, time.thread_time() - loop0
    thread = getattr(backend_thread, "_thread", None)
    writer_s = thread_cpu_s(thread)  # the thread starts with the first append: all of it is the run's
    total = sum(len(v) for v in events.values())
    assert await store.head_position() == total, "events lost"
    await store.close()
    return total / elapsed, loop_s / total * 1e6, writer_s / total * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--events", type=int, default=200, help="events per stream")
    ap.add_argument("--sync", default="FULL", help="SQLite synchronous levels (comma list: FULL,NORMAL)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per arm")
    ap.add_argument("--dir", default=None, help="where the database files go (default: a temp dir)")
    args = ap.parse_args()
    events = make_events(args.streams, args.events)
    size = len(next(iter(events.values()))[0].model_dump_json())
    print(
        f"{args.streams} streams x {args.events} events, one ~{size}-byte event per awaited append; "
        f"medians of {args.rounds} alternating rounds"
    )
    print(f"{'arm':22} {'appends/s':>10} {'ratio':>6} {'loop µs':>8} {'writer µs':>9} {'total µs':>8} {'CPU ratio':>9}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for sync in args.sync.split(","):
            runs: dict[str, list[Sample]] = {"plain": [], "store": []}
            for r in range(args.rounds):
                for arm in ("plain", "store") if r % 2 == 0 else ("store", "plain"):
                    path = root / f"{arm}-{sync}-{r}.db"
                    run = run_plain if arm == "plain" else run_store
                    runs[arm].append(asyncio.run(run(path, sync, events)))
            med = {
                arm: tuple(statistics.median(s[i] for s in samples) for i in range(3)) for arm, samples in runs.items()
            }
            for arm in ("plain", "store"):
                rate, loop_us, writer_us = med[arm]
                total_us = loop_us + writer_us
                plain_total = med["plain"][1] + med["plain"][2]
                print(
                    f"{f'{arm} {sync}':22} {rate:10,.0f} {rate / med['plain'][0]:6.2f} {loop_us:8.1f} "
                    f"{writer_us:9.1f} {total_us:8.1f} {plain_total / total_us:9.2f}"
                )


if __name__ == "__main__":
    main()
