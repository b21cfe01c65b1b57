"""``duplex-ledger verify [--digest FILE]`` and ``duplex-ledger digest``: exit codes and
messages (the tricks themselves: tests/store/test_tamper.py)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from events.store.sqlite_schema import SQLITE_TRIGGERS
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli


def _load(cli: Cli) -> None:
    assert cli("events", "import", str(LOG_DIR / "case-12-arrival.jsonl")).exit_code == 0


def _sql(cli: Cli, *statements: str) -> None:
    engine = sa.create_engine(cli.url.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg"))
    with engine.begin() as conn:
        for s in statements:
            conn.execute(sa.text(s))
    engine.dispose()


def test_verify_and_digest_on_an_intact_ledger(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    _load(sqlite_cli)
    r = sqlite_cli("verify")
    assert (
        r.exit_code == 0 and "intact: hash chain of 26 event(s)" in r.output and "read models not built yet" in r.output
    )
    assert sqlite_cli("audit").exit_code == 1  # leaks; builds read models + checkpoint
    d = sqlite_cli("digest")
    assert d.exit_code == 0
    digest = json.loads(d.output)
    assert list(digest) == ["position", "hash", "recorded_at", "algorithm"] and digest["position"] == 26
    (tmp_path / "d.json").write_text(d.output)
    r = sqlite_cli("verify", "--digest", str(tmp_path / "d.json"))
    assert r.exit_code == 0 and "matches the digest at position 26" in r.output and "position 26" in r.output


def test_verify_exit_codes_for_tampering_and_usage(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    _load(sqlite_cli)
    (tmp_path / "d.json").write_text(sqlite_cli("digest").output)
    (tmp_path / "bad.json").write_text('{"position": 1}')
    r = sqlite_cli("verify", "--digest", str(tmp_path / "bad.json"))
    assert r.exit_code == 2 and "digest algorithm None" in r.output
    assert sqlite_cli("verify", "--digest", str(tmp_path / "missing.json")).exit_code == 2
    assert Cli(f"sqlite+aiosqlite:///{tmp_path / 'nope.db'}")("verify").exit_code == 2
    _sql(sqlite_cli, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE position > 24")
    r = sqlite_cli("verify")  # the guard left off is tampering by itself
    assert r.exit_code == 1 and "missing: trigger events_no_delete" in r.output
    _sql(sqlite_cli, SQLITE_TRIGGERS["events_no_delete"])  # put back: only the digest sees the truncation
    assert sqlite_cli("verify").exit_code == 0
    r = sqlite_cli("verify", "--digest", str(tmp_path / "d.json"))
    assert r.exit_code == 1 and "TAMPERED: log position 25: missing" in r.output and "truncated" in r.output
    _sql(
        sqlite_cli,
        "DROP TRIGGER events_no_update",
        "UPDATE events SET ts_us = ts_us + 1 WHERE position = 7",
        SQLITE_TRIGGERS["events_no_update"],
    )
    r = sqlite_cli("verify")
    assert r.exit_code == 1 and "TAMPERED: log position 7: edited" in r.output
    r = sqlite_cli("digest")
    assert r.exit_code == 1 and "position 7: edited" in r.output
