"""A rebuild worker (spawned) imports only what decoding and folding need: the store's engine
and migrations load on first use of ``events.store.EventStore`` (issue 15)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_worker_import_skips_the_store_and_its_migrations() -> None:
    code = (
        "import sys, projections.shell.parallel\n"
        "print(sorted(m for m in ('alembic', 'events.store.store', 'events.store.migrate') if m in sys.modules))\n"
        "from events.store import EventStore, ImportResult\n"
        "print(EventStore.__module__, ImportResult.__name__, 'events.store.store' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "events.store.store ImportResult True"]


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import events.store

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        events.store.Nope  # noqa: B018
