"""``duplex-ledger serve`` rejects what it cannot serve before any model is prepared: a taken
port or an empty served model name is one line and exit 2 (the ledger file is not created)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from reports.cli import app


def test_a_taken_port_is_rejected_before_the_engines_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = tmp_path / "never.db"
        result = CliRunner().invoke(app, ["serve", "--port", str(port), "--db", f"sqlite+aiosqlite:///{db}"])
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert not db.exists()


def test_an_empty_served_model_name_is_rejected(tmp_path):
    result = CliRunner().invoke(app, ["serve", "--served-model-name", " ", "--port", "0"])
    assert result.exit_code == 2
    assert "--served-model-name" in result.output


def test_serve_is_a_command_with_the_run_style_options():
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--db", "--model", "--api-key", "--max-sessions", "--idle-timeout-s"):
        assert option in result.output, option


@pytest.mark.parametrize(
    "where",
    [
        "{tmp}/a-file/ledger.db",  # a folder that is a file: cannot be created
        "{tmp}",  # a directory, not a ledger file
        "/proc/ledger.db",  # a file system that refuses new files
    ],
)
@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo"]])
def test_an_unusable_db_is_refused_before_any_model_work(tmp_path, monkeypatch, command, where):
    """Hostile retest of issue 23: serve checked --db only after preparing the models and
    starting the engines. Now: exit 2, one line naming --db and its value, no model touched."""
    from reports import cli_engine, cli_serve

    def must_not_run(*args, **kwargs):
        raise AssertionError("a model was prepared before the ledger was opened")

    monkeypatch.setattr(cli_serve, "_prepare", must_not_run)
    monkeypatch.setattr(cli_engine, "_prepare", must_not_run)
    (tmp_path / "a-file").write_text("not a folder")
    url = f"sqlite+aiosqlite:///{where.format(tmp=tmp_path)}"
    result = CliRunner().invoke(app, [*command, "--db", url])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(f"error: --db {url}: the ledger cannot be opened for writing: "), errors[0]
