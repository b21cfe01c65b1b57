"""Rebuild benchmark (issue 3): full rebuild of all three projections over a ~1,000,000-event
synthetic log (1,000 sessions x ~36 turns, both id modes, barge-ins, listen-only turns, a few
leaks), including writing the read-model tables; against the ceiling measured in the same run:
the same rows read and JSON-decoded by plain ``sqlite3`` with no projection work.

    .venv/bin/python benchmarks/bench_rebuild.py [--sessions 1000] [--turns 36] [--db PATH] [--workers N]

The log is generated once in a child process (so its memory does not count) and cached at
``--db``. Prints events/s for both, the ratio, CPU seconds (all processes) per event, and the
rebuild's memory: every process's peak (``VmHWM``, sampled from ``/proc``) and their sum, the
most held at once, and the ``ru_maxrss`` figures (a spawned worker's ``ru_maxrss`` starts at
its parent's size, inherited through the fork before ``exec``). Targets: >= 200,000
events/s end to end (issue 3); ratio >= 0.7 with 2 workers and peak RSS of all processes
<= 250 MB on the 1M-event log (issue 23).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import subprocess
import sys
import threading
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


class RssSampler:
    """Samples, every ``interval_s``, the resident memory of this process and of every process
    descending from it (``/proc``, Linux): the largest sum seen at one instant
    (:attr:`together_bytes`, the memory the rebuild held at once) and each process's own
    high-water mark (``VmHWM``, which restarts at ``exec``; ``ru_maxrss`` does not: a spawned
    worker's starts at the size of the parent it was forked from, though the exec'd image
    never held it). Elsewhere than Linux it measures nothing (zeros)."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.together_bytes = 0
        self.hwm_bytes: dict[int, int] = {}
        self.cpu_s = 0.0  # this sampler's own CPU (taken off the rebuild's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _status(pid: int) -> dict[str, int]:
        out = {}
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith(("VmRSS:", "VmHWM:", "PPid:")):
                        key, value = line.split(":", 1)
                        out[key] = int(value.split()[0]) * (1024 if key != "PPid" else 1)
        except (OSError, ValueError):
            pass
        return out

    @staticmethod
    def _children(pid: int) -> list[int]:
        found: list[int] = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                    found += map(int, f.read().split())
        except (OSError, ValueError):
            pass
        return found

    def _tree(self) -> list[int]:
        tree, frontier = [os.getpid()], [os.getpid()]
        while frontier:
            frontier = [child for pid in frontier for child in self._children(pid)]
            tree += frontier
        return tree

    def _run(self) -> None:
        if not os.path.isdir("/proc"):
            return
        start = time.thread_time()
        while not self._stop.wait(self.interval_s):
            together = 0
            for pid in self._tree():
                status = self._status(pid)
                together += status.get("VmRSS", 0)
                # The last reading, not the largest: a worker caught between its fork and its
                # exec shows its parent's mark, and the mark only grows within one image.
                self.hwm_bytes[pid] = status.get("VmHWM", self.hwm_bytes.get(pid, 0))
            self.together_bytes = max(self.together_bytes, together)
            self.cpu_s = time.thread_time() - start


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
    with RssSampler() as rss:
        position, t_rebuild, leaks, turns = asyncio.run(rebuild(args.db, workers))
    cpu_rebuild = _cpu_s() - cpu0 - rss.cpu_s
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
    print(f"{'partitions (the last folded in this process)':45s} {workers:>12d}")
    print(
        f"{'CPU us per event: rebuild / ceiling':45s} {cpu_rebuild / position * 1e6:>8.2f} / {cpu_ceiling / n_ceiling * 1e6:.2f}"
    )
    print(f"{'peak RSS (rebuild process, ru_maxrss)':45s} {peak_mb:>12.0f} MB")
    print(f"{'peak RSS of one worker (ru_maxrss)':45s} {child_peak_mb:>12.0f} MB  (from the fork: the parent's size)")
    hwm = sorted(rss.hwm_bytes.values(), reverse=True)
    sum_of_peaks_mb = sum(hwm) / 2**20
    together_mb = rss.together_bytes / 2**20
    print(f"{'per-process peaks (VmHWM), largest first':45s} {', '.join(f'{b / 2**20:.0f}' for b in hwm)} MB")
    print(f"{'all processes: sum of their peaks':45s} {sum_of_peaks_mb:>12.0f} MB")
    print(f"{'all processes: most held at once (sampled)':45s} {together_mb:>12.0f} MB")
    print(
        f"targets: >= 200,000 events/s ({'met' if eps_rebuild >= 200_000 else 'NOT met'}), "
        f"peak RSS <= 250 MB ({'met' if sum_of_peaks_mb <= 250 else 'NOT met'}, sum of every process's peak)"
    )


if __name__ == "__main__":
    main()
