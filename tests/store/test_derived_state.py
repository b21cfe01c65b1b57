"""Derived state found in a ledger file is never served as found (issue 12): generated
tamperings of every read-model table, and checkpoints forged with the correct log hash, never
change what ``audit`` and ``tables`` print compared with the clean file; the operator is told
on stderr, and the file is left as found (the evidence stays for ``verify``). Both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from events.store.rows import StoredRow, decode_rows
from projections.projector import Projector
from projections.shell import checkpoint, readmodels
from projections.shell.runner import FOLD_VERSION
from tests.cli.conftest import Cli

LOG = Path(__file__).parents[1] / "cases" / "logs" / "case-12-arrival.jsonl"  # 26 events, 2 leaks
TABLES = {  # table -> its key columns
    "rm_turn_tables": ("session_id", "response_id"),
    "rm_request_resources": ("session_id", "stage_id", "request_id"),
    "rm_audit_findings": ("finding_no",),
}
TOLD = "derived state in the ledger differs from its log"
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
SETTINGS = settings(
    max_examples=20,
    deadline=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Ledger:
    """The case-12 log with its read models built; ``clean`` holds what ``audit`` and
    ``tables`` print for it and ``derived`` its read models and checkpoint."""

    def __init__(self, url: str) -> None:
        self.cli = Cli(url)
        assert self.cli("db", "upgrade").exit_code == 0
        assert self.cli("events", "import", str(LOG)).exit_code == 0
        self.url = url
        self.clean = self.outputs()
        self.derived = self.read_derived()
        assert all(self.derived[t] for t in TABLES), "every read model has rows to tamper with"

    def outputs(self) -> tuple[tuple[int, str], ...]:
        results = [self.cli("audit", "--format", "json"), self.cli("tables", "--format", "json"), self.cli("tables")]
        return tuple((r.exit_code, r.stdout) for r in results) + (("stderr", " ".join(r.stderr for r in results)),)

    def sync(self, fn: Callable[[Connection], Any]) -> Any:
        """``fn(conn)`` in one transaction (the CLI's own driver: asyncpg or aiosqlite)."""

        async def go() -> Any:
            engine = create_async_engine(self.url, poolclass=NullPool)
            try:
                async with engine.begin() as conn:
                    return await conn.run_sync(fn)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def select(self, text: str, **params: Any) -> list[Any]:
        return self.sync(lambda conn: [r._mapping for r in conn.execute(sa.text(text), params)])

    def read_derived(self) -> dict[str, Any]:
        out: dict[str, Any] = {t: sorted(tuple(r.values()) for r in self.select(f"SELECT * FROM {t}")) for t in TABLES}
        out["checkpoint"] = [
            tuple(r.values()) for r in self.select("SELECT position, fold_version, state FROM projection_checkpoints")
        ]
        return out

    def run(self, *statements: tuple[str, dict[str, Any]]) -> None:
        def go(conn: Connection) -> None:
            for text, params in statements:
                conn.execute(sa.text(text), params)

        self.sync(go)

    def stored(self) -> list:
        rows = self.select(
            "SELECT position, stream_id, version, event_id, type, schema_version, ts_us, "
            "recorded_at_us, data, hash FROM events ORDER BY position"
        )
        return decode_rows([StoredRow(*list(r.values())[:9], bytes(r["hash"])) for r in rows])

    def log_hash(self, position: int) -> bytes:
        return bytes(self.select("SELECT hash FROM events WHERE position = :p", p=position)[0]["hash"])

    def check_served_from_the_log(self) -> None:
        """The tampered file prints what the clean one did and says so on stderr, every time,
        and is left as found: reading a file never erases the evidence of its tampering."""
        tampered = self.read_derived()
        for _ in range(2):
            *printed, (_, stderr) = self.outputs()
            assert printed == list(self.clean[:-1])
            assert TOLD in stderr and "verify" in stderr
        assert self.read_derived() == tampered
        assert self.cli("rebuild").exit_code == 0  # the operator's explicit repair
        assert self.read_derived() == self.derived


@pytest.fixture
def ledger(db_url: str) -> Ledger:
    return Ledger(db_url)


def _changed(value: Any, draw) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + draw(st.sampled_from([-1, 1, 7, 1000]))
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return draw(st.sampled_from([value + "x", "", "forged", value[::-1] + "_"]))
    return None


@SETTINGS
@given(data=st.data())
def test_a_tampered_read_model_is_never_served(ledger: Ledger, data) -> None:
    table = data.draw(st.sampled_from(sorted(TABLES)))
    keys = TABLES[table]
    rows = [dict(r) for r in ledger.select(f"SELECT * FROM {table}")]
    row = data.draw(st.sampled_from(rows))
    where = " AND ".join(f"{k} = :k_{k}" for k in keys)
    key_params = {f"k_{k}": row[k] for k in keys}
    trick = data.draw(st.sampled_from(["edit", "delete", "insert", "delete all"]))
    if trick == "edit":
        column = data.draw(st.sampled_from(sorted(c for c in row if c not in keys and row[c] is not None)))
        new = _changed(row[column], data.draw)
        ledger.run((f"UPDATE {table} SET {column} = :v WHERE {where}", {"v": new, **key_params}))
    elif trick == "delete":
        ledger.run((f"DELETE FROM {table} WHERE {where}", key_params))
    elif trick == "delete all":
        ledger.run((f"DELETE FROM {table}", {}))
    else:  # a forged row: a copy under a new key
        key = data.draw(st.sampled_from(keys))
        forged = {**row, key: row[key] + 1000 if isinstance(row[key], int) else f"{row[key]}-forged"}
        columns = ", ".join(forged)
        ledger.run((f"INSERT INTO {table} ({columns}) VALUES ({', '.join(':' + c for c in forged)})", forged))
    ledger.check_served_from_the_log()


@SETTINGS
@given(prefix=st.integers(0, 26), drop=st.sampled_from(["nothing", "resources", "turns", "point findings", "all"]))
def test_a_checkpoint_forged_with_the_right_log_hash_is_never_served(ledger: Ledger, prefix: int, drop: str) -> None:
    """The forger folds some prefix of the log, removes what would report a leak, and seals
    the state at the checkpoint's position with the log's true hash there."""
    stored = ledger.stored()
    position = ledger.derived["checkpoint"][0][0]
    state = Projector().apply_all(stored[:prefix])
    state.turn_tables.clear()
    if drop in ("resources", "all"):
        state.resources.sessions.clear()
    if drop in ("turns", "all"):
        state.turns.sessions.clear()
    if drop in ("point findings", "all"):
        state.resources.point_findings.clear()
        state.turns.findings.clear()
    state.position = position
    blob = checkpoint.seal(
        checkpoint.encode_state(state), fold_version=FOLD_VERSION, position=position, log_hash=ledger.log_hash(position)
    )
    if blob == ledger.derived["checkpoint"][0][2]:
        return  # the genuine checkpoint: nothing forged
    ledger.run((f"UPDATE {readmodels.checkpoints.name} SET state = :s", {"s": blob}))
    ledger.check_served_from_the_log()


def test_a_deleted_checkpoint_or_one_moved_past_the_head_is_never_served(ledger: Ledger) -> None:
    ledger.run((f"DELETE FROM {readmodels.checkpoints.name}", {}))
    ledger.check_served_from_the_log()
    ledger.run((f"UPDATE {readmodels.checkpoints.name} SET position = 99", {}))
    ledger.check_served_from_the_log()


@pytest.mark.parametrize("version", [FOLD_VERSION - 1, FOLD_VERSION + 1, 999])
def test_read_models_of_another_fold_version_are_named_and_never_rebuilt_over(ledger: Ledger, version: int) -> None:
    """Hostile-test M8: the version number used to make audit/tables clear and rebuild (and
    verify skip the comparison), erasing a deleted finding's evidence."""
    ledger.run((f"UPDATE {readmodels.checkpoints.name} SET fold_version = {version}", {}))
    ledger.run(("DELETE FROM rm_audit_findings", {}))
    *_, (_, stderr) = ledger.outputs()
    assert f"fold version {version}" in stderr
    ledger.check_served_from_the_log()


def _sealed_by_an_older_fold(ledger: Ledger) -> None:
    """The file as an older fold version left it on this very log: its checkpoint's row and
    sealed header both name FOLD_VERSION - 1 (with the log's chain hash at its position), and a
    read-model row that version computed differently."""
    position, _, blob = ledger.derived["checkpoint"][0]
    header = msgspec.msgpack.decode(bytes(blob))
    header[2] = FOLD_VERSION - 1
    older = msgspec.msgpack.encode(header)
    ledger.run(
        (
            f"UPDATE {readmodels.checkpoints.name} SET fold_version = :v, state = :s",
            {"v": FOLD_VERSION - 1, "s": older},
        ),
        ("UPDATE rm_audit_findings SET detail = 'worded by the older fold'", {}),
    )


def test_read_models_an_older_fold_built_are_outdated_and_left_as_found_until_rebuild(ledger: Ledger) -> None:
    """Hostile retest of issue 23 (M1): after an upgrade that changes the fold version, `verify`
    said TAMPERED (exit 1, as for a forged file). Now: OUTDATED, exit 3 (a gate tells it from
    tampering), readers name the upgrade — and, since the header holds no secret (an edit can be
    made to look like an upgrade: second retest), nothing but `rebuild` rewrites the evidence."""
    _sealed_by_an_older_fold(ledger)
    verified = ledger.cli("verify")
    assert verified.exit_code == 3, verified.output
    assert verified.stdout.startswith("OUTDATED: ") and f"fold version {FOLD_VERSION - 1}" in verified.stdout
    assert "cannot check" in verified.stdout
    outdated = ledger.read_derived()
    *printed, (_, stderr) = ledger.outputs()
    assert printed == list(ledger.clean[:-1])
    assert "older fold version" in stderr and "rebuild" in stderr
    assert ledger.read_derived() == outdated  # left as found
    assert ledger.cli("rebuild").exit_code == 0
    assert ledger.read_derived() == ledger.derived
    assert ledger.cli("verify").exit_code == 0


def test_an_older_version_named_by_the_row_alone_is_still_tampering(ledger: Ledger) -> None:
    """Only a checkpoint whose sealed header agrees is an upgrade's: a row edited to an older
    version over a newer blob is compared as tampering (exit 1), never rebuilt over."""
    ledger.run((f"UPDATE {readmodels.checkpoints.name} SET fold_version = {FOLD_VERSION - 1}", {}))
    ledger.run(("DELETE FROM rm_audit_findings", {}))
    verified = ledger.cli("verify")
    assert verified.exit_code == 1 and verified.stdout.startswith("TAMPERED: "), verified.output
    ledger.check_served_from_the_log()
