"""``duplex-ledger sessions``: the sessions of a log, one row each, so an id can be found
before ``audit --session`` / ``tables --session`` / ``timeline --session`` are asked about it.

Built from the log alone, in memory (nothing is written, no vllm): the lifecycle fold of
:func:`events.store.owners.session_lifecycles` (open/closed, the replica that served it), the
request_resources fold of :func:`projections.shell.runner.project_as_of` (engine ids still held,
DOMAIN §3.3, and the finalized turn tables counted in ``turns``), and one pass over the events
for positions and ts. The rows folded
are hash-chain checked first, as every command that folds the log does (exit 1, ``TAMPERED``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum

import typer

from reports.cli_errors import checked_url, echo_text, exit_if_tampered, run
from reports.cli_projections import DB_HELP


class SessionsFormat(str, Enum):  # noqa: UP042 - typer's choice type
    text = "text"
    json = "json"


@dataclass(slots=True)
class SessionRow:
    """One session of the log. ``turns``: the session's finalized assistant turns, one per turn
    table ``tables`` prints for it (one assistant turn = one response_id = one table set, DOMAIN
    §5), so ``sessions`` and ``tables``/``tables --summary`` (``turns_total``) agree on one log.
    Not the user commits (TurnCommitted, §2.3): a commit that asks no response, a listen-only
    turn or a turn still open has no table, and a response begun with no commit of its own has
    one. ``held``: engine request ids the session still holds (request_resources,
    by id); positions are log positions, ts epoch seconds."""

    session_id: str
    state: str  # "open" | "closed"
    replica_id: str | None
    turns: int = 0
    held: list[str] = field(default_factory=list)
    first_position: int = 0
    first_ts: float = 0.0
    last_position: int = 0
    last_ts: float = 0.0


async def session_rows(url: str) -> tuple[list[SessionRow], object]:
    """Every session of the log at ``url``, by session id, and the first fault of the hash
    chain of the rows read (None: intact)."""
    from events.chain_walk import chain_fault
    from events.store.owners import session_lifecycles
    from events.store.store import EventStore
    from projections.shell.runner import project_as_of

    async with await EventStore.open(url, read_only=True) as store:
        head = await store.head_position()
        rows: dict[str, SessionRow] = {}
        async for stored in store.read_all(from_position=1, until_position=head):
            row = rows.get(stored.stream_id)
            ts = stored.event.ts
            if row is None:
                row = rows[stored.stream_id] = SessionRow(
                    stored.stream_id, "open", None, first_position=stored.position, first_ts=ts
                )
            row.last_position, row.last_ts = stored.position, ts
        lives = await session_lifecycles(store, until_position=head)
        projector = await project_as_of(store, until_position=head)
        fault = await chain_fault(store, head)
    for turn in projector.turn_tables:
        if turn.session_id in rows:
            rows[turn.session_id].turns += 1
    for sid, row in rows.items():
        life = lives.get(sid)
        if life is not None:
            row.state = "open" if life.open else "closed"
            row.replica_id = life.served_by.replica_id or life.owner.replica_id
        resources = projector.resources.sessions.get(sid)
        row.held = sorted({key[1] for key in resources.bindings}) if resources is not None else []
    return [rows[sid] for sid in sorted(rows)], fault


def render_text(rows: list[SessionRow]) -> str:
    """A fixed-width table (one line a session; held ids comma-separated)."""
    header = (
        "session",
        "state",
        "replica",
        "turns",
        "held",
        "first pos",
        "first ts",
        "last pos",
        "last ts",
        "held ids",
    )
    from reports.printable import printable

    cells = [
        tuple(
            map(
                printable,
                (
                    r.session_id,
                    r.state,
                    r.replica_id or "-",
                    str(r.turns),
                    str(len(r.held)),
                    str(r.first_position),
                    f"{r.first_ts:.6f}",
                    str(r.last_position),
                    f"{r.last_ts:.6f}",
                    ",".join(r.held) or "-",
                ),
            )
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in (header, *cells)]
    return "\n".join(lines) + "\n"


def sessions(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    fmt: SessionsFormat = typer.Option(SessionsFormat.text, "--format", help="text or json."),
) -> None:
    """List the sessions of the log: id, state (open/closed), the replica that served it,
    assistant turns finalized (one per turn table `tables` prints), engine ids still held, first and last log position and ts.

    Nothing is written. Exit 0; 1 when the log's hash chain is broken (after the list); 2
    for a bad --db (missing file, not a ledger)."""
    url = checked_url(db)
    rows, fault = run(lambda: session_rows(url), url)
    if fmt is SessionsFormat.json:
        echo_text(json.dumps({"sessions": [asdict(r) for r in rows]}, indent=2))
    else:
        echo_text(render_text(rows), nl=False)
    exit_if_tampered(fault, url)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    """Add ``sessions`` to the main CLI app."""
    app.command("sessions")(sessions)
