"""Database URLs: the default, the environment override and the backend a URL selects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import make_url

from events.store.errors import LedgerNotFound

ENV_VAR = "DUPLEX_LEDGER_DB_URL"
DEFAULT_URL = "sqlite+aiosqlite:///./duplex-ledger.db"
Backend = Literal["sqlite", "postgresql"]


def default_url() -> str:
    """``$DUPLEX_LEDGER_DB_URL`` when set and non-empty, else ``sqlite+aiosqlite:///./duplex-ledger.db``."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def resolve_url(url: str | None) -> str:
    """``url`` itself, or :func:`default_url` when it is None or empty."""
    return url or default_url()


def backend_of(url: str) -> Backend:
    """``"sqlite"`` for ``sqlite+aiosqlite://…``, ``"postgresql"`` for ``postgresql+asyncpg://…``.

    Raises ValueError naming the URL for any other scheme (including sync drivers and an
    in-memory SQLite database, which cannot be shared by the writer and the readers).
    """
    u = make_url(url)
    if u.drivername == "sqlite+aiosqlite":
        if not u.database or u.database == ":memory:":
            raise ValueError(f"{url!r}: the ledger needs a SQLite file, e.g. sqlite+aiosqlite:///./duplex-ledger.db")
        return "sqlite"
    if u.drivername == "postgresql+asyncpg":
        return "postgresql"
    raise ValueError(
        f"unsupported database URL {u.render_as_string(hide_password=True)!r}: "
        "use sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASS@HOST/DB"
    )


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite+aiosqlite`` URL points at (relative to the working directory)."""
    return Path(make_url(url).database or "")


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite+aiosqlite`` URL when it does not exist yet, else None (also
    for PostgreSQL URLs). Raises ValueError for an unsupported URL (see :func:`backend_of`)."""
    if backend_of(url) != "sqlite":
        return None
    path = sqlite_path(url)
    return None if path.exists() else path


def require_existing(url: str) -> None:
    """Raise :class:`~events.store.errors.LedgerNotFound` when ``url`` is a SQLite file that
    does not exist; ValueError for an unsupported URL."""
    path = missing_sqlite_file(url)
    if path is not None:
        raise LedgerNotFound(
            f"{redact(url)}: no such ledger file {str(path)!r} (nothing was created); check the path, "
            f"or create a ledger there with `duplex-ledger db upgrade --db {redact(url)}`")


def redact(url: str) -> str:
    """The URL with its password masked, for messages."""
    return make_url(url).render_as_string(hide_password=True)
