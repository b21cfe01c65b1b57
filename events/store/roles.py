"""PostgreSQL privileges of the application role (issue 12).

The role that owns a table can ``ALTER TABLE … DISABLE TRIGGER`` and drop the append-only
triggers, so the owner (which runs ``duplex-ledger db upgrade``) is not the role the
application connects as. :func:`app_grants` lists what the application role needs and nothing
more: SELECT/INSERT on ``events``; SELECT on ``alembic_version`` (the store checks the schema
revision); SELECT/INSERT/UPDATE/DELETE on the read-model tables and the checkpoint (the runner
replaces their rows). Not being the owner, it cannot UPDATE, DELETE or TRUNCATE events, nor
disable, drop or replace a trigger.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Connection

from events.store.backends import make_backend
from events.store.url import backend_of, redact, resolve_url

READ_MODEL_TABLES = ("projection_checkpoints", "rm_request_resources", "rm_audit_findings", "rm_turn_tables")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def app_grants(role: str, quote: Callable[[str], str] = _quote) -> list[str]:
    """The GRANT statements for ``role`` (an identifier, quoted by ``quote``)."""
    r = quote(role)
    return [
        f"GRANT USAGE ON SCHEMA public TO {r}",
        f"GRANT SELECT, INSERT ON events TO {r}",
        f"GRANT SELECT ON alembic_version TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(READ_MODEL_TABLES)} TO {r}",
    ]


def _grant(conn: Connection, role: str) -> None:
    quote = conn.dialect.identifier_preparer.quote
    for statement in app_grants(role, quote):
        conn.exec_driver_sql(statement)


async def grant_app_role(url: str | None, role: str) -> None:
    """Run :func:`app_grants` on the PostgreSQL database at ``url`` (connected as the tables'
    owner, after ``db upgrade``). Raises ValueError for a SQLite URL (a file has no roles:
    anyone who can write it can change it; ``verify`` is its protection); the database's
    error for an unknown role or a connection that is not the owner."""
    url = resolve_url(url)
    if backend_of(url) != "postgresql":
        raise ValueError(
            f"{redact(url)}: roles exist only on PostgreSQL (a SQLite file is protected by `duplex-ledger verify`)"
        )
    backend = make_backend(url)
    try:
        await backend.run_write(_grant, role)
    finally:
        await backend.dispose()
