"""The check a reader of a ledger file runs before it uses the derived state found there
(``audit``, ``tables``, ``metrics``, ``timeline``: :meth:`ProjectionRunner.checked_catch_up
<projections.shell.runner.ProjectionRunner.checked_catch_up>`): the file's read models and
checkpoint are untrusted, so they are compared with a fresh fold of the log up to the
checkpoint position (:func:`projections.shell.consistency.compare`), while the log's hash chain
is checked (:func:`events.chain_walk.chain_fault`). Nothing here writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from events.chain_walk import ChainFault, chain_fault
from events.store.store import EventStore
from projections.shell import consistency, partitions, readmodels


@dataclass(frozen=True, slots=True)
class CheckedFold:
    """What :func:`checked_fold` found: the log folded fresh to ``at`` (the checkpoint's position,
    at most the head; 0 without a checkpoint), the log's ``head``, the first difference between
    the derived state found and that fold (None: equal), and the chain's first fault (None:
    intact)."""

    fresh: consistency.FreshFold
    at: int
    head: int
    mismatch: consistency.Mismatch | None
    chain_fault: ChainFault | None


async def checked_fold(store: EventStore, *, fold_version: int, max_idle_s: float, batch_size: int) -> CheckedFold:
    """Compare the read models and the checkpoint of ``store`` with a fresh fold of its log up
    to the checkpoint position (worker processes for a large SQLite log:
    :func:`projections.shell.partitions.fresh_fold`), checking rows 1..head of the hash chain
    meanwhile (a thread, SQLite). A checkpoint of another fold version is compared like any
    other (:func:`~projections.shell.consistency.compare` names it): its version never leads
    to a rewrite or a skipped comparison. Raises what reading or decoding the log raises."""
    found = await store.run_read(consistency.load_models)
    head = await store.head_position()
    # Every row folded is chain-checked (one walk, events.chain_walk): a file whose events
    # were edited is served, in memory, as the edited log's account, and the caller reports
    # the fault (exit 1, as ``verify``). The walk runs while the fold to the checkpoint is done.
    checking = asyncio.ensure_future(chain_fault(store, head))
    at = min(found.checkpoint[0], head) if found.checkpoint is not None else 0
    try:
        fresh = await partitions.fresh_fold(store, at, batch_size)
    finally:
        fault = await checking
    log_hash = await store.run_read(readmodels.log_hash_at, at) if at else b""
    mismatch = consistency.compare(
        found, fresh, fold_version=fold_version, log_hash=log_hash or b"", max_idle_s=max_idle_s
    )
    if mismatch is None and found.checkpoint is not None and found.checkpoint[0] > head:
        mismatch = consistency.Mismatch(
            "checkpoint", "", f"position {found.checkpoint[0]} is beyond the log's head {head}"
        )
    return CheckedFold(fresh, at, head, mismatch, fault)


async def fold_rest(store: EventStore, checked: CheckedFold, batch_size: int) -> consistency.FreshFold:
    """``checked``'s fresh fold carried on, in memory, from its position to the head (what a
    reader serves when the file's derived state differs or its chain is broken: the file is
    left as found)."""
    whole = consistency.FreshFold(checked.head, checked.fresh.projector, checked.fresh.turn_rows)
    async for rows in store.read_row_batches(checked.at + 1, until_position=checked.head, batch_size=batch_size):
        whole.feed(rows)
    return whole
