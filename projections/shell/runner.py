"""Async runner around the pure projector (SQLAlchemy-asyncio style: a thin async shell over
a synchronous core).

* :meth:`ProjectionRunner.catch_up` — incremental from the stored checkpoint: read a batch of
  events, fold it, then write the batch's read-model rows AND the checkpoint (position + the
  fold state as plain data, :mod:`projections.shell.checkpoint`) in one transaction. A crash or an injected failure anywhere in between
  leaves the previous checkpoint and rows untouched; the next run resumes from it, so no event
  is applied twice or skipped (CASE-16). Events at or below the checkpoint are skipped
  (at-least-once readers are harmless).
* :meth:`ProjectionRunner.rebuild` — drop the read models and run from position 0.
* :meth:`ProjectionRunner.follow` — live: catch up, then fold the subscription.
* :meth:`ProjectionRunner.checked_catch_up` — a reader's catch-up that trusts no derived state
  found in the file (the check itself: :mod:`projections.shell.checked`).
* :func:`project_as_of` — time travel in memory (no writes): the log up to a position and/or
  a time.

The partitioned fold of a large SQLite log (worker processes) is driven from
:mod:`projections.shell.partitions`.

A checkpoint found in the database is untrusted (a copied file): it is decoded into
allow-listed classes only, and used only when its format and fold version are ours and the
log's chain hash at its position is the one it was built at. Otherwise the read models are
dropped and rebuilt from the log, with a note (``note``, default: stderr).

Memory: the fold forgets closed sessions that hold nothing at fixed log positions
(:data:`projections.projector.SWEEP_EVERY`), so a long log's working set is its open and
leaking sessions and those closed since the last sweep; each forgotten session leaves only
its close point (``ResourcesFold.closed_sessions``, DOMAIN §5.7 D18).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from events.chain_walk import ChainFault
from events.gc_pause import gc_paused
from events.records import StoredEvent
from events.store.store import EventStore
from events.types import ts_to_us
from projections.projector import Projector
from projections.shell import checked, checkpoint, consistency, partitions, readmodels
from projections.turn_tables import TurnTables

CHECKPOINT_NAME = "ledger"
FOLD_VERSION = 12  # bump when the fold state's meaning changes: old checkpoints then rebuild


def note_to_stderr(message: str) -> None:
    """The default ``note`` of :class:`ProjectionRunner`: one line on stderr."""
    print(f"duplex-ledger: {message}", file=sys.stderr)


class ProjectionRunner:
    """Keeps the read models of one store up to date. Not thread-safe; one per process."""

    def __init__(
        self,
        store: EventStore,
        *,
        batch_size: int = 5000,
        max_idle_s: float = 30.0,
        before_checkpoint: Callable[[], None] | None = None,
        note: Callable[[str], None] = note_to_stderr,
    ) -> None:
        self.store = store
        self.note = note
        self.batch_size = batch_size
        self.max_idle_s = max_idle_s
        self.before_checkpoint = before_checkpoint  # test hook: raise to simulate a crash
        self.projector: Projector | None = None
        self.position = 0
        # Turn rows of a fold served from memory (derived state found in the file differed):
        # :meth:`turn_tables` reads them instead of the file's read model.
        self.served_turn_rows: list[dict[str, Any]] | None = None
        # The first fault of the log's hash chain :meth:`checked_catch_up` found (None: intact).
        self.chain_fault: ChainFault | None = None

    async def _run_write(self, fn, *args):  # type: ignore[no-untyped-def]
        return await self.store.run_write(fn, *args)

    async def load(self) -> Projector:
        """The projector at the stored checkpoint; a fresh one when there is none, or when
        :meth:`_trusted` refuses it (then the read models are dropped, to be rebuilt from the
        log, and ``note`` says why). Never raises for a bad checkpoint."""
        found = await self.store.run_read(readmodels.load_checkpoint, CHECKPOINT_NAME)
        sealed = None
        if found is not None:
            try:
                sealed = await self._trusted(found)
            except checkpoint.CheckpointRefused as exc:
                self.note(f"projection checkpoint discarded ({exc}); rebuilding the read models from the log")
                await self._run_write(readmodels.clear_read_models)
        if sealed is None:
            self.projector, self.position = Projector(), 0
        else:
            self.projector, self.position = sealed.state, sealed.position
        return self.projector

    async def _trusted(self, found: tuple[int, int, bytes]) -> checkpoint.Sealed:
        """The decoded checkpoint row, or CheckpointRefused: unreadable or forged, another
        format or fold version, a position other than its row's, or built on another log (the
        chain hash at its position differs)."""
        position, _fold_version, blob = found
        sealed = checkpoint.open_blob(blob, fold_version=FOLD_VERSION, expect=Projector)
        if sealed.position != position or sealed.state.position != position:
            raise checkpoint.CheckpointRefused(f"position {sealed.position} does not match its row ({position})")
        log_hash = await self.store.run_read(readmodels.log_hash_at, position)
        if not log_hash or log_hash != sealed.log_hash:
            raise checkpoint.CheckpointRefused(f"built on another log (the chain hash at position {position} differs)")
        return sealed

    async def rebuild(self, progress: Callable[[int, int], None] | None = None, *, workers: int | None = None) -> int:
        """Drop every read-model row and project the whole log again. Returns the position.

        ``workers``: worker processes for a SQLite log (:mod:`projections.shell.parallel`); None
        picks :func:`~projections.shell.parallel.default_workers` for logs of at least
        ``PARALLEL_MIN_EVENTS`` events and 1 (sequential, in this process) below; PostgreSQL
        logs always rebuild sequentially."""
        self.projector, self.position = Projector(), 0
        head = await self.store.head_position()
        workers = partitions.workers_for(self.store, head, workers)
        if workers > 1:
            return await self._rebuild_parallel(head, workers, progress)
        await self._run_write(readmodels.clear_read_models)
        with gc_paused():
            return await self._catch_up(head, progress)

    async def _rebuild_parallel(self, head: int, workers: int, progress: Callable[[int, int], None] | None) -> int:
        """Drop the read-model rows and write them again from worker processes (see
        projections.shell.parallel). The old rows are deleted on the write thread while the
        workers fold (the delete, and the WAL checkpoint a previous rebuild's rows leave
        due, can take seconds on a large log); the new rows and the checkpoint are written
        after it, in one transaction that first deletes again what another writer (a second
        rebuild, ``serve`` catching up) committed meanwhile (SQLite copies the spooled rows itself,
        :func:`~projections.shell.readmodels.insert_spooled`, while the fold state is merged and
        encoded here)."""
        path = partitions.db_path(self.store)
        clearing = asyncio.ensure_future(self._run_write(readmodels.clear_read_models))
        with tempfile.TemporaryDirectory(prefix="duplex-ledger-rebuild-") as spool_dir:
            try:
                plan = await partitions.plan(path, workers)
                results = await partitions.fold_partitions(path, plan, head, spool_dir, progress)
            finally:
                # A transaction on the write thread is never cut short: wait for it either way.
                await asyncio.gather(clearing, return_exceptions=True)
            clearing.result()  # raises the delete's error, if any
            spools = sorted(r.turns_path for r in results)
            # SQLite copies the spooled rows on the write thread (one INSERT … SELECT a file: no
            # GIL held) while this thread merges the fold state and encodes it; the write then
            # takes that snapshot, and rows and checkpoint commit in one transaction (CASE-16).
            snapshot: concurrent.futures.Future[tuple[list[dict], list[dict], bytes]] = concurrent.futures.Future()

            def write(conn: Any) -> None:
                # Again, in this transaction: rows another writer (a second rebuild, `serve`
                # catching up) committed since the early delete would collide with ours.
                readmodels.clear_read_models(conn)
                readmodels.insert_spooled(conn, spools)
                resources, findings, state = snapshot.result()  # what the merge raised: rolled back
                readmodels.write_batch(
                    conn,
                    name=CHECKPOINT_NAME,
                    position=head,
                    fold_version=FOLD_VERSION,
                    state=state,
                    turns=(),
                    touched=[],
                    resources=resources,
                    findings=findings,
                    before_checkpoint=self.before_checkpoint,
                )

            writing = asyncio.ensure_future(self._run_write(write))
            try:
                await asyncio.sleep(0)  # the write reaches its thread before the merge holds this one
                with gc_paused():
                    projector = Projector.merged(r.projector for r in results)
                    snapshot.set_result(self._snapshot(projector, sorted(projector.resources.sessions)))
            except BaseException as exc:
                snapshot.set_exception(exc)
                raise
            finally:
                try:  # a transaction on the write thread is never cut short, and it reads the spools
                    await asyncio.gather(writing, return_exceptions=True)
                finally:
                    await self._run_write(readmodels.detach_spooled)  # before the files go
            writing.result()
        self.projector, self.position = projector, head
        return head

    async def catch_up(
        self, progress: Callable[[int, int], None] | None = None, *, until_position: int | None = None
    ) -> int:
        """Fold every event after the checkpoint (up to ``until_position``, default the head),
        one transaction per batch. ``progress(done, head)`` is called after each batch.
        Returns the new checkpoint position."""
        if self.projector is None:
            await self.load()
        head = await self.store.head_position()
        if until_position is not None:
            head = min(head, until_position)
        if self.position == 0 and head > 0:
            # No checkpoint yet (a copied file, a first audit): a full projection, in parallel
            # when the log is large enough (see rebuild).
            workers = partitions.workers_for(self.store, head, None)
            if workers > 1:  # rows without a checkpoint: none to keep
                return await self._rebuild_parallel(head, workers, progress)
        with gc_paused():
            return await self._catch_up(head, progress)

    async def checked_catch_up(self, progress: Callable[[int, int], None] | None = None) -> int:
        """:meth:`catch_up` for a reader of a ledger file, which trusts no derived state found in
        it: the read models and the checkpoint found are compared with a fresh fold of the log
        up to the checkpoint position (:func:`projections.shell.checked.checked_fold`); the fresh
        fold, never the stored state, is what the runner continues from. When they differ (an
        edited or deleted read-model row, a forged checkpoint…) ``note`` says what differs and
        nothing is written: the whole log is folded in memory and the file keeps its evidence
        for ``verify``. The log's hash chain is checked meanwhile (every row folded): on a fault
        (kept in :attr:`chain_fault` for the caller to report) nothing is written either.
        Returns the new position (the head)."""
        found = await checked.checked_fold(
            self.store, fold_version=FOLD_VERSION, max_idle_s=self.max_idle_s, batch_size=self.batch_size
        )
        self.chain_fault = found.chain_fault
        self.projector, self.position = found.fresh.projector, found.at
        if found.mismatch is not None or found.chain_fault is not None:
            # Evidence is kept: the file is left as found, and what is served is a fold of the
            # log in memory. Derived state an older fold version built (or made to look so: its
            # header is not secret) is left as found too; only `rebuild` rewrites it.
            if found.mismatch is not None and found.mismatch.outdated:
                self.note(
                    f"read models built by an older fold version ({found.mismatch}); served from a fresh fold "
                    "of the log; after an upgrade, run `duplex-ledger rebuild` once"
                )
            elif found.mismatch is not None:
                self.note(
                    f"derived state in the ledger differs from its log: {found.mismatch}; it is ignored and left "
                    "as found (evidence: run `duplex-ledger verify`; `rebuild` rewrites it); served from a "
                    "fresh fold of the log"
                )
            whole = await checked.fold_rest(self.store, found, self.batch_size)
            self.projector, self.position, self.served_turn_rows = whole.projector, found.head, whole.turn_rows
            return found.head
        if found.at == 0:
            return await self.catch_up(progress)  # nothing to keep: a full projection, parallel when large
        with gc_paused():
            return await self._catch_up(found.head, progress)

    async def fresh_fold(self, until: int) -> consistency.FreshFold:
        """The log folded from position 1 to ``until`` in memory, ignoring any checkpoint
        (:func:`projections.shell.partitions.fresh_fold`)."""
        return await partitions.fresh_fold(self.store, until, self.batch_size)

    async def _catch_up(self, head: int, progress: Callable[[int, int], None] | None) -> int:
        batches = self.store.read_batches(self.position + 1, until_position=head, batch_size=self.batch_size)
        # Read one batch ahead: the next batch is fetched (in the driver's thread) and decoded
        # (while this task waits on the write) as the current one is folded and written.
        ahead = asyncio.ensure_future(anext(batches, None))
        try:
            while (batch := await ahead) is not None:
                ahead = asyncio.ensure_future(anext(batches, None))
                await self._commit(batch)
                if progress is not None:
                    progress(self.position, head)
        finally:
            ahead.cancel()
            await asyncio.gather(ahead, return_exceptions=True)
            await batches.aclose()  # type: ignore[attr-defined]  # an async generator
        if progress is not None:
            progress(self.position, head)
        return self.position

    def _snapshot(self, projector: Projector, sessions: Iterable[str]) -> tuple[list[dict], list[dict], bytes]:
        """What a checkpoint transaction writes besides the turn rows: the request_resources
        rows of ``sessions``, every finding, and the encoded fold state (closed sessions that
        hold nothing are dropped from it first)."""
        resources = readmodels.resource_rows(projector.resources, sessions)
        findings = readmodels.finding_rows(projector.findings(self.max_idle_s))
        return resources, findings, checkpoint.encode_state(projector)

    async def _commit(self, batch: list[StoredEvent]) -> None:
        projector = self.projector
        assert projector is not None
        turn_rows, touched = readmodels.fold_batch(projector, batch, after_position=self.position)
        position = max(self.position, batch[-1].position)
        resources, findings, state = self._snapshot(projector, touched)
        try:
            await self._run_write(
                lambda conn: readmodels.write_batch(
                    conn,
                    name=CHECKPOINT_NAME,
                    position=position,
                    fold_version=FOLD_VERSION,
                    state=state,
                    turns=turn_rows,
                    touched=list(touched),
                    resources=resources,
                    findings=findings,
                    before_checkpoint=self.before_checkpoint,
                )
            )
        except BaseException:
            self.projector = None  # in-memory state is ahead of the database: reload on next use
            raise
        self.position = position

    async def follow(self, stop: asyncio.Event, *, idle_flush_s: float = 0.2) -> int:
        """Catch up, then fold live events until ``stop`` is set; commits a batch when it is
        full or the log has been quiet for ``idle_flush_s``. (The subscription runs in its own
        task feeding a queue: cancelling a pending ``__anext__`` would close the generator.)"""
        await self.catch_up()
        queue: asyncio.Queue[StoredEvent] = asyncio.Queue()

        async def pump() -> None:
            async for stored in self.store.subscribe(self.position + 1):
                queue.put_nowait(stored)

        pumper = asyncio.get_running_loop().create_task(pump())
        batch: list[StoredEvent] = []
        try:
            while not stop.is_set():
                try:
                    batch.append(await asyncio.wait_for(queue.get(), idle_flush_s))
                    if len(batch) < self.batch_size:
                        continue
                except TimeoutError:
                    pass
                if batch:
                    await self._commit(batch)
                    batch = []
        finally:
            pumper.cancel()
            await asyncio.gather(pumper, return_exceptions=True)
        while not queue.empty():
            batch.append(queue.get_nowait())
        if batch:
            await self._commit(batch)
        return self.position

    async def turn_tables(self, session_id: str | None = None, response_id: str | None = None) -> list[TurnTables]:
        """Finalized turns from the read model (call :meth:`catch_up` first to be current), or
        from the in-memory fold :meth:`checked_catch_up` served when the file's differed."""
        if self.served_turn_rows is None:
            return await self.store.run_read(readmodels.load_turns, session_id, response_id)
        return readmodels.turns_of_rows(self.served_turn_rows, session_id, response_id)


async def project_as_of(
    store: EventStore, *, until_position: int | None = None, until_ts: float | None = None, batch_size: int = 5000
) -> Projector:
    """Fold the log in memory up to ``until_position`` and/or the events with ts <= ``until_ts``
    (time travel; nothing is written). Findings should then be evaluated with
    ``as_of_ts=until_ts``."""
    projector = Projector()
    limit_us = ts_to_us(until_ts) if until_ts is not None else None
    async for stored in store.read_all(0, until_position=until_position, batch_size=batch_size):
        if limit_us is not None and ts_to_us(stored.event.ts) > limit_us:
            continue
        projector.apply(stored)
    projector.turn_tables.extend(projector.turns.take_finalized())
    return projector
