"""A ledger on a file system mounted read-only (an archive, a snapshot, a read-only volume):
SQLite must create ``-wal``/``-shm`` beside a WAL-mode file to read it even through
``mode=ro``, which such a file system refuses, so every read failed with "unable to open
database file". There no process can write the file: it is read ``immutable=1``
(:func:`events.store.url.readonly_file_uri`). The mount is made in a private user and mount
namespace (``unshare -rm``), so the host's mounts are untouched; skipped where that is not
allowed."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.streams import LOGS, cli_argv, cli_env, imported, url_of

CASE_18 = LOGS.parent / "field" / "CASE-18.jsonl"


def _on_read_only_mount(folder: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The CLI with ``args``, run where ``folder`` is bind-mounted read-only onto itself."""
    d = shlex.quote(str(folder))
    script = f"mount --bind {d} {d} && mount -o remount,bind,ro {d} && ! touch {d}/probe 2>/dev/null && " + shlex.join(
        [*cli_argv(), *args]
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120, **cli_env()
    )


def _can_mount_read_only(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe-mount"
    probe.mkdir()
    d = shlex.quote(str(probe))
    script = f"mount --bind {d} {d} && mount -o remount,bind,ro {d} && ! touch {d}/x 2>/dev/null"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, timeout=30).returncode == 0


READS = [
    ["events", "export"],
    ["sessions", "--format", "json"],
    ["metrics"],
    ["audit", "--format", "json"],
    ["tables", "--format", "json"],
    ["tables", "--summary"],
    ["verify"],
    ["digest"],
]


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a))
def test_a_ledger_on_a_read_only_file_system_reads_as_its_writable_copy(tmp_path: Path, args: list[str]) -> None:
    """Every read command prints, and exits, as it does on a writable copy of the same file
    (audit and tables fold in memory: no read model can be stored there), and the file is left
    as it was."""
    if not _can_mount_read_only(tmp_path):
        pytest.skip("no private read-only bind mount here (unshare -rm)")
    folder = tmp_path / "archive"
    folder.mkdir()
    imported(CASE_18, folder / "l.db")
    copy = tmp_path / "copy.db"
    copy.write_bytes((folder / "l.db").read_bytes())
    before = (folder / "l.db").read_bytes()
    result = _on_read_only_mount(folder, [*args, "--db", url_of(folder / "l.db")])
    assert "unable to open database file" not in result.stderr
    writable = subprocess.run([*cli_argv(), *args, "--db", url_of(copy)], capture_output=True, text=True, **cli_env())
    assert result.stdout.strip(), result.stderr
    assert (result.returncode, result.stdout) == (
        writable.returncode,
        writable.stdout.replace(str(copy), str(folder / "l.db")),
    )
    assert sorted(p.name for p in folder.iterdir()) == ["l.db"] and (folder / "l.db").read_bytes() == before


UNCLOSED_WRITER = """
import asyncio, os, sys
from events import jsonl
from events.store import EventStore

async def main():
    store = await EventStore.open(sys.argv[1])
    with open(sys.argv[2], "rb") as fh:
        await jsonl.import_rows(store, jsonl.parse_lines(fh))
    os._exit(0)  # never closed: the appends stay in the -wal, as after a crash

asyncio.run(main())
"""


def test_a_wal_left_on_read_only_media_is_read_not_skipped(tmp_path: Path) -> None:
    """A snapshot taken under a writer that never closed holds committed appends in its -wal:
    they are read (through the -wal and -shm), not skipped by an immutable read."""
    if not _can_mount_read_only(tmp_path):
        pytest.skip("no private read-only bind mount here (unshare -rm)")
    folder = tmp_path / "archive"
    folder.mkdir()
    url = imported(CASE_18, folder / "l.db")  # 23 events
    worked = LOGS / "worked-example.jsonl"  # 8 more
    subprocess.run([sys.executable, "-c", UNCLOSED_WRITER, url, str(worked)], check=True, timeout=120, **cli_env())
    assert (folder / "l.db-wal").stat().st_size > 0
    result = _on_read_only_mount(folder, ["events", "export", "--db", url])
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 31
