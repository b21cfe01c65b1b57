"""Database URLs: the default, the environment override and the backend a URL selects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import make_url

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


def redact(url: str) -> str:
    """The URL with its password masked, for messages."""
    return make_url(url).render_as_string(hide_password=True)
