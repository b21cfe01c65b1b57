"""CLI commands over the projections: ``audit``, ``tables``, ``rebuild``.

They work on any ledger (a live deployment's database, a copied SQLite file, or a JSONL export
imported with ``duplex-ledger events import``) and need neither vllm nor torch. A ledger is
untrusted input: ``audit`` and ``tables`` never serve read models or a checkpoint found in it
without checking them against a fresh fold of its log
(:meth:`~projections.shell.runner.ProjectionRunner.checked_catch_up`); derived state that differs
is named on stderr and ignored, and the file is left as found (the evidence stays for
``verify``; ``rebuild`` rewrites it) — the output is the log's, whatever the file holds.

Every row folded is hash-chain checked first (:func:`events.chain_walk.chain_fault`): on a
broken chain the output is printed (the edited log's account, folded in memory, nothing
written), then a ``TAMPERED`` line on stderr names the first bad position, and the exit is 1.

Exit codes (:mod:`reports.cli_errors`): ``audit`` 0 clean, 1 leaks found or the log tampered
(JSON: ``"tampered"`` is null or the fault; stderr tells which); every command 2 for
rejected input (bad URL, missing or foreign file, schema at another revision, unknown
``--session``) and 1 for an operational failure (database unreachable…), with one line on
stderr. A file that is not a ledger is inspected read-only and left byte-identical.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from events.limits import MAX_POSITION
from events.store.url import read_only_sqlite_ledger
from reports.cli_errors import (
    UnknownResponse,
    check_session,
    checked_url,
    committed,
    echo_text,
    exit_if_tampered,
    fail,
    nearest,
    run,
    say,
)
from reports.cli_numbers import max_idle_option
from reports.escape import rich_text

if TYPE_CHECKING:  # imported where used, so `--help` and the other commands start fast (issue 22)
    from rich.table import Table

    from events.chain_walk import ChainFault
    from events.store.store import EventStore
    from projections.findings import Finding
    from projections.metrics import SessionRollup
    from projections.projector import Projector
    from projections.turn_tables import TurnTables

PROJECTIONS = ("all", "request_resources", "audit", "turn_tables")

DB_HELP = "Ledger database URL (default: $DUPLEX_LEDGER_DB_URL or sqlite+aiosqlite:///./duplex-ledger.db)."
DETAIL_MAX = 300
"""Characters of a finding's detail the text audit shows (JSON keeps the whole detail)."""


class AuditFormat(str, Enum):  # noqa: UP042 - typer's choice type
    text = "text"
    json = "json"


class TablesFormat(str, Enum):  # noqa: UP042 - typer's choice type
    text = "text"
    json = "json"
    csv = "csv"
    markdown = "markdown"


async def _projected(
    db: str | None, until_position: int | None, session: str | None = None
) -> tuple[Projector, int, ChainFault | None]:
    """The projector at ``until_position`` (in memory; past the head it is the head, and the
    position reported is the head's), or caught up and persisted, with the first fault of the
    hash chain of the rows folded (None: intact). A SQLite ledger on a read-only file system
    (nothing can be persisted there) is folded in memory to its head. Raises UnknownSession for
    a ``session`` the log does not hold."""
    from events.chain_walk import chain_fault
    from events.store.store import EventStore
    from projections.shell.runner import ProjectionRunner, project_as_of

    in_memory = read_only_sqlite_ledger(db)
    async with await EventStore.open(db, read_only=in_memory) as store:
        await check_session(store, session)
        if until_position is not None or in_memory:
            head = await store.head_position()
            at = head if until_position is None else min(until_position, head)
            return await project_as_of(store, until_position=at), at, await chain_fault(store, at)
        runner = ProjectionRunner(store)
        position = await runner.checked_catch_up()
        assert runner.projector is not None
        return runner.projector, position, runner.chain_fault


def short_detail(detail: str, limit: int = DETAIL_MAX) -> str:
    """``detail`` cut to ``limit`` characters for text output, saying how much was left out
    (an 8 MB detail took rich 24 s to lay out, issue 11)."""
    if len(detail) <= limit:
        return detail
    return f"{detail[:limit]}… ({len(detail) - limit} more characters; --format json shows all)"


async def _replicas_of(url: str, sessions: set[str], until_position: int | None) -> dict[str, str]:
    """Session -> the replica that served it (issue 14), for sessions whose log names one."""
    from events.store.owners import session_lifecycles
    from events.store.store import EventStore

    async with await EventStore.open(url, read_only=True) as store:
        lives = await session_lifecycles(store, stream_ids=sessions, until_position=until_position)
    return {sid: life.served_by.replica_id for sid, life in lives.items() if life.served_by.replica_id}


def _findings_table(title: str, findings: list[Finding], replicas: dict[str, str] | None = None) -> Table:
    """A rich table of findings; every cell is user data, so it is escaped (not markup)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=False)
    columns = (
        "kind",
        "session",
        *(("replica",) if replicas else ()),
        "stage",
        "request_id",
        "first pos",
        "first ts",
        "last pos",
        "evidence",
        "detail",
    )
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in ("kind", "stage", "first pos", "last pos"))
    for f in findings:
        replica = (replicas.get(f.session_id, ""),) if replicas else ()
        cells = (
            f.kind,
            f.session_id,
            *replica,
            "" if f.stage_id is None else str(f.stage_id),
            f.request_id or "",
            str(f.first_position),
            f"{f.first_ts:.6f}",
            str(f.last_position),
            ",".join(map(str, f.evidence[:12])) + ("…" if len(f.evidence) > 12 else ""),
            f.detail,
        )
        table.add_row(*(rich_text(short_detail(c)) for c in cells))
    return table


def audit(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    session: str | None = typer.Option(None, "--session", help="Only this session id."),
    max_idle: float = max_idle_option("Seconds a submitted id may sit idle before it is an orphan."),
    until_position: int | None = typer.Option(
        None, "--until-position", min=0, max=MAX_POSITION, help="Audit the log as of this position (time travel)."
    ),
    fmt: AuditFormat = typer.Option(AuditFormat.text, "--format", help="text or json."),
    now: str | None = typer.Option(
        None,
        "--now",
        help="The time idle ids are judged at: epoch seconds, or 'wall' for this machine's clock "
        "(a crashed deployment's log). Default: the ts of the last event folded (reproducible).",
    ),
) -> None:
    """Find leaked engine request ids, with the log positions that prove each leak.

    Exit 0 when clean, 1 when leaks were found (warnings alone do not fail) or the log's hash
    chain is broken (stderr says which), 2 on usage or data errors (a missing ledger file, a
    --session the log does not hold, a bad --now) — so it can gate a deployment. Open
    sessions still holding engine ids at the end of the log that are not leaks as of "now"
    (a crashed deployment's, with the default "now") are listed: JSON ``held_at_end``, text a
    note on stderr.
    """
    url = checked_url(db)
    as_of_ts = _now(now)
    projector, position, fault = run(lambda: _projected(url, until_position, session), url)
    findings = [f for f in projector.findings(max_idle, as_of_ts) if session is None or f.session_id == session]
    leaks = [f for f in findings if f.severity == "leak"]
    warnings = [f for f in findings if f.severity == "warning"]
    running = projector.resources.running(session)
    held = projector.resources.held(session)
    replicas = run(lambda: _replicas_of(url, {f.session_id for f in findings}, until_position), url) if findings else {}
    leaking = {f.session_id for f in leaks}
    held_at_end = [
        {"session_id": sid, "held": n, "last_position": pos, "last_ts": ts}
        for sid, n, pos, ts in projector.resources.held_at_end()
        if sid not in leaking and (session is None or sid == session)
    ]
    if fmt is AuditFormat.json:

        def doc(f: Finding) -> dict[str, object]:
            return {**f.to_dict(), "replica_id": replicas.get(f.session_id)}

        typer.echo(
            json.dumps(
                {
                    "position": position,
                    "max_idle_s": max_idle,
                    "session_id": session,
                    "running": running,
                    "held": held,
                    "clean": not leaks,
                    "tampered": None if fault is None else dataclasses.asdict(fault),
                    "leaks": [doc(f) for f in leaks],
                    "warnings": [doc(f) for f in warnings],
                    "held_at_end": held_at_end,
                },
                indent=2,
            )
        )
    else:
        console = Console(width=None if Console().is_terminal else 240)
        if leaks:
            console.print(_findings_table(f"Leaks ({len(leaks)})", leaks, replicas))
        if warnings:
            console.print(_findings_table(f"Warnings ({len(warnings)})", warnings, replicas))
        verdict = "clean" if not leaks else "LEAKS FOUND"
        console.print(
            f"audit at position {position}: {verdict} — {len(leaks)} leak(s), {len(warnings)} warning(s); "
            f"running={running} held={held}",
            highlight=False,
            markup=False,
        )
        as_of = "the last event's ts" if as_of_ts is None else f"--now {as_of_ts:.6f}"
        for h in held_at_end:
            say(
                f"note: session {h['session_id']} still holds {h['held']} engine id(s) at the end of the log "
                f"(position {h['last_position']}, ts {h['last_ts']:.6f}; possibly crashed): not a leak as of "
                f"{as_of} with --max-idle {max_idle:g}; `--now wall` judges it against this machine's clock",
                url,
            )
    exit_if_tampered(fault, url)
    raise typer.Exit(1 if leaks else 0)


def _now(value: str | None) -> float | None:
    """``--now``: None (the last event's ts), ``wall`` (``time.time()``, epoch s) or epoch
    seconds; exits 2 for anything else."""
    if value is None:
        return None
    if value == "wall":
        return time.time()
    try:
        ts = float(value)
    except ValueError:
        fail(f"--now must be epoch seconds or 'wall', got {value!r}")
    if not math.isfinite(ts) or ts < 0:
        fail(f"--now must be finite epoch seconds >= 0, got {value!r}")
    return ts


async def _turns(
    db: str | None, session: str | None, response: str | None, until_position: int | None
) -> tuple[list[TurnTables], ChainFault | None]:
    """The turns chosen, with the first fault of the hash chain of the rows folded (in memory
    on read-only media: :func:`events.store.url.read_only_sqlite_ledger`)."""
    from events.chain_walk import chain_fault
    from events.store.store import EventStore
    from projections.shell.runner import ProjectionRunner, project_as_of

    in_memory = read_only_sqlite_ledger(db)
    async with await EventStore.open(db, read_only=in_memory) as store:
        await check_session(store, session)
        if until_position is None and in_memory:
            until_position = await store.head_position()
        if until_position is not None:
            projector = await project_as_of(store, until_position=until_position)
            turns = projector.turn_tables
            fault = await chain_fault(store, min(until_position, await store.head_position()))
        else:
            runner = ProjectionRunner(store)
            await runner.checked_catch_up()
            turns = await runner.turn_tables(session, response)
            fault = runner.chain_fault
        chosen = await _chosen(store, turns, session, response)
    return chosen, fault


async def _chosen(
    store: EventStore, turns: list[TurnTables], session: str | None, response: str | None
) -> list[TurnTables]:
    """The turns of ``session`` / ``response`` (each when given); UnknownResponse for a
    ``response`` the log does not hold."""
    chosen = [
        t
        for t in turns
        if (session is None or t.session_id == session) and (response is None or t.response_id == response)
    ]
    if response is not None and not chosen:
        await check_response(store, session, response)
    return chosen


async def _turns_with_summary(
    db: str | None, session: str | None, response: str | None, until_position: int | None
) -> tuple[list[TurnTables], list[tuple[SessionRollup, list[str]]], ChainFault | None]:
    """``--summary``: the turns chosen, the session rollups and the chain's first fault, from
    one fold of the log (:mod:`reports.summary_fold`; issue 23 step 3)."""
    from events.store.store import EventStore
    from reports.summary_fold import summary_of

    async with await EventStore.open(db, read_only=read_only_sqlite_ledger(db)) as store:
        await check_session(store, session)
        folded = await summary_of(store, session, until_position)
        chosen = await _chosen(store, folded.turns, session, response)
    return chosen, folded.rollups, folded.fault


async def check_response(store: EventStore, session: str | None, response: str) -> None:
    """Raise UnknownResponse when no event (of ``session``, when given) carries ``response``
    as its response_id, naming the nearest ones; a response the log holds that has no turn
    table (listen-only, log_stats off) is not an error."""
    known: set[str] = set()
    async for stored in store.read_all(from_position=1):
        rid = getattr(stored.event, "response_id", None)
        if isinstance(rid, str) and (session is None or stored.stream_id == session):
            known.add(rid)
    if response not in known:
        where = f"session {session!r}" if session is not None else "the log"
        raise UnknownResponse(
            f"no response {response!r} in {where}{nearest(response, sorted(known), 'responses', '`tables --format json` lists them')}"
        )


def render(fmt: TablesFormat, turns: list[TurnTables]) -> str:
    """``turns`` in ``fmt`` (:mod:`reports.render_text`, :mod:`reports.render_formats`)."""
    from reports.render_formats import render_csv, render_json, render_markdown
    from reports.render_text import render_tables_text

    renderer = {
        TablesFormat.text: render_tables_text,
        TablesFormat.json: render_json,
        TablesFormat.csv: render_csv,
        TablesFormat.markdown: render_markdown,
    }[fmt]
    return renderer(turns)


def tables(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    session: str | None = typer.Option(None, "--session", help="Only this session id."),
    response: str | None = typer.Option(None, "--response", help="Only this response_id."),
    until_position: int | None = typer.Option(
        None, "--until-position", min=0, max=MAX_POSITION, help="Re-project as of this position (time travel)."
    ),
    fmt: TablesFormat = typer.Option(TablesFormat.text, "--format", help="text, json, csv or markdown."),
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Also a [DuplexSessionSummary] per closed session (text: after the turn tables; "
            'json: a "sessions" list). text and json only.',
        ),
    ] = False,
) -> None:
    """Re-project the per-turn metric tables (vLLM-Omni --log-stats layout) from the log.

    Text output is byte-identical to what the live engine printed for each turn. Exit 2 for
    a missing ledger file, or a --session or --response the log does not hold (the nearest
    ids are named); a response that made no table is not an error (a note says so on stderr).
    """
    if summary and fmt not in (TablesFormat.text, TablesFormat.json):
        typer.echo("error: --summary works with --format text or json", err=True)
        raise typer.Exit(2)
    url = checked_url(db)
    rollups: list[tuple[SessionRollup, list[str]]] = []
    if summary:  # issue 16: session rollups; issue 23: from the one fold that gives the turns
        turns, rollups, fault = run(lambda: _turns_with_summary(url, session, response, until_position), url)
    else:
        turns, fault = run(lambda: _turns(url, session, response, until_position), url)
    if not turns:
        wanted = ", ".join(
            f"{k} {v!r}"
            for k, v in (("session", session), ("response", response), ("until position", until_position))
            if v is not None
        )
        Console(stderr=True, soft_wrap=True).print(
            f"no turn tables{' for ' + wanted if wanted else ''} "
            "(listen-only turns, chat ids and log_stats off make none)",
            highlight=False,
            markup=False,
        )
    text = render(fmt, turns)
    if summary:
        from reports import render_summary

        text = (
            render_summary.render_json_with_sessions(turns, rollups)
            if fmt is TablesFormat.json
            else text + render_summary.render_summaries_text(rollups)
        )
    _warn_overflows(turns, fmt)
    echo_text(text, nl=not text.endswith("\n"))
    exit_if_tampered(fault, url)


def _warn_overflows(turns: list[TurnTables], fmt: TablesFormat) -> None:
    """One stderr warning when some numbers overflowed (:mod:`reports.overflow`), naming what
    ``fmt`` prints for them: ``null`` in JSON, ``overflow`` in text, Markdown and CSV (as the README
    says; in CSV an empty cell means "not reported", so an overflow is never one)."""
    from reports.overflow import count_overflows

    if n := count_overflows([t.to_dict() for t in turns]):
        shown = "null" if fmt is TablesFormat.json else "'overflow'"
        Console(stderr=True, soft_wrap=True).print(
            f"warning: {n} value(s) overflowed (a sum that is not finite or beyond 64 bits): "
            f"shown as {shown} in this {fmt.value} output",
            highlight=False,
            markup=False,
        )


class ChainBroken(RuntimeError):
    """``rebuild`` of a log whose hash chain is broken: the read models that still disagree
    with the edited events are the evidence, so they are not rewritten."""


async def _rebuild(db: str | None, quiet: bool, workers: int | None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from events.chain_walk import walk_log
    from events.store.store import EventStore
    from projections.shell.runner import ProjectionRunner

    async with await EventStore.open(db) as store:
        _, fault = await walk_log(store)
        if fault is not None:
            raise ChainBroken(
                f"the log's hash chain is broken at {fault}; rebuilding would erase the read models that "
                "still disagree with the edited events, so nothing was changed (run `duplex-ledger verify`)"
            )
        runner = ProjectionRunner(store)
        if quiet or not Console(stderr=True).is_terminal:  # no bar when stderr is piped (issue 16)
            return await runner.rebuild(workers=workers)
        with Progress(
            TextColumn("rebuilding read models"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as progress:
            task = progress.add_task("rebuild", total=None)

            def report(done: int, head: int) -> None:
                progress.update(task, completed=done, total=head)

            return await runner.rebuild(report, workers=workers)


def rebuild(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    projection: str = typer.Option(
        "all",
        "--projection",
        help="Projection to rebuild: all, request_resources, audit or turn_tables. "
        "They share one checkpoint, so each rebuilds all three.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar and no closing line (errors still print)."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        max=64,
        help="Worker processes for a SQLite log (default: the CPUs available, "
        "at most 8, for logs of 200,000 events or more; 1 = sequential).",
    ),
) -> None:
    """Drop the read models and rebuild them from the log (never touches the events)."""
    if projection not in PROJECTIONS:
        typer.echo(f"error: --projection must be one of {', '.join(PROJECTIONS)}, got {projection!r}", err=True)
        raise typer.Exit(2)
    url = checked_url(db)
    position = run(lambda: _rebuild(url, quiet, workers), url)
    if not quiet:
        committed(f"rebuilt read models up to position {position}", f"the rebuild (up to position {position})")


def register(app: typer.Typer) -> None:
    """Add ``audit``, ``tables`` and ``rebuild`` to the main CLI app."""
    app.command("audit")(audit)
    app.command("tables")(tables)
    app.command("rebuild")(rebuild)
