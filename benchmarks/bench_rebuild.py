"""Rebuild benchmark (issue 3): full rebuild of all three projections over a ~1,000,000-event
synthetic log (1,000 sessions x ~36 turns, both id modes, barge-ins, listen-only turns, a few
leaks), including writing the read-model tables; against the ceiling measured in the same run:
the same rows read and JSON-decoded by plain ``sqlite3`` with no projection work.

    .venv/bin/python benchmarks/bench_rebuild.py [--sessions 1000] [--turns 36] [--db PATH] [--workers N]

The log is generated once in a child process (so its memory does not count) and cached at
``--db``. Prints events/s for both, the ratio, and the peak RSS of the rebuild process and of
its largest child (a rebuild worker; the generator when the log was just built).
Targets: >= 200,000 events/s end to end, peak RSS < 500 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_db(path: Path, sessions: int, turns: int) -> int:
    """Generate the log into a fresh, migrated SQLite file; returns the event count."""
    from benchmarks.synthetic import generate
    from events.chain import GENESIS, row_hash
    from events.records import to_record
    from events.store.migrate import upgrade
    from events.store.rows import dump_data
    from events.types import parse_event

    if path.exists():
        path.unlink()
    url = f"sqlite+aiosqlite:///{path}"
    asyncio.run(upgrade(url))
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    versions: dict[str, int] = {}
    rows = []
    position = 0
    now_us = int(time.time() * 1e6)
    previous = GENESIS
    for ts, type_name, sid, payload in generate(sessions, turns):
        position += 1
        event = parse_event(
            {"type": type_name, "session_id": sid, "ts": ts, "event_id": uuid.UUID(int=position), **payload}
        )
        record = to_record(event)
        versions[sid] = versions.get(sid, 0) + 1
        row = (
            position,
            sid,
            versions[sid],
            str(record.event_id),
            record.type,
            record.schema_version,
            record.ts_us,
            now_us,
            dump_data(record.data),
        )
        previous = row_hash(previous, *row)
        rows.append((*row, previous))
        if len(rows) >= 50_000:
            conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            rows.clear()
    conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()
    return position


def _cpu_s() -> float:
    """CPU seconds of this process plus its finished children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ceiling(path: Path) -> tuple[int, float]:
    start = time.perf_counter()
    conn = sqlite3.connect(path)
    n = 0
    for row in conn.execute(
        "SELECT position, stream_id, version, event_id, type, schema_version, ts_us, "
        "recorded_at_us, data FROM events ORDER BY position"
    ):
        json.loads(row[8])
        n += 1
    conn.close()
    return n, time.perf_counter() - start


async def rebuild(path: Path, workers: int | None) -> tuple[int, float, int, int]:
    from events.store.store import EventStore
    from projections.shell.runner import ProjectionRunner

    async with await EventStore.open(f"sqlite+aiosqlite:///{path}", synchronous="NORMAL") as store:
        runner = ProjectionRunner(store, batch_size=20_000)
        start = time.perf_counter()
        position = await runner.rebuild(workers=workers)
        elapsed = time.perf_counter() - start
        assert runner.projector is not None
        leaks = len(runner.projector.leaks())
        conn = sqlite3.connect(path)
        turns = conn.execute("SELECT count(*) FROM rm_turn_tables").fetchone()[0]
        conn.close()
    return position, elapsed, leaks, turns


def ensure_log(db: Path, sessions: int, turns: int) -> None:
    """Generate the synthetic log into ``db`` (in a child process, so its memory is not this
    process's) unless a complete one of that size is there (marker file written last)."""
    marker = db.with_suffix(f".{sessions}x{turns}.ok")
    if db.exists() and marker.exists():
        return
    argv = ["--generate-only", "--sessions", str(sessions), "--turns", str(turns), "--db", str(db)]
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], check=True)
    marker.touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=36)
    parser.add_argument("--db", type=Path, default=Path("/tmp/duplex-ledger-bench-rebuild.db"))
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="rebuild worker processes (default: the CPUs available, at most 8; 1 = sequential)",
    )
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_only:
        n = build_db(args.db, args.sessions, args.turns)
        print(f"generated {n:,} events into {args.db}")
        return
    ensure_log(args.db, args.sessions, args.turns)
    from projections.shell.parallel import default_workers

    workers = args.workers or default_workers()
    # The ceiling runs before and after the rebuild (the faster counts): on a shared machine
    # the load moves within a minute. CPU seconds (this process and its workers) are printed
    # too: less distorted by other processes than wall time.
    n_ceiling, t_before = ceiling(args.db)
    cpu0 = _cpu_s()
    position, t_rebuild, leaks, turns = asyncio.run(rebuild(args.db, workers))
    cpu_rebuild = _cpu_s() - cpu0
    cpu0 = _cpu_s()
    _, t_after = ceiling(args.db)
    cpu_ceiling = _cpu_s() - cpu0
    t_ceiling = min(t_before, t_after)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    eps_rebuild = position / t_rebuild
    eps_ceiling = n_ceiling / t_ceiling
    print(
        f"log: {position:,} events, {args.sessions} sessions x {args.turns} turns, {turns:,} turn tables, "
        f"{leaks} leaks found"
    )
    print(f"{'plain sqlite3 read + json.loads (ceiling)':45s} {eps_ceiling:>12,.0f} events/s  ({t_ceiling:.2f} s)")
    print(f"{'duplex-ledger rebuild (3 projections + rows)':45s} {eps_rebuild:>12,.0f} events/s  ({t_rebuild:.2f} s)")
    print(f"{'ceiling wall before / after the rebuild':45s} {t_before:>8.2f} s / {t_after:.2f} s")
    print(f"{'ratio rebuild / ceiling':45s} {eps_rebuild / eps_ceiling:>12.2f}")
    print(f"{'CPU s: rebuild (all processes) / ceiling':45s} {cpu_rebuild:>8.2f} s / {cpu_ceiling:.2f} s")
    print(f"{'rebuild workers (processes)':45s} {workers:>12d}")
    print(f"{'peak RSS (rebuild process)':45s} {peak_mb:>12.0f} MB")
    print(f"{'peak RSS of one worker / generator process':45s} {child_peak_mb:>12.0f} MB")
    if workers > 1:
        print(f"{'all rebuild processes together (upper bound)':45s} {peak_mb + workers * child_peak_mb:>12.0f} MB")
    print(
        f"targets: >= 200,000 events/s ({'met' if eps_rebuild >= 200_000 else 'NOT met'}), "
        f"peak RSS < 500 MB ({'met' if peak_mb + (workers > 1) * workers * child_peak_mb < 500 else 'NOT met'}, "
        f"all processes together)"
    )


if __name__ == "__main__":
    main()
