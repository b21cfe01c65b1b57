"""A row forged at position 0 or below, seen from the command line (hostile retest): it passed
``verify`` (``intact``), ``digest`` and every reader, and ``events export`` shipped it with
exit 0. Now each says ``TAMPERED … position 0: inserted`` first and exits 1; the export still
writes the log as stored, the forged row included (the evidence). Also: ``verify --digest``
reads a bounded amount (``/dev/zero`` answered never), and a file never folded says its read
models are not built instead of "equal a fresh fold at position 0"."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cli.test_cli_tampered_edits import LOG, READERS, _copy, _first_stderr
from tests.cli.test_cli_tampered_edits import clean_file as clean_file  # the module fixture

FORGE = (
    "INSERT INTO events SELECT {position}, stream_id, version + 100, 'forged', type, schema_version, ts_us, "
    "recorded_at_us, data, hash FROM events WHERE position = 1"
)


@pytest.mark.parametrize("position", [0, -5])
def test_a_row_forged_below_position_1_is_tampering_for_every_command(
    clean_file: Path, tmp_path: Path, position: int
) -> None:
    cli, path = _copy(clean_file, tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(FORGE.format(position=position))  # no trigger dropped: the guard lets the insert through
    conn.commit()
    conn.close()
    for command in ("verify", "digest"):
        r = cli(command)
        assert r.exit_code == 1, (command, r.output)
        assert r.stdout.startswith(f"TAMPERED: log position {position}: inserted"), (command, r.stdout)
    for reader, args in READERS.items():
        extra = ("-o", str(tmp_path / "t.html")) if reader == "timeline" else ()
        r = cli(*args, *extra)
        assert r.exit_code == 1, (reader, r.output)
        first = _first_stderr(r)
        assert first.startswith(f"TAMPERED: the log's hash chain is broken at position {position}: inserted"), (
            reader,
            r.stderr,
        )
        if reader == "export":  # the log as stored, the forged row first
            rows = [json.loads(line) for line in r.stdout.splitlines()]
            assert [row["position"] for row in rows] == [position, *range(1, 51)]


def _limit_memory() -> None:  # a read without end fails here instead of filling the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_verify_digest_refuses_a_device_and_a_big_file(clean_file: Path, tmp_path: Path) -> None:
    cli, _ = _copy(clean_file, tmp_path)
    # In a child process with a memory limit and a timeout: /dev/zero was read without end.
    r = subprocess.run(
        [sys.executable, "-c", "from reports.cli import main; main()", "verify", "--digest", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DUPLEX_LEDGER_DB_URL": cli.url, "PYTHONPATH": str(Path(__file__).parents[2])},
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 2 and "--digest /dev/zero: not a regular file" in r.stderr, (r.returncode, r.stderr)
    big = tmp_path / "big.json"
    big.write_text(cli("digest").stdout + " " * 5000)  # valid JSON, but no digest is that long
    r = cli("verify", "--digest", str(big))
    assert r.exit_code == 2 and "more than 4096 bytes" in r.stderr, r.output


def test_verify_digest_reads_a_pipe(clean_file: Path, tmp_path: Path) -> None:
    """``--digest <(ssh vault cat digest.json)``: a pipe is read as a file is (bounded)."""
    cli, _ = _copy(clean_file, tmp_path)
    digest = cli("digest").stdout
    fifo = tmp_path / "digest.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(digest,))
    writer.start()
    try:
        r = cli("verify", "--digest", str(fifo))
    finally:
        writer.join(timeout=10)
    assert r.exit_code == 0 and "matches the digest at position 50" in r.stdout, r.output


def test_verify_of_a_file_never_folded_says_its_read_models_are_not_built(tmp_path: Path) -> None:
    from tests.cli.conftest import Cli

    cli = Cli(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    assert cli("events", "import", str(LOG)).exit_code == 0
    r = cli("verify")
    assert r.exit_code == 0 and "read models not built yet" in r.stdout, r.output
    assert "fresh fold at position 0" not in r.stdout
    assert cli("audit").exit_code in (0, 1)  # builds them (exit 1: leaks found, not tampering)
    r = cli("verify")
    assert r.exit_code == 0 and "equal a fresh fold at position 50" in r.stdout, r.output
