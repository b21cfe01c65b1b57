from __future__ import annotations

import pytest
from typer.testing import CliRunner

from reports.cli import app


class Cli:
    """Runs ``duplex-ledger`` in-process against one database URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, *args: str, db: str | None = None):
        return self.runner.invoke(app, [*args, "--db", db or self.url], catch_exceptions=False)


@pytest.fixture
def cli(db_url: str) -> Cli:
    return Cli(db_url)


@pytest.fixture
def sqlite_cli(sqlite_url: str) -> Cli:
    return Cli(sqlite_url)
