"""Hostile-test findings on the CLI's file and database handling (H1, H2, H3, L13, L17):
an ``--output`` that is the ledger, schema objects planted at an older revision, ``db``
commands that skipped the schema check, sums that overflow, bad URL parameters."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.store.url import numeric_query
from reports.cli import app
from reports.overflow import count_overflows, nulled, number_text, overflows

LOG = Path(__file__).resolve().parent.parent / "cases" / "logs" / "case-09-barge-in.jsonl"
OVERFLOW_LOG = Path(__file__).resolve().parent / "data" / "overflow.jsonl"
REVISIONS = ("0001_events", "0002_read_models", "0003_hash_chain", "0004_replica_leases")
runner = CliRunner()


def dl(*args: str) -> object:
    return runner.invoke(app, list(args), catch_exceptions=False)


def url_of(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A ledger holding case 09 at each revision (imported at head, then downgraded)."""
    root = tmp_path_factory.mktemp("revisions")
    made = {}
    for revision in REVISIONS:
        path = root / f"{revision}.db"
        assert dl("events", "import", str(LOG), "--db", url_of(path)).exit_code == 0
        if revision != REVISIONS[-1]:
            r = dl("db", "downgrade", revision, "--yes", "--db", url_of(path))
            assert r.exit_code == 0, r.output
        made[revision] = path
    return made


def ledger_at(templates: dict[str, Path], revision: str, tmp_path: Path) -> Path:
    path = tmp_path / "a.db"
    shutil.copyfile(templates[revision], path)
    return path


# --- H1: an --output that is the ledger --------------------------------------------------
TARGETS = ("file", "symlink", "hard link", "-wal", "-shm", "-journal", "relative path")
WRITERS = {
    "events export": lambda url, out: ("events", "export", "--db", url, "--output", out),
    "events export -o": lambda url, out: ("events", "export", "--db", url, "-o", out),
    "timeline": lambda url, out: ("timeline", "--db", url, "--session", "S1", "--output", out),
}


def _target(path: Path, kind: str) -> str:
    if kind == "symlink":
        (path.parent / "link.db").symlink_to(path)
        return str(path.parent / "link.db")
    if kind == "hard link":
        os.link(path, path.parent / "hard.db")
        return str(path.parent / "hard.db")
    if kind == "relative path":
        return os.path.relpath(path)
    return str(path) + ("" if kind == "file" else kind)


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_that_is_the_ledger_or_its_siblings_is_refused_untouched(
    templates: dict[str, Path], tmp_path: Path, writer: str, kind: str
) -> None:
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    target = _target(path, kind)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    r = dl(*WRITERS[writer](url_of(path), target))
    assert r.exit_code == 2, r.output
    assert "--output" in r.output and "destroy the log" in r.output and len(r.output.splitlines()) == 1
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    assert after == before
    assert dl("events", "export", "--db", url_of(path)).output.count("\n") == len(LOG.read_text().splitlines())


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_empty_output_path_is_refused_as_empty_not_as_a_directory(
    templates: dict[str, Path], tmp_path: Path, writer: str
) -> None:
    """Hostile pass: ``--output ''`` said "file '' is a directory" (typer reads '' as '.')."""
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    r = dl(*WRITERS[writer](url_of(path), ""))
    assert r.exit_code == 2, r.output
    assert "the path is empty: name a file, or '-' for standard output" in r.output
    assert "directory" not in r.output
    directory = dl(*WRITERS[writer](url_of(path), str(tmp_path)))  # a real directory still is one
    assert directory.exit_code == 2 and f"file {str(tmp_path)!r} is a directory" in directory.output


def test_an_empty_digest_path_is_refused_as_empty(templates: dict[str, Path], tmp_path: Path) -> None:
    r = dl("verify", "--db", url_of(ledger_at(templates, REVISIONS[-1], tmp_path)), "--digest", "")
    assert r.exit_code == 2 and "--digest" in r.output and "the path is empty: name a file" in r.output


def test_a_failing_export_leaves_an_existing_target_as_it_was(
    templates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from events import jsonl

    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    out = tmp_path / "out.jsonl"
    out.write_text("previous export\n")

    async def broken(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield "one line\n"
        raise OSError(5, "Input/output error (the database's, not the output's)")

    monkeypatch.setattr(jsonl, "export_lines", broken)
    r = dl("events", "export", "--db", url_of(path), "--output", str(out))
    assert r.exit_code == 1 and "--output" not in r.output
    assert out.read_text() == "previous export\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_an_export_replaces_a_target_whole_and_keeps_its_mode(templates: dict[str, Path], tmp_path: Path) -> None:
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    out = tmp_path / "out.jsonl"
    out.write_text("x" * 100_000)
    out.chmod(0o640)
    r = dl("events", "export", "--db", url_of(path), "--output", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text() == dl("events", "export", "--db", url_of(path)).output
    assert out.stat().st_mode & 0o777 == 0o640


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_error_names_the_output_not_the_database(
    templates: dict[str, Path], tmp_path: Path, writer: str
) -> None:
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    r = dl(*WRITERS[writer](url_of(path), "/dev/full"))
    assert r.exit_code == 1, r.output  # the file system failed (ENOSPC), as `> /dev/full`; a bad path is 2
    assert "--output '/dev/full': cannot write" in r.output and "sqlite" not in r.output


# --- H2/H3: schema objects at every revision; every db command checks first ---------------
PLANTED = {
    "trigger": (
        "CREATE TABLE evil(x); CREATE TRIGGER t AFTER UPDATE ON events BEGIN INSERT INTO evil VALUES(1); END",
        "trigger t on events",
    ),
    "view": ("CREATE VIEW v AS SELECT upper(data) FROM events", "view v on v"),
    "table": ("CREATE TABLE evil(x)", "table evil"),
    "index": ("CREATE INDEX ix_evil ON events (ts_us)", "index ix_evil on events"),
}
COMMANDS = {
    "audit": ("audit",),
    "db upgrade": ("db", "upgrade"),
    "db current": ("db", "current"),
    "db downgrade base": ("db", "downgrade", "base", "--yes"),
    "db downgrade 0001": ("db", "downgrade", "0001_events", "--yes"),
    "events export": ("events", "export"),
}


def _execute(path: Path, script: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
    finally:
        conn.close()


@pytest.mark.parametrize("planted", sorted(PLANTED))
@pytest.mark.parametrize("revision", REVISIONS)
def test_a_planted_object_is_refused_and_named_at_every_revision_by_every_command(
    templates: dict[str, Path], tmp_path: Path, revision: str, planted: str
) -> None:
    path = ledger_at(templates, revision, tmp_path)
    ddl, named = PLANTED[planted]
    _execute(path, ddl)
    before = path.read_bytes()
    for name, args in COMMANDS.items():
        r = dl(*args, "--db", url_of(path))
        assert r.exit_code == 2, (name, r.output)
        assert "did not create" in r.output and named in r.output, (name, r.output)
        assert path.read_bytes() == before, name
    rows = sqlite3.connect(path).execute("SELECT count(*) FROM events").fetchone()[0]
    assert rows == len(LOG.read_text().splitlines())


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_dropped_guard_is_refused_by_every_db_command(
    templates: dict[str, Path], tmp_path: Path, revision: str
) -> None:
    path = ledger_at(templates, revision, tmp_path)
    _execute(path, "DROP TRIGGER events_no_delete")
    before = path.read_bytes()
    for name, args in COMMANDS.items():
        r = dl(*args, "--db", url_of(path))
        assert r.exit_code == 2 and "trigger events_no_delete" in r.output, (name, r.output)
        assert "nothing was changed" not in r.output or path.read_bytes() == before
    assert path.read_bytes() == before


READERS = {**COMMANDS, "tables": ("tables",), "metrics": ("metrics",), "verify": ("verify",)}


@pytest.mark.parametrize("keep", (0.25, 0.5, 0.9))
def test_a_truncated_sqlite_file_is_rejected_by_every_command_and_left_as_it_is(
    templates: dict[str, Path], tmp_path: Path, keep: float
) -> None:
    """A ledger file cut short (a half-finished copy) is rejected input, exit 2, naming the
    file as damaged, never exit 1 (which means leaks or tampering) and never changed; no
    command leaves a file beside it either (hostile pass: empty cut.db-wal and cut.db-shm
    stayed, the read's SQLite sidecars, :mod:`events.store.sidecars`)."""
    whole = templates[REVISIONS[-1]].read_bytes()
    path = tmp_path / "cut.db"
    path.write_bytes(whole[: int(len(whole) * keep)])
    before = path.read_bytes()
    for name, args in READERS.items():
        r = dl(*args, "--db", url_of(path))
        assert r.exit_code == 2, (name, r.output)
        assert "damaged or truncated" in r.output or "not a ledger" in r.output, (name, r.output)
        assert path.read_bytes() == before, name
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.db"], name


READ_ONLY = {
    **{name: args for name, args in READERS.items() if not name.startswith(("db upgrade", "db downgrade"))},
    "sessions": ("sessions",),
    "digest": ("digest",),
    "tables --summary": ("tables", "--summary"),
    "timeline": ("timeline", "--session", "S1", "--output", "-"),
}


@pytest.mark.parametrize("name", sorted(READ_ONLY))
def test_a_read_only_command_leaves_no_file_beside_a_ledger_it_read(
    templates: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """A mode=ro read of a WAL-mode ledger makes SQLite create -wal and -shm, which only a
    connection that can write removes: `sessions`, `audit`, `events export`… left both
    behind. They are removed when no connection holds the file (events.store.sidecars)."""
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db"]
    before = path.read_bytes()
    r = dl(*READ_ONLY[name], "--db", url_of(path))
    assert r.exit_code in (0, 1), r.output  # 1: case 09 leaks by design (audit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db"]
    if name not in ("audit", "tables"):  # these two catch the stored read models up (a write)
        assert path.read_bytes() == before


@pytest.mark.parametrize("revision", REVISIONS)
def test_an_intact_ledger_at_each_revision_still_upgrades_and_downgrades(
    templates: dict[str, Path], tmp_path: Path, revision: str
) -> None:
    path = ledger_at(templates, revision, tmp_path)
    assert dl("db", "current", "--db", url_of(path)).output.startswith(revision)
    r = dl("db", "upgrade", "--db", url_of(path))
    assert r.exit_code == 0 and r.output.strip().endswith(REVISIONS[-1]), r.output
    assert dl("audit", "--db", url_of(path)).exit_code in (0, 1)  # 1: leaks, not a schema refusal
    r = dl("db", "downgrade", revision, "--yes", "--db", url_of(path))
    assert r.exit_code == 0, r.output


# --- L13: sums that overflow --------------------------------------------------------------
@pytest.fixture(scope="module")
def overflow_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = url_of(tmp_path_factory.mktemp("ovf") / "o.db")
    assert dl("events", "import", str(OVERFLOW_LOG), "--db", url).exit_code == 0
    return url


@pytest.mark.parametrize("fmt", ("text", "json", "csv", "markdown"))
def test_an_overflowed_sum_is_null_or_overflow_in_every_format(overflow_ledger: str, fmt: str) -> None:
    r = CliRunner().invoke(app, ["tables", "--db", overflow_ledger, "--format", fmt])
    assert r.exit_code == 0, r.output + r.stderr
    assert r.stderr.count("warning:") == 1 and "overflowed" in r.stderr
    out = r.stdout
    shown = "null" if fmt == "json" else "'overflow'"  # the warning names what this format prints
    assert f"shown as {shown} in this {fmt} output" in r.stderr and "empty cell" not in r.stderr, r.stderr
    assert not re.search(r"\binf\b|infs|nan\b|Infinity|NaN", out, re.IGNORECASE), out
    assert "18,446,744" not in out and "18446744" not in out
    if fmt == "json":
        doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
        stage0 = doc["turns"][0]["stages"][0]
        assert stage0["num_tokens_in"] is None and stage0["stage_gen_time_ms"] is None
        assert {"stages[0].num_tokens_in", "summary.e2e_avg_tokens_per_s"} <= set(doc["turns"][0]["overflowed"])
    elif fmt == "csv":  # an overflow is not an empty cell, which means "not reported" (N2)
        assert ",num_tokens_in,overflow\n" in out and ",e2e_avg_tokens_per_s,overflow\n" in out
    else:
        assert "overflow" in out


def test_metrics_warns_of_overflowed_samples(overflow_ledger: str) -> None:
    """Prometheus carries floats, so ``metrics`` prints the sample, with the tables' warning (N3)."""
    r = CliRunner().invoke(app, ["metrics", "--db", overflow_ledger])
    assert r.exit_code == 0, r.stderr
    # prompt_tokens_total (two 2**63-1 prompts) and, since issue 22, the TPOT histogram's _sum
    # (two vllm_tpot_ms of 1.7e308)
    assert r.stderr.count("warning:") == 1 and "2 sample(s) overflowed" in r.stderr
    assert "vllm_omni:prompt_tokens_total" in r.stdout
    assert 'vllm_omni:request_time_per_output_token_s_sum{model_name="unknown"} +Inf' in r.stdout


def test_tables_json_summary_is_strict_with_overflow(overflow_ledger: str) -> None:
    r = CliRunner().invoke(app, ["tables", "--db", overflow_ledger, "--format", "json", "--summary"])
    assert r.exit_code == 0, r.stderr
    json.loads(r.stdout)


@pytest.mark.parametrize(
    ("value", "over"),
    [
        (float("inf"), True),
        (float("-inf"), True),
        (float("nan"), True),
        (2**63 - 1, False),
        (2**63, True),
        (-(2**63), False),
        (-(2**63) - 1, True),
        (1.7e308, False),
        (True, False),
        ("inf", False),
        (None, False),
    ],
)
def test_the_overflow_rule(value: object, over: bool) -> None:
    assert overflows(value) is over
    assert count_overflows({"a": [value, {"b": value}]}) == 2 * over
    assert nulled({"a": [value]}) == {"a": [None if over else value]}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert (number_text(value, ".2f", "s") == "overflow") is over


# --- L17 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("timeout=-1", "timeout='-1'"),
        ("timeout=abc", "timeout='abc'"),
        ("timeout=inf", "timeout='inf'"),
        ("command_timeout=abc", "command_timeout='abc'"),
        ("command_timeout=0", "command_timeout='0'"),
        ("statement_cache_size=x", "statement_cache_size='x'"),
        ("timeout=1&timeout=2", "'timeout' is given more than once"),
    ],
)
def test_a_bad_numeric_postgresql_parameter_is_a_usage_error_naming_it(query: str, named: str) -> None:
    url = f"postgresql+asyncpg://u:secret@127.0.0.1:1/db?{query}"
    r = dl("db", "current", "--db", url)
    assert r.exit_code == 2 and named in r.output and "TypeError" not in r.output and "secret" not in r.output


def test_numeric_parameters_reach_the_driver_as_numbers() -> None:
    url = "postgresql+asyncpg://u:p@h/db?timeout=5&command_timeout=7.5&statement_cache_size=0&ssl=require"
    assert numeric_query(url) == {"timeout": 5.0, "command_timeout": 7.5, "statement_cache_size": 0}
    assert all(type(v) is (int if k.endswith("size") else float) for k, v in numeric_query(url).items())


def test_a_digest_file_with_a_repeated_key_is_a_bad_digest_file(templates: dict[str, Path], tmp_path: Path) -> None:
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    digest = dl("digest", "--db", url_of(path)).output
    doc = json.loads(digest)
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps(doc)[:-1] + ', "position": 1}')
    r = dl("verify", "--db", url_of(path), "--digest", str(bad))
    assert r.exit_code == 2 and "'position' is given more than once" in r.output and "TAMPERED" not in r.output


def test_rebuild_quiet_prints_nothing(templates: dict[str, Path], tmp_path: Path) -> None:
    path = ledger_at(templates, REVISIONS[-1], tmp_path)
    assert dl("rebuild", "--quiet", "--db", url_of(path)).output == ""
    assert dl("rebuild", "--db", url_of(path)).output.startswith("rebuilt read models")
