"""Shared fixtures: database URLs for both backends.

* ``sqlite_url`` — a fresh SQLite file in ``tmp_path``.
* ``pg_url`` — a fresh PostgreSQL database per test, created on the server named by
  ``$DUPLEX_LEDGER_TEST_PG_URL`` (a ``postgresql+asyncpg://`` URL of a role with CREATEDB), else
  on a throwaway cluster the session starts once (:mod:`tests.pg_cluster`), and dropped
  afterwards. Skips only when neither a URL nor the server binaries are there.
* ``db_url`` — parametrised over both (``[sqlite]`` / ``[postgresql]`` test ids).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
async def pg_url(pg_server_url: str) -> AsyncIterator[str]:
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(pg_server_url)
    name = f"dl_test_{uuid.uuid4().hex[:12]}"
    admin_dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            await _drop_database(admin, name)
        finally:
            await admin.close()


async def _drop_database(admin, name: str) -> None:
    """Drop a test database; an autovacuum worker (owned by the superuser, so not ours to
    terminate) may hold it for a moment, hence the retries."""
    import asyncio

    import asyncpg

    for attempt in range(50):
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


# Live vLLM engines (session-scoped, started once; skip when vllm is not installed).
# A throwaway PostgreSQL cluster when $DUPLEX_LEDGER_TEST_PG_URL is unset (session-scoped).
pytest_plugins = ["tests.engine.fixtures", "tests.pg_cluster"]
