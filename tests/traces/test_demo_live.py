"""End to end on live vLLM engines: ``duplex-ledger demo --model tiny`` in a subprocess (the
console script, as a user runs it), then ``duplex-ledger tables`` and ``duplex-ledger audit``
on the same database: the tables the demo printed are byte-identical to the re-projection and
the audit it printed is the one the audit command prints (clean)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reports.cli_engine import AUDIT_MARK, TABLES_MARK

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CLI = Path(sys.executable).with_name("duplex-ledger")


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (live engine tests need scripts/install-vllm.sh)")
    if not CLI.exists():
        pytest.skip(f"console script {CLI} is not installed (pip install -e .)")
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('demo') / 'ledger.db'}"
    result = cli("demo", "--model", "tiny", "--db", url, "--speed", "2", timeout=600)
    return url, result


def section(stdout: str, start: str, end: str | None) -> str:
    body = stdout.split(start + "\n", 1)[1]
    return body.split(end + "\n", 1)[0] if end else body


def test_demo_runs_clean_and_tables_reproject_byte_identical(demo_run):
    url, demo = demo_run
    assert demo.returncode == 0, demo.stderr[-4000:]
    printed_tables = section(demo.stdout, TABLES_MARK, AUDIT_MARK)
    tables = cli("tables", "--db", url, timeout=120)
    assert tables.returncode == 0, tables.stderr
    assert printed_tables == tables.stdout
    for reason in ("stop", "barge_in", "cancel", "close"):
        assert f"reason={reason}]" in printed_tables
    assert printed_tables.count("[Overall Summary]") == 15  # the listen-only turn prints none

    audit = cli("audit", "--db", url, timeout=120)
    assert audit.returncode == 0, audit.stdout
    printed_audit = section(demo.stdout, AUDIT_MARK, None).split("Re-project")[0]
    assert printed_audit == audit.stdout
    assert "clean — 0 leak(s)" in printed_audit
    # The two commands it prints run as printed (from where the demo ran) and agree with it.
    printed = demo.stdout.split("Re-project them later from the same ledger:\n", 1)[1].split("\n")[:2]
    assert [c.split()[1:] for c in printed] == [["tables", "--db", url], ["audit", "--db", url]]
    again = [
        subprocess.run(c, shell=True, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        for c in printed
    ]
    assert [r.returncode for r in again] == [0, 0]
    assert (again[0].stdout, again[1].stdout) == (tables.stdout, audit.stdout)
    assert "assistant keeps listening" in demo.stderr
