"""CLI argument corpus: each bad invocation is one clear line with exit 1 (operational) or 2
(rejected input), no traceback, no password, nothing changed (issue 11 points 5, 7, 8)."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from projections.findings import Finding
from reports.cli_errors import exit_code
from reports.cli_projections import _findings_table
from tests.reliability.support import LOG, SECRET, cli, fingerprint, refused_cleanly

COMMANDS = [
    ("audit",),
    ("tables",),
    ("rebuild", "--quiet"),
    ("events", "export"),
    ("db", "current"),
    ("db", "upgrade"),
    ("events", "tail"),
    ("events", "import", str(LOG)),
]
BAD_URLS = {
    "garbage": ("garbage", 2),
    "empty": ("", 2),
    "blank": ("  ", 2),
    "unsupported": (f"mysql://u:{SECRET}@h/db", 2),
    "sync sqlite driver": ("sqlite:///x.db", 2),
    "in-memory sqlite": ("sqlite+aiosqlite://", 2),
    "unparsable with password": (f"postgresql+asyncpg://u:{SECRET}@h:notaport/db", 2),
    "unreachable server": (f"postgresql+asyncpg://u:{SECRET}@127.0.0.1:1/db", 1),
}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("name", sorted(BAD_URLS))
def test_bad_db_url(tmp_path, monkeypatch, name: str, command: tuple[str, ...]) -> None:
    monkeypatch.chdir(tmp_path)
    url, code = BAD_URLS[name]
    refused_cleanly(cli(*command, "--db", url), code)
    assert list(tmp_path.iterdir()) == []  # not the default ./duplex-ledger.db, nor x.db


@pytest.fixture
def ledger(db_url: str) -> str:
    assert cli("db", "upgrade", "--db", db_url).exit_code == 0
    assert cli("events", "import", str(LOG), "--db", db_url).exit_code == 0
    return db_url


@pytest.mark.parametrize("command", ["audit", "tables"])
@pytest.mark.parametrize("session", ["[/]", "[bold]S1", "[link=x]y[/link]", "S1\\[x]"])
def test_session_text_is_not_markup(ledger: str, command: str, session: str) -> None:
    result = cli(command, "--db", ledger, "--session", session)
    refused_cleanly(result, 2)
    assert f"no session {session!r} in the log" in result.output


def _sql(url: str, *statements: str) -> None:
    sync = make_url(url).set(drivername="postgresql+psycopg" if url.startswith("postgresql") else "sqlite")
    if sync.drivername.startswith("postgresql"):  # no sync driver needed: use asyncpg through asyncio
        import asyncio

        import asyncpg

        async def go() -> None:
            conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
            try:
                for s in statements:
                    await conn.execute(s)
            finally:
                await conn.close()

        asyncio.run(go())
        return
    engine = sa.create_engine(sync)
    with engine.begin() as conn:
        for s in statements:
            conn.exec_driver_sql(s)
    engine.dispose()


def test_upgrade_after_alembic_version_was_dropped(ledger: str) -> None:
    _sql(ledger, "DROP TABLE alembic_version")
    before = export_rows(ledger)
    for command in (("db", "upgrade"), ("audit",), ("events", "export"), ("db", "current")):
        result = cli(*command, "--db", ledger)
        refused_cleanly(result, 2)
        assert "no schema revision" in result.output
    assert export_rows(ledger) == before


def export_rows(url: str) -> list[tuple]:
    """The events table, read around the CLI (which refuses a ledger without a revision)."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    async def go() -> list[tuple]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                return [tuple(r) for r in (await conn.execute(sa.text("SELECT * FROM events ORDER BY position"))).all()]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_newer_schema_says_the_code_is_older(ledger: str) -> None:
    _sql(ledger, "UPDATE alembic_version SET version_num = '9999_from_the_future'")
    current = cli("db", "current", "--db", ledger)
    assert current.exit_code == 0 and "older than the database" in current.output
    assert "needs `duplex-ledger db upgrade`" not in current.output
    for command in (("audit",), ("events", "export"), ("tables",)):
        result = cli(*command, "--db", ledger)
        refused_cleanly(result, 2)
        assert "newer than this code" in result.output and "db upgrade --db" not in result.output


@pytest.mark.postgres
@pytest.mark.parametrize("what", ["wrong password", "missing database"])
def test_postgres_login_failures_are_one_line(pg_url: str, what: str) -> None:
    url = make_url(pg_url)
    bad = url.set(password=SECRET) if what == "wrong password" else url.set(database="no_such_db_" + SECRET[:4])
    shown = bad.render_as_string(hide_password=False)
    for command in (("audit", "--session", "nosuch"), ("db", "current"), ("db", "upgrade")):
        result = cli(*command, "--db", shown)
        refused_cleanly(result, 1)


def test_password_never_printed(tmp_path) -> None:
    url = f"postgresql+asyncpg://user:{SECRET}@127.0.0.1:1/db"
    for command in (
        ("audit", "--session", "nosuch"),
        ("db", "current"),
        ("db", "upgrade"),
        ("db", "downgrade", "base", "--yes"),
    ):
        result = cli(*command, "--db", url)
        assert SECRET not in result.output and "***" in result.output, result.output


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (
            "non-UTF-8 byte",
            b'{"type":"session.open","session":"A"}\n{"type":"input.append","session":"A","text":"\xff"}\n',
        ),
        ("nested 3000 deep", b'{"type":"session.open","session":"A"}\n{"x":' + b"[" * 3000 + b"]" * 3000 + b"}\n"),
    ],
)
def test_bad_trace_for_run_names_the_line(tmp_path, name: str, content: bytes) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content)
    result = cli("run", str(trace), "--db", f"sqlite+aiosqlite:///{tmp_path}/l.db")
    refused_cleanly(result, 2)
    assert "line 2" in result.output
    assert not (tmp_path / "l.db").exists()


def test_text_audit_truncates_long_details_json_keeps_them() -> None:
    finding = Finding("S1", 0, "r", "stale_not_aborted", 1, 1.0, 2, 2.0, (1, 2), "x" * 8_000_000, "leak")
    from rich.console import Console

    console = Console(width=240, file=open("/dev/null", "w"), record=True)
    started = time.monotonic()
    console.print(_findings_table("Leaks", [finding]))
    assert time.monotonic() - started < 3
    assert "more characters; --format json shows all" in console.export_text()
    assert len(json.dumps(finding.to_dict())) > 8_000_000


def test_exit_code_policy_is_one_table() -> None:
    """The same error class gives the same code from every command."""
    from events.jsonl import JsonlError
    from events.store.errors import LedgerNotFound, NotALedger, SchemaRevisionError

    assert {
        exit_code(e)
        for e in (SchemaRevisionError("x"), LedgerNotFound("x"), NotALedger("x"), JsonlError([]), ValueError("x"))
    } == {2}
    assert {exit_code(e) for e in (OSError("x"), ConnectionRefusedError(), RuntimeError("x"))} == {1}


def test_fingerprint_helper_sees_changes(tmp_path) -> None:
    """Guard for the byte-identity checks: a changed file must be seen as changed."""
    path = tmp_path / "f"
    path.write_bytes(b"a")
    before = fingerprint(path)
    path.write_bytes(b"b")
    assert fingerprint(path) != before


def test_a_password_that_is_also_the_user_name_garbles_nothing():
    from events.store.url import scrub

    url = "postgresql+asyncpg://ledger:ledger@127.0.0.1:5432/ledger_test"
    message = f"{url} has no duplex-ledger schema; run `duplex-ledger db upgrade --db {url}`"
    assert scrub(message, url) == (
        "postgresql+asyncpg://ledger:***@127.0.0.1:5432/ledger_test has no duplex-ledger "
        "schema; run `duplex-ledger db upgrade --db "
        "postgresql+asyncpg://ledger:***@127.0.0.1:5432/ledger_test`"
    )
    secret = "postgresql+asyncpg://u:S3cr3tPW@h/db"
    assert "S3cr3tPW" not in scrub("connect failed: password S3cr3tPW rejected", secret)


def test_a_refused_import_leaves_no_new_ledger_file(tmp_path):
    from typer.testing import CliRunner

    from reports.cli import app

    log = tmp_path / "log.jsonl"
    log.write_text('{"stream":"S1","version":2,"type":"SessionOpened","ts":1.0,"data":{}}\n')
    target = tmp_path / "new" / "fresh.db"
    result = CliRunner().invoke(app, ["events", "import", str(log), "--db", f"sqlite+aiosqlite:///{target}"])
    assert result.exit_code == 2
    assert not target.parent.exists()
