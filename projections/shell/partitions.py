"""The caller's side of a partitioned fold of a SQLite ledger (:mod:`projections.shell.parallel`
is the workers' side, kept light because every worker imports it).

* :func:`workers_for` — how many partitions a fold of ``head`` events of a store gets;
* :func:`fold_partitions` — each partition but the last folded by a spawned worker process,
  the last on a thread of this process; the results decoded from plain data;
* :func:`fresh_fold` — the log folded from position 1 in memory, ignoring any checkpoint,
  with the turn rows the runner would write (what ``verify`` and a checked reader compare
  the derived state found in a file with).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from events.gc_pause import gc_paused
from events.store.store import EventStore
from events.store.url import sqlite_path
from projections.projector import Projector
from projections.shell import consistency, parallel


def workers_for(store: EventStore, head: int, workers: int | None) -> int:
    """Partitions for a fold of ``store`` up to ``head``: 1 (sequential) for PostgreSQL or an
    empty log; ``workers`` when given; else
    :func:`~projections.shell.parallel.default_workers` from
    :data:`~projections.shell.parallel.PARALLEL_MIN_EVENTS` events on, 1 below."""
    if store.backend_name != "sqlite" or head == 0:
        return 1
    if workers is None:
        return parallel.default_workers() if head >= parallel.PARALLEL_MIN_EVENTS else 1
    return workers


def db_path(store: EventStore) -> str:
    """The resolved path of ``store``'s SQLite file (the workers open it read-only)."""
    return str(sqlite_path(store.url).resolve())


async def plan(path: str, workers: int) -> list[list[str]]:
    """The sessions of the log at ``path`` dealt into ``workers`` partitions
    (:func:`~projections.shell.parallel.plan_partitions`)."""
    return parallel.plan_partitions(await asyncio.to_thread(parallel.session_sizes, path), workers)


async def fold_partitions(
    path: str,
    plan: list[list[str]],
    head: int,
    spool_dir: str,
    progress: Callable[[int, int], None] | None = None,
    *,
    chain: list[tuple[int, int]] | None = None,
    watch: Sequence[int] = (),
) -> list[parallel.PartitionResult]:
    """Fold each partition of ``plan`` up to ``head``: every one but the last in a spawned
    worker (its result decoded by :func:`~projections.shell.parallel.decode_result`), the
    last on a thread here. Turn rows are spooled under ``spool_dir``. ``chain``: a range of
    positions per partition whose hash-chain links that partition's process checks from the
    scan it folds from (:func:`~projections.shell.parallel.fold_partition_checked`; its
    ``segment``), with the stored hashes of the ``watch`` positions. ``progress(done, head)``
    after each partition. Raises what a partition raises, once every partition has ended;
    the worker processes' exit is not waited for."""
    loop = asyncio.get_running_loop()
    results: list[parallel.PartitionResult] = []
    here = len(plan) - 1  # the last partition is folded on a thread of this process

    def fold_here() -> parallel.PartitionResult:
        mine = None if chain is None else chain[here]
        return parallel.folded_partition(path, here, plan[here], head, spool_dir, chain=mine, watch=watch)

    pool = parallel.pool(here) if here else None
    try:
        pending: list[asyncio.Future[Any]] = [
            loop.run_in_executor(pool, parallel.fold_partition, path, part, sessions, head, spool_dir)
            if chain is None
            else loop.run_in_executor(
                pool, parallel.fold_partition_checked, path, part, sessions, head, spool_dir, chain[part], watch
            )
            for part, sessions in enumerate(plan[:here])
        ]
        pending.append(asyncio.ensure_future(asyncio.to_thread(fold_here)))
        try:
            for done in asyncio.as_completed(pending):
                found = await done
                if not isinstance(found, parallel.PartitionResult):
                    blob, segment = found if chain is not None else (found, None)
                    with gc_paused():  # the fold state decoded is acyclic: no collector passes over it
                        found = dataclasses.replace(parallel.decode_result(blob), segment=segment)
                results.append(found)
                if progress is not None:
                    progress(head * len(results) // len(plan), head)
        finally:
            # A failed partition: the others still end before their spool folder goes (a
            # worker closes its spool file before it hands back its result or its error).
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        # Every partition has ended: the workers' exit (their interpreter freeing the fold
        # state, ≈ 0.1 s) is not waited for; the pool's own thread joins them.
        if pool is not None:
            pool.shutdown(wait=False)
    return results


async def fresh_fold(store: EventStore, until: int, batch_size: int) -> consistency.FreshFold:
    """The log folded from position 1 to ``until`` in memory, ignoring any checkpoint, with the
    turn rows the runner would have written: in worker processes for a SQLite log of at least
    ``PARALLEL_MIN_EVENTS`` events, else here, ``batch_size`` rows at a time."""
    workers = workers_for(store, until, None)
    if workers <= 1:
        fresh = consistency.FreshFold(until)
        with gc_paused():
            async for rows in store.read_row_batches(1, until_position=until, batch_size=batch_size):
                fresh.feed(rows)
        return fresh
    return (await _merged_fold(db_path(store), workers, until))[0]


async def checked_fresh_fold(
    path: str, workers: int, until: int, head: int, watch: Sequence[int] = ()
) -> tuple[consistency.FreshFold, list[tuple[Any, ...]]]:
    """:func:`fresh_fold` of the SQLite log at ``path`` in ``workers`` partitions, each process
    also checking the hash-chain links of one range of positions 1..``head``
    (:func:`~projections.shell.parallel.chain_ranges`): the fold, and each range's
    :func:`~events.chain_walk.check_sqlite_segment_plain` values (the stored hashes of the
    ``watch`` positions in them). What ``verify`` runs on a large SQLite log."""
    fresh, results = await _merged_fold(path, workers, until, head=head, watch=watch)
    return fresh, [r.segment for r in results if r.segment is not None]


async def _merged_fold(
    path: str, workers: int, until: int, *, head: int | None = None, watch: Sequence[int] = ()
) -> tuple[consistency.FreshFold, list[parallel.PartitionResult]]:
    """The partitioned fold to ``until``, merged, with its turn rows read back from the spool
    files; with ``head``, the chain of 1..head checked beside it (:func:`checked_fresh_fold`)."""
    with tempfile.TemporaryDirectory(prefix="duplex-ledger-fold-") as spool_dir:
        parts = await plan(path, workers)
        chain = None if head is None else parallel.chain_ranges(head, len(parts))
        results = await fold_partitions(path, parts, until, spool_dir, chain=chain, watch=watch)
        with gc_paused():
            projector = Projector.merged(r.projector for r in results)
            turn_rows = list(parallel.spooled_turn_rows(sorted(r.turns_path for r in results)))
    return consistency.FreshFold(until, projector, turn_rows), results
