"""A throwaway PostgreSQL cluster for the test session (pytest plugin, registered by
``tests/conftest.py``).

When ``$DUPLEX_LEDGER_TEST_PG_URL`` is unset, the first test that needs PostgreSQL starts one:
``initdb`` in a temporary directory, ``pg_ctl start`` on a free loopback port (as the
``postgres`` user when the tests run as root: PostgreSQL refuses to run as root), the roles
``ledger`` (owner, CREATEDB) and ``ledger_app`` (application role) and the database
``ledger_test`` — what ``scripts/pg.sh`` creates on a system cluster. It exports
``DUPLEX_LEDGER_TEST_PG_URL`` and ``DUPLEX_LEDGER_TEST_PG_APP_URL`` for the rest of the session
(child processes the tests start inherit them) and stops and removes the cluster at the end.

The server binaries are found through ``pg_config --bindir``, then ``/usr/lib/postgresql/*/bin``
(Debian), then ``$PATH``; the README's test command installs them (``scripts/pg.sh
--binaries``) when missing. A set ``$DUPLEX_LEDGER_TEST_PG_URL`` is used as given (nothing is
started); without binaries the PostgreSQL tests skip with the reason.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ENV = "DUPLEX_LEDGER_TEST_PG_URL"
PG_APP_ENV = "DUPLEX_LEDGER_TEST_PG_APP_URL"
OWNER, APP, DATABASE = ("ledger", "ledger"), ("ledger_app", "ledger_app"), "ledger_test"
START_TIMEOUT_S = 60


def server_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(out.stdout.strip()))
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _version_key(p.parent.name))
    candidates.extend(reversed(debian))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    return next((d for d in candidates if (d / "initdb").exists() and (d / "pg_ctl").exists()), None)


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayCluster:
    """One initdb'd cluster in a temporary directory; :meth:`stop` removes it."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="duplex-ledger-pg-"))
        self.data = self.root / "data"
        self.port = free_loopback_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.running = False

    def _run(self, *argv: str) -> None:
        cmd = [str(a) for a in argv]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    def start(self) -> None:
        self._run(
            self.bindir / "initdb", "-D", self.data, "-U", "postgres", "--auth-local=trust",
            "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._run(self.bindir / "pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-o", options, "-w", "start")
        self.running = True
        (owner, owner_pw), (app, app_pw) = OWNER, APP
        self._psql(
            f"CREATE ROLE {owner} LOGIN PASSWORD '{owner_pw}' CREATEDB",
            f"CREATE ROLE {app} LOGIN PASSWORD '{app_pw}' NOCREATEDB NOCREATEROLE",
            f"CREATE DATABASE {DATABASE} OWNER {owner}",
        )

    def _psql(self, *statements: str) -> None:
        for sql in statements:
            self._run(self.bindir / "psql", "-h", self.root, "-p", str(self.port), "-U", "postgres",
                      "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql)  # fmt: skip

    def url(self, role: tuple[str, str]) -> str:
        return f"postgresql+asyncpg://{role[0]}:{role[1]}@127.0.0.1:{self.port}/{DATABASE}"

    def stop(self) -> None:
        if self.running:
            self.running = False
            try:
                self._run(self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """The base URL of a PostgreSQL role with CREATEDB: ``$DUPLEX_LEDGER_TEST_PG_URL``, else a
    throwaway cluster started now (once per test session). Skips when neither can be had."""
    given = os.environ.get(PG_ENV)
    if given:
        yield given
        return
    bindir = server_bindir()
    if bindir is None:
        pytest.skip(
            f"PostgreSQL tests need ${PG_ENV} or the PostgreSQL server binaries (initdb, pg_ctl): "
            "scripts/pg.sh --binaries installs them"
        )
    cluster = ThrowawayCluster(bindir)
    atexit.register(cluster.stop)  # also when the session is interrupted
    try:
        cluster.start()
    except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
        cluster.stop()
        pytest.fail(f"could not start a throwaway PostgreSQL cluster: {exc}")
    os.environ[PG_ENV], os.environ[PG_APP_ENV] = cluster.url(OWNER), cluster.url(APP)
    try:
        yield os.environ[PG_ENV]
    finally:
        os.environ.pop(PG_ENV, None)
        os.environ.pop(PG_APP_ENV, None)
        cluster.stop()
