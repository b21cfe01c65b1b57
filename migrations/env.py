"""Alembic environment for duplex-ledger (async engines: aiosqlite, asyncpg).

Normally run through :mod:`events.store.migrate`, which hands over an open connection in
``config.attributes["connection"]`` (the documented "connection sharing" recipe for asyncio).
Run standalone (``alembic -x ...``), it builds an async engine from ``sqlalchemy.url``.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config
target_metadata = None  # revisions are written by hand; no autogenerate


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, transaction_per_migration=False)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    shared = config.attributes.get("connection")
    if shared is not None:
        _run(shared)
    else:
        asyncio.run(_run_async(config.get_main_option("sqlalchemy.url")))
