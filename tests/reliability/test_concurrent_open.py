"""N processes opening (creating) a fresh ledger at once all succeed, on PostgreSQL too,
where migrations run under an advisory lock (issue 11 point 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
OPEN = """
import asyncio, sys, time
from events.store import EventStore
from events.types import SessionOpened
async def main():
    while time.time() < {start}:
        await asyncio.sleep(0.005)
    store = await EventStore.open(sys.argv[1], create=True)
    try:
        await store.append(sys.argv[2], [SessionOpened(session_id=sys.argv[2], ts=1.0)], expected_version=0)
    finally:
        await store.close()
asyncio.run(main())
"""
UPGRADE = """
import sys, time
while time.time() < {start}:
    time.sleep(0.005)
from reports.cli import main
sys.argv = ["duplex-ledger", "db", "upgrade", "--db", sys.argv[1]]
main()
"""


def _together(script: str, argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start one process per argv; they all begin their work at the same wall-clock second."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = script.format(start=time.time() + 4 + 0.5 * len(argvs))  # after every import is done
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *argv],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in argvs
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=180), *p.communicate()) for p in procs]


@pytest.mark.slow
def test_eight_concurrent_first_opens(db_url: str) -> None:
    done = _together(OPEN, [[db_url, f"S{i}"] for i in range(8)])
    assert [d.returncode for d in done] == [0] * 8, [d.stderr[-600:] for d in done if d.returncode]


@pytest.mark.slow
def test_four_concurrent_db_upgrades(db_url: str) -> None:
    done = _together(UPGRADE, [[db_url]] * 4)
    assert [d.returncode for d in done] == [0] * 4, [d.stderr[-600:] for d in done if d.returncode]
    assert all("is at revision" in d.stdout for d in done)
