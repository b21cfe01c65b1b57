from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.store import EventStore


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[EventStore]:
    s = await EventStore.open(db_url, create=True)
    try:
        yield s
    finally:
        await s.close()
