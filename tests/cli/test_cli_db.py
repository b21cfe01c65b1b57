"""``duplex-ledger db …``, ``schema``, help texts and import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from events.store.migrate import head_revision
from reports.cli import app
from tests.cli.conftest import Cli


def test_upgrade_current_downgrade(cli) -> None:
    r = cli("db", "current")
    assert r.exit_code == 0 and r.output.startswith("none (")
    assert ("no such ledger file" if cli.url.startswith("sqlite") else "needs `duplex-ledger db upgrade`") in r.output
    r = cli("db", "upgrade")
    assert r.exit_code == 0 and f"is at revision {head_revision()}" in r.output
    assert cli("db", "current").output.startswith(f"{head_revision()} (up to date)")
    r = cli("db", "downgrade", "base", "--yes")
    assert r.exit_code == 0 and "base (empty)" in r.output
    assert cli("db", "current").output.startswith("none")
    assert cli("db", "upgrade").exit_code == 0


def test_downgrade_asks_first(sqlite_cli) -> None:
    assert sqlite_cli("db", "upgrade").exit_code == 0
    r = sqlite_cli.runner.invoke(app, ["db", "downgrade", "--db", sqlite_cli.url], input="n\n")
    assert r.exit_code == 1
    assert sqlite_cli("db", "current").output.startswith(head_revision())


def test_commands_on_a_database_without_schema_say_what_to_run(sqlite_cli) -> None:
    r = sqlite_cli("events", "export")
    assert r.exit_code == 2  # rejected input, the same code from every command (reports.cli_errors)
    assert f"duplex-ledger db upgrade --db {sqlite_cli.url}" in r.output


def test_current_and_downgrade_on_a_missing_file_create_nothing(tmp_path) -> None:
    missing = tmp_path / "typo" / "ledger.db"
    cli = Cli(f"sqlite+aiosqlite:///{missing}")
    r = cli("db", "current")
    assert r.exit_code == 0 and r.output.startswith("none (no such ledger file")
    r = cli("db", "downgrade", "base", "--yes")
    assert r.exit_code == 2 and "no such ledger file" in r.output
    assert not missing.parent.exists()


def test_unknown_url_is_an_error(sqlite_cli) -> None:
    r = sqlite_cli("db", "upgrade", db="mysql://h/db")
    assert r.exit_code == 2 and "unsupported database URL" in r.output


def test_schema_prints_every_event_kind() -> None:
    r = CliRunner().invoke(app, ["schema"])
    assert r.exit_code == 0
    schema = json.loads(r.output)
    mapping = schema["discriminator"]["mapping"]
    assert {"SessionOpened", "StageOutput", "TurnFinalized", "SessionClosed"} <= set(mapping)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["db"],
        ["db", "upgrade"],
        ["db", "downgrade"],
        ["db", "current"],
        ["events"],
        ["events", "import"],
        ["events", "export"],
        ["events", "tail"],
        ["schema"],
    ],
)
def test_every_command_has_help(argv: list[str]) -> None:
    r = CliRunner().invoke(app, [*argv, "--help"])
    assert r.exit_code == 0
    assert "Usage: duplex-ledger" in r.output
    assert len(r.output.split("\n")) > 5


def test_default_url_comes_from_the_environment(tmp_path, monkeypatch) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("DUPLEX_LEDGER_DB_URL", url)
    r = CliRunner().invoke(app, ["db", "upgrade"])
    assert r.exit_code == 0 and (tmp_path / "env.db").exists()


def test_import_does_not_load_vllm_or_torch() -> None:
    code = (
        "import sys, events, events.store, events.jsonl, reports.cli;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
