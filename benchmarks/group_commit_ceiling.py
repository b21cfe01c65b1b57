"""The bare group commit: the durability ceiling of workload W (issue 15).

32 asyncio producers each await their own commit; one writer thread with a plain ``sqlite3``
connection takes whatever is queued, runs ``BEGIN IMMEDIATE`` + one ``executemany`` +
``COMMIT`` and resolves the producers' futures on the loop. No planning, no version checks, no
hash chain, no SQLAlchemy: what any durable group commit on this file costs at least. Rows are
prepared before timing (payload JSON included), positions are a counter in the writer thread.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

INSERT = (
    "INSERT INTO events (position, stream_id, version, event_id, type, schema_version, ts_us,"
    " recorded_at_us, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
Row = tuple[str, int, str, str, int, int, str]  # stream_id, version, event_id, type, schema_version, ts_us, data


class Sample(NamedTuple):
    """One run: events per second (wall), CPU µs per event of the whole process (all threads),
    of the event loop's thread and of the writer thread (each thread's own clock)."""

    rate: float
    cpu_us: float
    loop_us: float
    writer_us: float


def thread_cpu_s(thread: threading.Thread | None) -> float:
    """CPU seconds a started thread has used so far (NaN without one)."""
    if thread is None or thread.ident is None:
        return float("nan")
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _writer(path: Path, sync: str, inbox: queue.SimpleQueue[Any], loop: asyncio.AbstractEventLoop) -> None:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    position = 0
    while (batch := take_batch(inbox)) is not None:
        now_us = time.time_ns() // 1000
        params = []
        for rows, _ in batch:
            for r in rows:
                position += 1
                params.append((position, r[0], r[1], r[2], r[3], r[4], r[5], now_us, r[6]))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, params)
        conn.execute("COMMIT")
        loop.call_soon_threadsafe(resolve_futures, [f for _, f in batch])
    conn.close()


def take_batch(inbox: queue.SimpleQueue[Any]) -> list[Any] | None:
    """Everything queued now (waiting for the first item), or None once the stop mark (None) is
    taken; a stop mark met while draining is put back for the next call."""
    item = inbox.get()
    if item is None:
        return None
    batch = [item]
    while True:
        try:
            nxt = inbox.get_nowait()
        except queue.Empty:
            return batch
        if nxt is None:
            inbox.put(None)
            return batch
        batch.append(nxt)


def resolve_futures(futures: list[asyncio.Future[None]]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


async def run(path: Path, sync: str, streams: dict[str, list[Row]], per_call: int) -> Sample:
    """The :class:`Sample` of ``streams`` appended ``per_call`` rows at a time by one producer
    per stream, each awaiting its commit; ``path`` holds an empty ``events`` table."""
    loop = asyncio.get_running_loop()
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    thread = threading.Thread(target=_writer, args=(path, sync, inbox, loop), daemon=True)
    thread.start()

    async def producer(rows: Sequence[Row]) -> None:
        for k in range(0, len(rows), per_call):
            future: asyncio.Future[None] = loop.create_future()
            inbox.put((rows[k : k + per_call], future))
            await future

    t0, cpu0, loop0, writer0 = time.perf_counter(), time.process_time(), time.thread_time(), thread_cpu_s(thread)
    await asyncio.gather(*(producer(rows) for rows in streams.values()))
    elapsed, cpu_s, loop_s = time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - loop0
    writer_s = thread_cpu_s(thread) - writer0
    inbox.put(None)
    await asyncio.to_thread(thread.join)
    total = sum(len(r) for r in streams.values())
    return Sample(total / elapsed, cpu_s / total * 1e6, loop_s / total * 1e6, writer_s / total * 1e6)
