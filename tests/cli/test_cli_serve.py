"""``duplex-ledger serve`` rejects what it cannot serve before any model is prepared: a taken
port or an empty served model name is one line and exit 2 (the ledger file is not created)."""

from __future__ import annotations

import socket

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
