"""Shared fixtures: database URLs for both backends.

* ``sqlite_url`` — a fresh SQLite file in ``tmp_path``.
* ``pg_url`` — a fresh PostgreSQL database per test, created on the server named by
  ``$DUPLEX_LEDGER_TEST_PG_URL`` (a ``postgresql+asyncpg://`` URL of a role with CREATEDB) and
  dropped afterwards. Skips when the variable is unset.
* ``db_url`` — parametrised over both (``[sqlite]`` / ``[postgresql]`` test ids).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

PG_ENV = "DUPLEX_LEDGER_TEST_PG_URL"
PG_SKIP = (
    f"PostgreSQL tests need ${PG_ENV}, e.g. postgresql+asyncpg://ledger:ledger@localhost/ledger_test "
    "(a role with CREATEDB; .ci/run or scripts/pg.sh sets one up)"
)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(PG_SKIP)
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(base)
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
pytest_plugins = ["tests.engine.fixtures"]
