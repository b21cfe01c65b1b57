"""Fold benchmark (issue 23): the projection fold's CPU per event, one process, no I/O.

The synthetic log of ``bench_rebuild`` (default 100 sessions x 36 turns, ~100,000 events) is
read once and decoded into read-side ``StoredEvent`` structs in memory, as the runner does
(:func:`events.store.rows.decode_rows`). Then, in this one process, alternating rounds time:

* **ceiling** — iterating the decoded events with a no-op dispatch lookup (what any fold pays);
* **resources** — ``ResourcesFold`` alone;
* **turns** — ``TurnsFold`` alone, fed the resources verdicts recorded beforehand;
* **projector** — ``Projector`` (the whole fold: resources, then turns, plus its sweeps).

Each arm starts from a fresh fold and runs with the cyclic collector paused, as the runner's
``fold_batch`` does; its time is this process's CPU time (``time.process_time``: on a shared
machine less distorted by other processes than wall time). Prints the median µs per event of each arm (less the ceiling too) and the
projector's ratio to the issue's target (≤ 4 µs per event).

    .venv/bin/python benchmarks/bench_fold.py [--sessions 100] [--turns 36] [--rounds 5] [--db PATH]
    .venv/bin/python benchmarks/bench_fold.py --profile turns   # cProfile one arm instead
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_rebuild import ensure_log  # noqa: E402

TARGET_US = 4.0
"""Issue 23's target: fold cost per event, one process (µs)."""

_SELECT = (
    "SELECT position, stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, data, hash "
    "FROM events ORDER BY position"
)


def load_events(path: Path) -> list:  # type: ignore[type-arg]
    """Every event of the log at ``path``, decoded once into read-side structs."""
    from events.store.rows import StoredRow, decode_rows

    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(_SELECT).fetchall()
    finally:
        conn.close()
    return decode_rows(map(StoredRow._make, rows))


def arms(events: list) -> dict[str, Callable[[], None]]:  # type: ignore[type-arg]
    """The timed arms (module docstring), each a fresh fold over ``events``."""
    from events.types import EVENT_TYPES
    from projections.dispatch import dispatch_table
    from projections.projector import Projector
    from projections.resources import ResourcesFold
    from projections.turns import TurnsFold

    noop_table = dispatch_table({cls: _noop for cls in EVENT_TYPES})
    fold = ResourcesFold()
    verdicts = [fold.apply(stored).accepted for stored in events]

    def ceiling() -> None:
        get = noop_table.get
        for stored in events:
            handler = get(type(stored.event))
            if handler is None:
                continue

    def resources() -> None:
        apply = ResourcesFold().apply
        for stored in events:
            apply(stored)

    def turns() -> None:
        fold = TurnsFold()
        apply = fold.apply
        for stored, accepted in zip(events, verdicts):
            apply(stored, accepted)
        fold.take_finalized()

    def projector() -> None:
        p = Projector()
        apply = p.apply
        for stored in events:
            apply(stored)
        p.turns.take_finalized()

    return {"ceiling": ceiling, "resources": resources, "turns": turns, "projector": projector}


def _noop(*_: object) -> None:
    return None


def timed(fn: Callable[[], None]) -> float:
    from events.gc_pause import gc_paused

    with gc_paused():
        start = time.process_time()
        fn()
        elapsed = time.process_time() - start
    import gc

    gc.collect()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None, help="default: /tmp/duplex-ledger-bench-fold-SxT.db")
    parser.add_argument("--profile", choices=("resources", "turns", "projector"), help="cProfile one arm")
    args = parser.parse_args()
    db = args.db or Path(f"/tmp/duplex-ledger-bench-fold-{args.sessions}x{args.turns}.db")
    ensure_log(db, args.sessions, args.turns)
    start = time.perf_counter()
    events = load_events(db)
    n = len(events)
    print(
        f"log: {n:,} events, {args.sessions} sessions x {args.turns} turns (read + decoded in "
        f"{time.perf_counter() - start:.2f} s)"
    )
    table = arms(events)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(table[args.profile])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(args.rounds):
        for name, fn in table.items():
            times[name].append(timed(fn))
    us = {name: statistics.median(t) / n * 1e6 for name, t in times.items()}
    floor = us["ceiling"]
    print(f"{'arm':12s} {'µs/event':>9s} {'less ceiling':>13s}   (median of {args.rounds} alternating rounds)")
    for name, value in us.items():
        extra = "" if name == "ceiling" else f"{value - floor:>13.2f}"
        print(f"{name:12s} {value:>9.2f} {extra}")
    print(
        f"projector vs target ({TARGET_US:g} µs/event): {us['projector'] / TARGET_US:.2f}x "
        f"({'met' if us['projector'] <= TARGET_US else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
