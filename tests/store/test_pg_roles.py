"""PostgreSQL roles (issue 12): the owner runs the migrations and grants; the application role
appends, reads and maintains the read models, and cannot UPDATE, DELETE, TRUNCATE or
disable/drop the append-only triggers. Skips unless $DUPLEX_LEDGER_TEST_PG_APP_URL names the
application role (scripts/pg.sh prints it)."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from events.store import EventStore
from events.store.roles import grant_app_role
from projections.shell.runner import ProjectionRunner
from reports.cli_verify import verify_store
from tests.store.helpers import turns

APP_ENV = "DUPLEX_LEDGER_TEST_PG_APP_URL"


@pytest.fixture
async def app_store(pg_url: str):
    app = os.environ.get(APP_ENV)
    if not app:
        pytest.skip(f"needs ${APP_ENV} (the application role; scripts/pg.sh prints it)")
    owner = await EventStore.open(pg_url, create=True)
    await owner.close()
    await grant_app_role(pg_url, make_url(app).username)
    url = make_url(app).set(database=make_url(pg_url).database).render_as_string(hide_password=False)
    store = await EventStore.open(url)
    try:
        yield store
    finally:
        await store.close()


async def test_the_application_role_appends_reads_and_projects(app_store: EventStore) -> None:
    assert await app_store.append("S1", turns("S1", 3), expected_version=0) == [1, 2, 3]
    assert [s.event.turn_id for s in await app_store.read_stream("S1")] == [0, 1, 2]
    runner = ProjectionRunner(app_store)
    assert await runner.catch_up() == 3
    await runner.rebuild()
    v = await verify_store(app_store)
    assert (v.fault, v.mismatch, v.events) == (None, None, 3)


@pytest.mark.parametrize(
    "statement, refusal",
    [
        ("UPDATE events SET data = '{}' WHERE position = 1", "permission denied"),
        ("DELETE FROM events WHERE position = 1", "permission denied"),
        ("TRUNCATE events", "permission denied"),
        ("ALTER TABLE events DISABLE TRIGGER events_no_update_delete", "must be owner"),
        ("ALTER TABLE events DISABLE TRIGGER ALL", "must be owner"),
        ("DROP TRIGGER events_no_update_delete ON events", "must be owner"),
        ("ALTER TABLE events OWNER TO CURRENT_USER", "must be owner"),
    ],
)
async def test_the_application_role_cannot_rewrite_history(app_store: EventStore, statement: str, refusal: str) -> None:
    await app_store.append("S1", turns("S1", 2))
    with pytest.raises(DBAPIError, match=refusal):
        async with app_store.recorder.backend.reader.begin() as conn:
            await conn.execute(sa.text(statement))
    assert (await verify_store(app_store)).fault is None
