"""CLI commands for the log itself: ``db …``, ``events …`` and ``schema``.

Exit codes: 0 success; 1 operational error (no schema, unreachable database, bad URL);
2 rejected input (bad JSONL lines, a version or event-id conflict) — nothing was appended.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console

from events.store.errors import ConcurrencyError, EventIdConflict, StoreError
from events.store.url import DEFAULT_URL, ENV_VAR, redact, resolve_url

T = TypeVar("T")
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        envvar=ENV_VAR,
        show_default=DEFAULT_URL,
        help=f"Database URL: sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASS@HOST/DB (env {ENV_VAR}).",
    ),
]

db_app = typer.Typer(help="Create, upgrade or downgrade the ledger schema (Alembic revisions).", no_args_is_help=True)
events_app = typer.Typer(help="Move events in and out of the log as JSONL, or follow it live.", no_args_is_help=True)


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async command body; map known errors to a message and an exit code."""
    from events.jsonl import JsonlError

    try:
        return asyncio.run(coro_fn())
    except JsonlError as exc:
        for line_error in exc.errors:
            err.print(str(line_error), markup=False)
        err.print(f"{len(exc.errors)} bad line(s); nothing was imported", markup=False)
        raise typer.Exit(2) from None
    except (ConcurrencyError, EventIdConflict) as exc:
        err.print(f"error: {exc}; nothing was imported", markup=False)
        raise typer.Exit(2) from None
    except (StoreError, ValueError, OSError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None


async def _open(db: str | None) -> Any:
    from events.store import EventStore

    return await EventStore.open(db)


# --- db ----------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Create the database schema, or upgrade it to REVISION (default: the newest)."""
    from events.store import migrate

    now = _run(lambda: migrate.upgrade(db, revision))
    typer.echo(f"{redact(resolve_url(db))} is at revision {now}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; 'base' drops every ledger table.")] = "base",
    db: DbOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Downgrade the schema to REVISION. Going below a revision drops its tables AND their
    data (to 'base': the whole log)."""
    from events.store import migrate

    shown = redact(resolve_url(db))
    if not yes and not typer.confirm(f"Downgrade {shown} to {revision}? Tables above it are dropped with their data"):
        raise typer.Exit(1)
    now = _run(lambda: migrate.downgrade(db, revision))
    typer.echo(f"{shown} is at revision {now or 'base (empty)'}")


@db_app.command("current")
def db_current(db: DbOption = None) -> None:
    """Print the database's schema revision and the newest one this code knows."""
    from events.store import migrate
    from events.store.url import missing_sqlite_file

    now = _run(lambda: migrate.current_revision(db))  # also validates the URL (exit 1)
    head = migrate.head_revision()
    missing = missing_sqlite_file(resolve_url(db))
    if missing is not None:
        state = f"no such ledger file {str(missing)!r}; `duplex-ledger db upgrade` creates it"
    else:
        state = "up to date" if now == head else f"needs `duplex-ledger db upgrade` (code head {head})"
    typer.echo(f"{now or 'none'} ({state})")


@db_app.command("grant")
def db_grant(
    role: Annotated[str, typer.Argument(help="The application role (PostgreSQL), e.g. ledger_app.")],
    db: DbOption = None,
) -> None:
    """PostgreSQL: give the application ROLE only what it needs (SELECT/INSERT on events, the
    read-model tables); run as the tables' owner after `db upgrade`. The application then
    connects as ROLE and cannot update, delete or disable the append-only triggers."""
    from events.store.roles import grant_app_role

    _run(lambda: grant_app_role(db, role))
    typer.echo(f"granted {role} SELECT/INSERT on events and the read models on {redact(resolve_url(db))}")


# --- events ------------------------------------------------------------------------------
@events_app.command("import")
def events_import(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="JSONL file, one event per line.")],
    db: DbOption = None,
) -> None:
    """Import events from a JSONL file. Every line is checked first; any bad line is reported
    with its line number and field, and then nothing is imported (exit 2). Lines whose
    event_id is already stored are skipped, so re-importing a file is harmless. A SQLite
    file that does not exist yet is created as a new ledger (once every line passed)."""
    from events import jsonl
    from events.store import EventStore
    from events.store.url import missing_sqlite_file

    async def body() -> Any:
        with file.open(encoding="utf-8") as fh:
            rows = jsonl.parse_lines(fh)
        url = resolve_url(db)
        store = await EventStore.open(url, create=missing_sqlite_file(url) is not None)
        try:
            return await store.append_records(rows)
        finally:
            await store.close()

    result = _run(body)
    typer.echo(f"imported {result.appended} event(s) from {file} ({result.skipped} already present)")


@events_app.command("export")
def events_export(
    db: DbOption = None,
    stream: Annotated[Optional[str], typer.Option("--stream", "-s", help="Only this stream (session id).")] = None,
    from_position: Annotated[int, typer.Option("--from-position", min=0, help="First position (inclusive).")] = 0,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", dir_okay=False, help="Write here instead of stdout.")] = None,
) -> None:
    """Export events as JSONL in log order (format: see README). Exporting a whole log and
    importing it into an empty database reproduces the same export byte for byte."""
    from events import jsonl

    async def body() -> int:
        store = await _open(db)
        try:
            if output is None:
                return await jsonl.export_to(store, sys.stdout, stream_id=stream, from_position=from_position)
            with output.open("w", encoding="utf-8", newline="\n") as fh:
                return await jsonl.export_to(store, fh, stream_id=stream, from_position=from_position)
        finally:
            await store.close()

    n = _run(body)
    if output is not None:
        err.print(f"exported {n} event(s) to {output}", markup=False)


@events_app.command("tail")
def events_tail(
    db: DbOption = None,
    from_position: Annotated[
        Optional[int], typer.Option("--from-position", min=0, help="Start here (inclusive); default: only new events.")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between checks for other writers' commits.")] = 0.25,
) -> None:
    """Print events as JSONL as they are committed, until Ctrl-C."""
    from events import jsonl

    async def body() -> None:
        store = await _open(db)
        try:
            start = from_position if from_position is not None else await store.head_position() + 1
            async for row in store.subscribe_rows(start, poll_interval=poll_interval):
                sys.stdout.write(jsonl.format_line(row) + "\n")
                sys.stdout.flush()
        finally:
            await store.close()

    try:
        _run(body)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


# --- schema ------------------------------------------------------------------------------
def schema() -> None:
    """Print the JSON Schema of every event kind (a union discriminated by "type")."""
    from events.types import json_schema

    typer.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


def register(app: typer.Typer) -> None:
    """Add ``db``, ``events`` and ``schema`` to the top-level app."""
    app.add_typer(db_app, name="db")
    app.add_typer(events_app, name="events")
    app.command("schema")(schema)
