"""Readers of an untrusted ledger (hostile-test findings M7, M8): every command that folds the
log's events checks the hash chain of the rows it folds and exits 1 (tampered) after its
output, naming the first bad position; a checkpoint of another fold version never makes
``audit``/``tables`` rewrite the read models, and ``verify`` compares them all the same."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from events.store.sqlite_schema import SQLITE_TRIGGERS
from projections.shell.runner import FOLD_VERSION
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli


def _load(cli: Cli) -> None:
    cli("db", "upgrade")
    assert cli("events", "import", str(LOG_DIR / "case-12-arrival.jsonl")).exit_code == 0


def _sql(cli: Cli, *statements: str) -> list[tuple]:
    """Run ``statements`` in one transaction (the backend's async driver); SELECT rows back."""

    async def body() -> list[tuple]:
        engine = create_async_engine(cli.url)
        out: list[tuple] = []
        try:
            async with engine.begin() as conn:
                for s in statements:
                    result = await conn.execute(sa.text(s))
                    if s.startswith("SELECT"):
                        out.extend(tuple(r) for r in result)
        finally:
            await engine.dispose()
        return out

    return asyncio.run(body())


def _edit_event(cli: Cli, position: int) -> None:
    """Edit one event row as an owner who takes the guard off and puts it back."""
    edit = f"UPDATE events SET ts_us = ts_us + 1 WHERE position = {position}"
    if cli.url.startswith("sqlite"):
        _sql(cli, "DROP TRIGGER events_no_update", edit, SQLITE_TRIGGERS["events_no_update"])
    else:
        _sql(
            cli,
            "ALTER TABLE events DISABLE TRIGGER events_no_update_delete",
            edit,
            "ALTER TABLE events ENABLE TRIGGER events_no_update_delete",
        )


READERS: dict[str, tuple[str, ...]] = {
    "audit": ("audit",),
    "audit-json": ("audit", "--format", "json"),
    "audit-until": ("audit", "--until-position", "20"),
    "tables": ("tables", "--format", "json"),
    "tables-summary": ("tables", "--summary"),
    "tables-until": ("tables", "--until-position", "20"),
    "metrics": ("metrics",),
    "timeline": ("timeline", "--session", "S1"),
}


@pytest.mark.parametrize("audited_first", [False, True], ids=["fresh-file", "audited-file"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_reader_of_an_edited_log_says_tampered_and_exits_1(
    cli: Cli, tmp_path: Path, reader: str, audited_first: bool
) -> None:
    _load(cli)
    args = READERS[reader] + (("-o", str(tmp_path / "t.html")) if reader == "timeline" else ())
    intact = cli(*args)
    assert "TAMPERED" not in intact.output and intact.exit_code in (0, 1)
    if not audited_first:  # a fresh copy: nothing derived yet (the M7 repro)
        _sql(cli, "DELETE FROM rm_turn_tables", "DELETE FROM rm_request_resources", "DELETE FROM rm_audit_findings",
             "DELETE FROM projection_checkpoints")  # fmt: skip
    _edit_event(cli, 7)
    before = _sql(cli, "SELECT count(*) FROM rm_turn_tables", "SELECT count(*) FROM projection_checkpoints")
    r = cli(*args)
    assert r.exit_code == 1, r.output
    assert "TAMPERED: the log's hash chain is broken at position 7: edited" in r.output
    # the output came first (the edited log's account), and nothing derived was written
    assert r.output.index("TAMPERED") > 0
    assert _sql(cli, "SELECT count(*) FROM rm_turn_tables", "SELECT count(*) FROM projection_checkpoints") == before


def test_audit_json_names_the_fault(sqlite_cli: Cli) -> None:
    _load(sqlite_cli)
    _edit_event(sqlite_cli, 9)
    r = sqlite_cli("audit", "--format", "json")
    assert r.exit_code == 1 and '"tampered": {' in r.output and '"position": 9' in r.output
    assert '"kind": "edited"' in r.output


@pytest.mark.parametrize("deleted", [True, False], ids=["findings-deleted", "version-only"])
@pytest.mark.parametrize("version", [FOLD_VERSION - 1, FOLD_VERSION + 1, 999])
def test_another_fold_version_is_compared_and_never_rebuilt_over(sqlite_cli: Cli, version: int, deleted: bool) -> None:
    _load(sqlite_cli)
    assert sqlite_cli("audit").exit_code == 1  # leaks: read models and checkpoint written
    found = _sql(sqlite_cli, "SELECT count(*) FROM rm_audit_findings")[0][0]
    assert found > 0
    _sql(
        sqlite_cli,
        *(("DELETE FROM rm_audit_findings",) if deleted else ()),
        f"UPDATE projection_checkpoints SET fold_version = {version}",
    )
    r = sqlite_cli("verify")
    assert r.exit_code == 1 and f"fold version {version}" in r.output, r.output
    if deleted:
        assert "rm_audit_findings" in r.output and "deleted" in r.output
    for args in (("audit",), ("tables",)):
        r = sqlite_cli(*args)
        assert "derived state in the ledger differs" in r.output and f"fold version {version}" in r.output
    left = _sql(sqlite_cli, "SELECT count(*) FROM rm_audit_findings", "SELECT fold_version FROM projection_checkpoints")
    assert left == [(0 if deleted else found,), (version,)]  # the evidence stays
    assert sqlite_cli("verify").exit_code == 1
