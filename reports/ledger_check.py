"""The ledger a live command writes to is opened first (``serve``, ``run``, ``demo``).

Preparing the models and starting the engines takes seconds to minutes; a ``--db`` that cannot
be used must not be found out only after that (hostile retest of issue 23). :func:`open_first`
opens the ledger as the engine will — creating or upgrading it (``EventStore.open(create=True)``)
— and closes it again, before any model work. Exit 2, one line naming ``--db`` and its value
(password masked), when that fails: nothing was prepared or started.
"""

from __future__ import annotations

import asyncio

from reports.cli_errors import REJECTED, describe, fail


def open_first(url: str) -> None:
    """Open (creating or upgrading) the ledger at ``url`` and close it again; on any failure
    (a path that cannot be created, a directory, not a ledger, a schema at another revision, a
    database that cannot be reached) exit 2 naming ``--db`` and ``url``."""
    from events.store.store import EventStore
    from events.store.url import redact

    async def probe() -> None:
        store = await EventStore.open(url, create=True)
        await store.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: one line, exit 2
        why = describe(exc)[0].removeprefix("error: ")
        fail(f"--db {redact(url)}: the ledger cannot be opened for writing: {why}", REJECTED, url)
