"""CLI commands for the log itself: ``db …``, ``events …`` and ``schema``.

Exit codes (:mod:`reports.cli_errors`): 0 success; 1 operational error (unreachable database,
login refused, file system); 2 rejected input (bad URL, missing or foreign file, schema at
another revision, bad JSONL lines, a version or event-id conflict) — nothing was appended.
Read commands (``db current``, ``events export``, ``events tail``) open a SQLite file
read-only and leave it byte-identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from events.limits import MAX_POSITION
from events.store.url import DEFAULT_URL, ENV_VAR, redact
from reports.cli_errors import (
    TAMPERED,
    check_session,
    checked_url,
    committed,
    describe,
    fail,
    run,
    say,
    tampered_line,
)
from reports.path_params import file_path

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar=ENV_VAR,
        show_default=DEFAULT_URL,
        help=f"Database URL: sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASS@HOST/DB (env {ENV_VAR}).",
    ),
]

db_app = typer.Typer(help="Create, upgrade or downgrade the ledger schema (Alembic revisions).", no_args_is_help=True)
events_app = typer.Typer(help="Move events in and out of the log as JSONL, or follow it live.", no_args_is_help=True)


async def _open(url: str) -> Any:
    from events.store import EventStore

    return await EventStore.open(url, read_only=True)


# --- db ----------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Create the database schema, or upgrade it to REVISION (default: the newest)."""
    from events.store import migrate

    url = checked_url(db)

    async def body() -> tuple[str | None, str | None]:
        before = await migrate.current_revision(url)
        return before, await migrate.upgrade(url, revision)

    before, now = run(body, url)
    already = f"the database was already at revision {now}" if before == now else None
    committed(f"{redact(url)} is at revision {now}", f"the upgrade to revision {now}", unchanged=already)


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; 'base' drops every ledger table.")] = "base",
    db: DbOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Downgrade the schema to REVISION. Going below a revision drops its tables AND their
    data (to 'base': the whole log)."""
    from events.store import migrate

    url = checked_url(db)
    shown = redact(url)
    if not yes and not typer.confirm(f"Downgrade {shown} to {revision}? Tables above it are dropped with their data"):
        raise typer.Exit(1)

    async def body() -> tuple[str | None, str | None]:
        before = await migrate.current_revision(url)
        return before, await migrate.downgrade(url, revision)

    before, now = run(body, url)
    already = f"the database was already at revision {now or 'base'}" if before == now else None
    committed(
        f"{shown} is at revision {now or 'base (empty)'}",
        f"the downgrade to revision {now or 'base'}",
        unchanged=already,
    )


@db_app.command("current")
def db_current(db: DbOption = None) -> None:
    """Print the database's schema revision and the newest one this code knows (read-only:
    the database is left as it was)."""
    from events.store import migrate
    from events.store.url import missing_sqlite_file

    url = checked_url(db)
    missing = missing_sqlite_file(url)
    now = run(lambda: migrate.current_revision(url), url)
    head = migrate.head_revision()
    status = migrate.revision_status(now)
    if missing is not None:
        state = f"no such ledger file {str(missing)!r}; `duplex-ledger db upgrade` creates it"
    elif status == "current":
        state = "up to date"
    elif status == "newer":
        state = (
            f"the database is newer than this code, which knows up to {head}: this duplex-ledger is older "
            "than the database; upgrade duplex-ledger (`db upgrade` cannot help)"
        )
    else:
        state = f"needs `duplex-ledger db upgrade` (code head {head})"
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

    url = checked_url(db)
    run(lambda: grant_app_role(url, role), url)
    committed(f"granted {role} SELECT/INSERT on events and the read models on {redact(url)}", f"the grant to {role}")


# --- events ------------------------------------------------------------------------------
@events_app.command("import")
def events_import(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            allow_dash=True,
            path_type=str,  # typer compares the converted value with "-": a Path never equals it
            help="JSONL file, one event per line; - reads standard input (a pipe from events export).",
        ),
    ],
    db: DbOption = None,
) -> None:
    """Import events from a JSONL file. Every line is checked first; any bad line is reported
    with its line number and field, and then nothing is imported (exit 2). Lines whose
    event_id is already stored with the same content are skipped, so re-importing a file is
    harmless; a stored id with other content is a conflict naming the line (exit 2). A SQLite
    file that does not exist yet is created as a new ledger (once every line passed; not for an
    input with no line). The last line counts the lines read: imported, already present,
    refused (their numbers), blank."""
    from events import jsonl
    from events.store import EventStore
    from events.store.probe import undo_creation
    from events.store.store import ImportResult
    from events.store.url import missing_ancestor, missing_sqlite_file
    from reports.import_summary import ImportRefused, LineCount, imported_line, refused_line
    from reports.progress import shows_progress, stderr_console, track_lines

    url = checked_url(db)
    lines = LineCount()
    file = Path(file)  # typer hands the text (path_type=str)
    source = "standard input" if str(file) == "-" else str(file)

    async def body() -> Any:
        try:
            return await _import()
        except jsonl.JsonlError as exc:  # count the refused lines, not their errors
            raise ImportRefused(exc.errors, refused_line(source, lines, exc.errors)) from exc

    async def _import() -> Any:
        if str(file) == "-":  # standard input: read to its end before anything is written
            if sys.stdin is None:  # started with standard input closed (`<&-`): Python sets it None
                fail("standard input is closed: pipe the events in (events export | events import -)", url=url)
            rows = jsonl.parse_lines(lines.counted(sys.stdin.buffer))
        else:
            with file.open("rb") as fh:  # a byte bar while lines are checked (terminal only)
                rows = jsonl.parse_lines(lines.counted(track_lines(fh, file.stat().st_size, f"checking {file.name}")))
        new_file = missing_sqlite_file(url)
        if not rows and new_file is not None:  # nothing to import: no empty ledger is created
            return ImportResult([], 0)  # (an export that failed upstream of `| events import -`)
        created = missing_ancestor(new_file) if new_file is not None else None
        store = await EventStore.open(url, create=new_file is not None)
        try:
            if not shows_progress():
                return await jsonl.import_rows(store, rows)
            with stderr_console().status(f"importing {len(rows)} event(s) in one transaction…"):
                return await jsonl.import_rows(store, rows)
        except BaseException:
            await store.close()
            if created is not None:  # nothing was imported: leave no new ledger file behind either
                undo_creation(url, created)  # unless another process appended to it meanwhile
            raise
        finally:
            await store.close()

    result = run(body, url)
    committed(
        imported_line(source, lines, result.appended, result.skipped),
        f"the import ({result.appended} event(s) from {source})",
        unchanged=None
        if result.appended
        else f"every event from {source} was already stored"
        if result.skipped
        else f"{source} holds no event",
    )


@events_app.command("export")
def events_export(
    db: DbOption = None,
    stream: Annotated[str | None, typer.Option("--stream", "-s", help="Only this stream (session id).")] = None,
    from_position: Annotated[
        int, typer.Option("--from-position", min=0, max=MAX_POSITION, help="First position (inclusive).")
    ] = 0,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            parser=file_path(dash=True),
            metavar="<file>",
            help="Write here instead of stdout ('-': stdout).",
        ),
    ] = None,
) -> None:
    """Export events as JSONL in log order (format: see README). Exporting a whole log and
    importing it into an empty database reproduces the same export byte for byte. An
    ``--output`` that is the ledger file (or its -wal/-shm/-journal, or a link to one) is
    refused (exit 2); a regular file is replaced only once the export is complete. A whole-log
    export (``--from-position`` 0) starts at the lowest position: a row a forger wrote below 1
    is exported too, after the ``TAMPERED`` line (the log as stored is the evidence)."""
    from events import jsonl
    from events.chain_walk import LOWEST_POSITION, chain_fault
    from reports.output_file import named_output, output_file, refuse_ledger_target
    from reports.progress import progress_bar

    url = checked_url(db)
    output = named_output(output)
    if output is not None:
        refuse_ledger_target(output, url)

    async def body() -> tuple[int, bool]:
        store = await _open(url)
        try:
            await check_session(store, stream)
            # The rows exported are the evidence either way; a broken chain is said first (issue 22).
            fault = await chain_fault(store, await store.head_position())
            if fault is None:
                return await _export(store), False
            say(f"{tampered_line(fault)} (the export is the log as stored; run `duplex-ledger verify`)", url)
            try:
                return await _export(store), True
            except Exception as exc:  # noqa: BLE001 - a value the edit left that no line can hold
                for line in describe(exc, url):
                    say(line, url)
                raise typer.Exit(TAMPERED) from None
        finally:
            await store.close()

    start = from_position or LOWEST_POSITION  # 0: the whole log, a row forged below 1 too

    async def _export(store: Any) -> int:
        if output is None:
            return await jsonl.export_to(store, sys.stdout, stream_id=stream, from_position=start)
        total = await store.head_position() - max(from_position - 1, 0) if stream is None else None
        n = 0
        with (
            output_file(output) as fh,
            progress_bar(f"exporting to {output.name}", total) as advance,
        ):  # terminal only
            async for line in jsonl.export_lines(store, stream_id=stream, from_position=start):
                fh.write(line)
                n += 1
                advance(1)
        return n

    n, tampered = run(body, url)
    if output is not None:
        say(f"exported {n} event(s) to {output}")
    if tampered:
        raise typer.Exit(TAMPERED)


@events_app.command("tail")
def events_tail(
    db: DbOption = None,
    from_position: Annotated[
        int | None,
        typer.Option(
            "--from-position", min=0, max=MAX_POSITION, help="Start here (inclusive); default: only new events."
        ),
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between checks for other writers' commits.")] = 0.25,
) -> None:
    """Print events as JSONL as they are committed, until Ctrl-C."""
    from events import jsonl

    url = checked_url(db)

    async def body() -> None:
        store = await _open(url)
        try:
            start = from_position if from_position is not None else await store.head_position() + 1
            async for row in store.subscribe_rows(start, poll_interval=poll_interval):
                sys.stdout.write(jsonl.format_line(row) + "\n")
                sys.stdout.flush()
        finally:
            await store.close()

    try:
        run(body, url)
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
