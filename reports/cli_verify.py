"""``duplex-ledger verify [--digest FILE]`` and ``duplex-ledger digest``: does a ledger prove
it is unaltered?

``verify`` recomputes the hash chain (:mod:`events.chain_walk`) and folds the events up to
the checkpoint position, then compares the read models and the checkpoint with that fresh
fold (:mod:`projections.shell.consistency`). A small or PostgreSQL log, or any log on one
CPU, is read once, in position order; a large SQLite log is folded by the runner's partition
processes, each of which checks the chain links of one range of positions beside its fold
(plain ``sqlite3``), and is walked in order only to name a fault.
With ``--digest`` (the JSON ``digest`` printed earlier, kept elsewhere) it also catches a
truncated tail and a history rewritten and rehashed. It never writes to the ledger.

Exit codes: 0 intact; 1 tampered (the first bad position and what is wrong — a row edited,
missing, inserted, reordered, a value's storage type changed —, an index of the log that
does not hold its rows (``PRAGMA integrity_check``, :mod:`events.store.integrity`), the first
read-model row or checkpoint difference, the ledger's guard triggers missing, or a schema
object the ledger did not create, refused before anything ran); 2 usage (a missing ledger,
a bad digest file, an unreadable log).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from events.chain_walk import (
    LOWEST_POSITION,
    ChainFault,
    ChainWalker,
    Digest,
    Segment,
    check_sqlite_segment,
    sqlite_file,
    walk_log,
    walk_sqlite,
    walker_of,
)
from events.gc_pause import gc_paused
from events.store import integrity
from events.store.errors import ForeignSchemaObject
from events.store.integrity import IndexFault
from events.store.migrate import missing_guards
from events.store.store import EventStore
from events.store.url import sqlite_path
from projections.shell import consistency, parallel, partitions
from projections.shell.runner import FOLD_VERSION
from reports.cli_errors import describe, say
from reports.cli_projections import DB_HELP
from reports.path_params import file_path

BATCH = 10_000
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``verify`` found: the chain ``fault`` or read-model ``mismatch`` (None: intact),
    the events checked, the digest of the head, the position the read models were compared
    at (whatever fold version the checkpoint names: another one is a mismatch), a ``note`` for
    stderr and the ledger's
    schema objects ``missing`` (a guard trigger dropped or disabled: tampered too)."""

    fault: ChainFault | None
    mismatch: consistency.Mismatch | None
    events: int
    head: Digest
    compared_at: int | None
    note: str = ""
    missing: tuple[str, ...] = ()
    structure: IndexFault | None = None

    @property
    def intact(self) -> bool:
        return self.fault is None and self.mismatch is None and not self.missing and self.structure is None

    @property
    def outdated(self) -> bool:
        """The log is whole and the only difference is derived state an older fold version built
        on it (an upgrade; or an edit made to look so: the header holds no secret, so this version
        cannot tell them apart): exit 3; ``rebuild`` recomputes it, no reader does."""
        return (
            self.fault is None
            and not self.missing
            and self.structure is None
            and self.mismatch is not None
            and self.mismatch.outdated
        )


async def structure_of(store: EventStore) -> IndexFault | None:
    """SQLite: the whole file's b-trees (``PRAGMA integrity_check``; every index against its
    table, the first disagreeing position of the log named: :mod:`events.store.integrity`),
    None when sound or on PostgreSQL (the server keeps its own indexes)."""
    path = sqlite_file(store)
    if path is None:
        return None

    def check() -> IndexFault | None:
        conn = integrity.readonly(path)
        try:
            return integrity.structure_fault(conn)
        finally:
            conn.close()

    return await asyncio.to_thread(check)


async def verify_store(store: EventStore, digest: Digest | None = None, *, max_idle_s: float = 30.0) -> Verdict:
    """Check ``store`` (module docstring). Raises what reading or decoding the log raises."""
    structure = asyncio.ensure_future(structure_of(store))
    try:
        verdict = await _verify_log(store, digest, max_idle_s)
    finally:
        found_structure = await structure
    return dataclasses.replace(verdict, structure=found_structure)


async def _verify_log(store: EventStore, digest: Digest | None, max_idle_s: float) -> Verdict:
    found = await store.run_read(consistency.load_models)
    missing = tuple(await store.run_read(missing_guards))
    note = ""
    # Compared whatever the checkpoint says (a fold version edited to skip the comparison hid a
    # deleted finding): another version is named as a mismatch by consistency.compare.
    until: int | None = found.checkpoint[0] if found.checkpoint is not None else 0
    watch = [p for p in (until, digest.position if digest else None) if p]
    head = await store.head_position()
    walker = None
    if store.backend_name == "sqlite" and head >= parallel.PARALLEL_MIN_EVENTS and parallel.default_workers() >= 2:
        walker, fresh = await _walk_and_fold_in_parallel(store, head, until or 0, watch)
    if walker is None:  # a small or PostgreSQL log, or a chain fault to name: one ordered read
        walker, fresh = ChainWalker(watch=watch), consistency.FreshFold(until or 0)
        try:
            await _walk_and_fold(store, head, walker, fresh)
        except Exception:
            # A value the store never writes (text that is not UTF-8, a retyped column) fails
            # the driver or the fold: the plain-sqlite3 walk names it at its position.
            path = sqlite_file(store)
            if path is None:
                raise
            walker = await asyncio.to_thread(walk_sqlite, path, head, watch)
            if walker.finish() is None:
                raise
    fault = walker.finish(digest)
    mismatch = None
    if fault is None and until is not None:
        if until > walker.next_position - 1:
            mismatch = consistency.Mismatch(
                "checkpoint", "", f"position {until} is beyond the log's head {walker.next_position - 1}"
            )
        else:
            mismatch = consistency.compare(
                found, fresh, fold_version=FOLD_VERSION, log_hash=walker.watched.get(until, b""), max_idle_s=max_idle_s
            )
    return Verdict(fault, mismatch, walker.rows, walker.digest(), until, note, missing)


async def _walk_and_fold(store: EventStore, head: int, walker: ChainWalker, fresh: consistency.FreshFold) -> None:
    """One ordered read of rows 1..``head`` (and any row below 1, which the walker names
    ``inserted``): each batch is chain-checked, and only the rows whose links hold are folded
    (an edited row is named, never decoded: its fault comes first, not what its values make
    the fold raise)."""
    # The collector paused for the whole read (events.gc_pause): between batches the
    # driver's rows alone triggered its passes over the fold state (~9 µs an event).
    with gc_paused():
        async for rows in store.read_row_batches(LOWEST_POSITION, until_position=head, batch_size=BATCH):
            going_on = walker.feed(rows)
            checked = walker.next_position
            whole = rows[0].position >= 1 and rows[-1].position < checked
            fresh.feed(rows if whole else [r for r in rows if 1 <= r.position < checked])
            if not going_on:
                return


async def _walk_and_fold_in_parallel(
    store: EventStore, head: int, until: int, watch: list[int]
) -> tuple[ChainWalker | None, consistency.FreshFold]:
    """A large SQLite log: folded to ``until`` by the runner's partition processes (worker
    processes and a thread here, plain ``sqlite3``), each of which also checks the hash-chain
    links of one range of positions 1..``head`` beside its fold
    (:func:`projections.shell.partitions.checked_fresh_fold`): the chain walk is spread over the
    same processes as the fold instead of running in series with it. The walker is None when
    the chain is not intact (the caller then walks in order to name the fault)."""
    path = str(sqlite_path(store.url).resolve())
    try:
        fresh, segments = await partitions.checked_fresh_fold(path, parallel.default_workers(), until, head, watch)
    except Exception:
        # An edited row that fails the fold: named by the ordered walk, unless the chain holds.
        if (await asyncio.to_thread(check_sqlite_segment, path, 1, head, watch)).intact:
            raise
        return None, consistency.FreshFold(until)
    return walker_of([Segment(*found) for found in segments], head), fresh


async def head_digest(store: EventStore) -> tuple[Digest, ChainFault | None]:
    """The head's digest, after checking the whole chain (a digest of a tampered log would
    vouch for the tampering)."""
    return await walk_log(store, BATCH)


MAX_DIGEST_BYTES = 4096
"""The most ``--digest`` reads: a digest is one JSON line of about 150 bytes."""


def _read_digest(path: Path) -> Digest:
    """The digest in ``path`` (a regular file or a pipe), reading at most
    :data:`MAX_DIGEST_BYTES` + 1 bytes: a device (``/dev/zero``), a socket or a bigger file is
    refused (exit 2) instead of read without end."""
    try:
        with path.open("rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                raise ValueError("not a regular file (a digest is the JSON line `duplex-ledger digest` printed)")
            raw = fh.read(MAX_DIGEST_BYTES + 1)
        if len(raw) > MAX_DIGEST_BYTES:
            raise ValueError(
                f"more than {MAX_DIGEST_BYTES} bytes (a digest is the one JSON line `duplex-ledger digest` printed)"
            )
        return Digest.from_json(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        err.print(f"error: --digest {path}: {exc}", markup=False)
        raise typer.Exit(2) from None


def _run_on(db: str | None, body, *, tolerate_missing: bool = False):  # type: ignore[no-untyped-def]
    from events.store.url import read_only_sqlite_ledger

    read_only = read_only_sqlite_ledger(db)  # read-only media: nothing to open for writing

    async def run():  # type: ignore[no-untyped-def]
        async with await EventStore.open(db, tolerate_missing=tolerate_missing, read_only=read_only) as store:
            return await body(store)

    try:
        return asyncio.run(run())
    except ForeignSchemaObject as exc:  # tampering too: named, and nothing of the file was run
        out.print(
            f"TAMPERED: schema: object(s) the ledger did not create: {', '.join(exc.objects)} (refused before "
            "anything ran, the log unchecked: verify a copy without them)",
            markup=False,
        )
        raise typer.Exit(1) from None
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: one line per problem, exit 2
        for line in describe(exc, db):  # (exit 1 means tampered here, so every error is 2)
            say(line, db)
        raise typer.Exit(2) from None


def verify(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    digest: Annotated[
        Path | None,
        typer.Option(
            "--digest",
            parser=file_path(),
            metavar="<file>",
            help="A digest printed earlier by `duplex-ledger digest` (JSON file): also "
            "catches a truncated tail or a rewritten, rehashed history.",
        ),
    ] = None,
) -> None:
    """Prove the ledger is unaltered: recompute the hash chain and check that the read models
    and the checkpoint equal a fresh fold of the log.

    Exit 0 intact; 3 outdated (the log is whole; its read models were built by an older fold
    version of this tool, which this one cannot check: `rebuild` recomputes them); 1 tampered (names the
    first bad position and what is wrong: edited,
    missing, inserted, reordered, rewritten; or the first read-model row or checkpoint
    difference; or the ledger's guard triggers missing or disabled);
    2 usage (missing ledger, bad digest file)."""
    expected = _read_digest(digest) if digest is not None else None
    verdict: Verdict = _run_on(db, lambda store: verify_store(store, expected), tolerate_missing=True)
    if verdict.note:
        err.print(f"note: {verdict.note}", markup=False)
    if verdict.missing:
        out.print(f"TAMPERED: {_missing_line(verdict.missing)}", markup=False)
    if verdict.fault is not None:
        out.print(f"TAMPERED: log {verdict.fault}", markup=False)
    if verdict.structure is not None:
        out.print(_structure_line(verdict.structure), markup=False)
    if verdict.fault is None and verdict.mismatch is not None:
        what = "" if verdict.mismatch.what == "checkpoint" else "read model "
        outdated = (
            "; the log is intact, but this version cannot check derived state an older fold version "
            "built, nor tell it from an edit made to look so"
            if verdict.outdated
            else ""
        )
        out.print(
            f"{'OUTDATED' if verdict.outdated else 'TAMPERED'}: {what}{verdict.mismatch} (at position "
            f"{verdict.compared_at}{outdated}; `duplex-ledger rebuild` recomputes them from the log)",
            markup=False,
        )
    if verdict.outdated:
        raise typer.Exit(3)
    if not verdict.intact:
        raise typer.Exit(1)
    if verdict.compared_at is None:
        checked = ""
    elif not verdict.compared_at and verdict.events:  # a file imported, never folded: nothing to compare
        checked = "; read models not built yet (any `audit` or `tables` builds them)"
    else:
        checked = f"; read models and checkpoint equal a fresh fold at position {verdict.compared_at}"
    against = "" if expected is None else f"; matches the digest at position {expected.position}"
    out.print(
        f"intact: hash chain of {verdict.events} event(s), head hash {verdict.head.hash.hex()}{against}{checked}",
        markup=False,
    )


def digest(db: str | None = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Print the log's head as JSON {position, hash, recorded_at, algorithm}, after checking
    the chain, for the operator to keep elsewhere (`verify --digest FILE` later). Exit 1 when
    the chain is already broken or the ledger's guard triggers are missing (a digest of a
    tampered ledger would vouch for the tampering)."""

    async def check(
        store: EventStore,
    ) -> tuple[tuple[Digest, ChainFault | None], list[str], IndexFault | None]:
        return await head_digest(store), await store.run_read(missing_guards), await structure_of(store)

    (head, fault), missing, structure = _run_on(db, check, tolerate_missing=True)
    if missing:
        out.print(f"TAMPERED: {_missing_line(missing)}", markup=False)
    if fault is not None:
        out.print(f"TAMPERED: log {fault}", markup=False)
    if structure is not None:
        out.print(_structure_line(structure), markup=False)
    if missing or fault is not None or structure is not None:
        raise typer.Exit(1)
    typer.echo(head.to_json())


def _structure_line(found: IndexFault) -> str:
    return f"TAMPERED: database structure at position {found.position}: {found.detail}"


def _missing_line(missing: Sequence[str]) -> str:
    return f"schema: ledger object(s) missing: {', '.join(missing)} (the append-only guard was taken off)"


def register(app: typer.Typer) -> None:
    """Add ``verify`` and ``digest`` to the main CLI app."""
    app.command("verify")(verify)
    app.command("digest")(digest)
