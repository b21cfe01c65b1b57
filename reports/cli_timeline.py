"""CLI command ``timeline``: one session's timeline as a self-contained HTML page (issue 16).

Reads the session's stored events (any ledger: a live deployment's database, a copied SQLite
file, an imported JSONL export) and writes ``reports.timeline``'s plotly page. Needs neither
vllm nor torch; the page needs no network. Exit 0, 1 when the log's hash chain is broken up to
the session's last event (after writing the page), or 2 for a missing ledger, a session the
log does not hold, or an unwritable output or one that is the ledger file itself
(:mod:`reports.output_file`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from events.chain_walk import ChainFault, chain_fault
from events.records import StoredEvent
from events.store.store import EventStore
from reports.cli_errors import check_session, checked_url, exit_if_tampered, run
from reports.cli_projections import DB_HELP
from reports.path_params import file_path


async def session_events(db: str | None, session: str) -> tuple[list[StoredEvent], ChainFault | None]:
    """The session's events in log order, with the first fault of the log's hash chain up to
    the session's last event (None: intact); raises UnknownSession when the log has none."""
    async with await EventStore.open(db, read_only=True) as store:
        events = await store.read_stream(session)
        if not events:
            await check_session(store, session)  # raises UnknownSession naming the nearest ids
        fault = await chain_fault(store, events[-1].position)
    return events, fault


def timeline(
    session: str = typer.Option(..., "--session", help="The session id to draw."),
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        parser=file_path(dash=True),
        metavar="<file>",
        help="HTML file to write ('-': standard output).",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Write one session's timeline (speech, commits, each response's span per stage, aborts and
    their results, epochs, listen units, leaks and warnings; hover: event and position) as one
    self-contained HTML file."""
    from reports.output_file import named_output, output_file, refuse_ledger_target
    from reports.timeline import timeline_html

    url = checked_url(db)
    target = named_output(output)
    if target is not None:
        refuse_ledger_target(target, url)
    events, fault = run(lambda: session_events(url, session), url)
    page = timeline_html(events)
    if target is None:  # a page piped on (`timeline -o - | gzip`)
        sys.stdout.write(page)
        sys.stdout.flush()
        exit_if_tampered(fault, url)
        return
    with output_file(target) as fh:
        fh.write(page)
    size = len(page.encode("utf-8"))
    typer.echo(f"wrote {output} ({size / 1024:.0f} KiB, {len(events)} events of session {session!r})")
    exit_if_tampered(fault, url)


def register(app: typer.Typer) -> None:
    """Add ``timeline`` to the main CLI app."""
    app.command("timeline")(timeline)
