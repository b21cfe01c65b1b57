"""The throwaway PostgreSQL cluster the test session starts when $DUPLEX_LEDGER_TEST_PG_URL is
unset (tests/pg_cluster.py, issue 22): the roles of scripts/pg.sh, loopback only, removed on
stop."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from tests.pg_cluster import APP, OWNER, ThrowawayCluster, server_bindir

BINDIR = server_bindir()


@pytest.mark.skipif(BINDIR is None, reason="PostgreSQL server binaries not installed (scripts/pg.sh --binaries)")
async def test_a_throwaway_cluster_has_the_roles_of_pg_sh_and_is_removed_on_stop() -> None:
    assert BINDIR is not None
    cluster = ThrowawayCluster(BINDIR)
    try:
        cluster.start()
        owner, app = make_url(cluster.url(OWNER)), make_url(cluster.url(APP))
        assert owner.host == "127.0.0.1" and owner.port == cluster.port
        conn = await asyncpg.connect(owner.set(drivername="postgresql").render_as_string(hide_password=False))
        try:
            rows = await conn.fetch("SELECT rolname, rolcreatedb, rolsuper FROM pg_roles WHERE rolname LIKE 'ledger%'")
            assert sorted(tuple(r) for r in rows) == [("ledger", True, False), ("ledger_app", False, False)]
            assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):  # passwords are checked on TCP
            await asyncpg.connect(
                app.set(drivername="postgresql", password="wrong").render_as_string(hide_password=False)
            )
    finally:
        cluster.stop()
    assert not cluster.root.exists()
