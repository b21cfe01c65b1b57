"""Database URLs: the default, the environment override and the backend a URL selects."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import shutil
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from events.store.errors import LedgerNotFound

ENV_VAR = "DUPLEX_LEDGER_DB_URL"
DEFAULT_URL = "sqlite+aiosqlite:///./duplex-ledger.db"
Backend = Literal["sqlite", "postgresql"]


def default_url() -> str:
    """``$DUPLEX_LEDGER_DB_URL`` when set and non-empty, else ``sqlite+aiosqlite:///./duplex-ledger.db``."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def resolve_url(url: str | None) -> str:
    """``url`` itself, or :func:`default_url` when it is None. Raises ValueError for an empty
    or blank string (``--db ''`` is a mistake, not a request for the default file)."""
    if url is None:
        return default_url()
    if not url.strip():
        raise ValueError(
            "the database URL is empty; give sqlite+aiosqlite:///PATH or "
            "postgresql+asyncpg://USER:PASS@HOST/DB, or leave --db out for the default"
        )
    return url


def parse_url(url: str) -> URL:
    """SQLAlchemy's URL object. Raises ValueError (password masked) for a string that is not
    a database URL at all."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        raise ValueError(
            f"{redact(url)!r} is not a database URL: use sqlite+aiosqlite:///PATH or "
            "postgresql+asyncpg://USER:PASS@HOST/DB"
        ) from None


def backend_of(url: str) -> Backend:
    """``"sqlite"`` for ``sqlite+aiosqlite://…``, ``"postgresql"`` for ``postgresql+asyncpg://…``.

    Raises ValueError naming the URL for any other scheme (including sync drivers and an
    in-memory SQLite database, which cannot be shared by the writer and the readers).
    """
    u = parse_url(url)
    if u.drivername == "sqlite+aiosqlite":
        if not u.database or u.database == ":memory:":
            raise ValueError(f"{url!r}: the ledger needs a SQLite file, e.g. sqlite+aiosqlite:///./duplex-ledger.db")
        _check_sqlite_query(u, url)
        return "sqlite"
    if u.drivername == "postgresql+asyncpg":
        _check_postgresql(u)
        return "postgresql"
    raise ValueError(
        f"unsupported database URL {u.render_as_string(hide_password=True)!r}: "
        "use sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASS@HOST/DB"
    )


SQLITE_SYNCHRONOUS = ("FULL", "NORMAL")
"""The values of a SQLite URL's one query parameter, ``synchronous`` (default FULL)."""


def _check_sqlite_query(u: URL, url: str) -> None:
    """A SQLite ledger URL takes one query parameter, ``synchronous=FULL|NORMAL``; anything
    else is refused naming it (the ledger sets its own pragmas)."""
    others = sorted(k for k in u.query if k != "synchronous")
    if others:
        raise ValueError(
            f"{redact(url)!r}: a SQLite ledger URL takes no query parameter but synchronous=FULL|NORMAL "
            f"(got {', '.join(others)}); the ledger sets its own pragmas"
        )
    value = u.query.get("synchronous")
    if value is not None and (not isinstance(value, str) or value.upper() not in SQLITE_SYNCHRONOUS):
        raise ValueError(f"{redact(url)!r}: synchronous={value!r} must be FULL or NORMAL (given once)")


def sqlite_synchronous(url: str) -> str | None:
    """The ``synchronous`` level a SQLite URL asks for (``FULL``/``NORMAL``, upper case), None
    when it names none (the store's default, FULL, applies)."""
    value = parse_url(url).query.get("synchronous")
    return value.upper() if isinstance(value, str) else None


def sqlite_engine_url(url: str) -> str:
    """A SQLite ledger URL without its query (``synchronous`` is the store's, not the
    driver's: ``sqlite3.connect`` would refuse it)."""
    return url.split("?", 1)[0] if parse_url(url).query else url


ASYNCPG_QUERY = frozenset(
    {
        "ssl",
        "timeout",
        "command_timeout",
        "statement_cache_size",
        "prepared_statement_cache_size",
        "target_session_attrs",
        "direct_tls",
    }
)
"""The URL query parameters a PostgreSQL ledger URL may carry (SQLAlchemy hands them to
``asyncpg.connect``)."""
# A host name (RFC 1123 labels; '_' tolerated as resolvers do), or several, comma-separated,
# as libpq's multi-host form. Anything else must parse as an IP address.
_HOST_NAMES = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _check_postgresql(u: URL) -> None:
    """Refuse, before any connection is tried, a port outside 1–65535 and a query parameter
    asyncpg would refuse at connect time (as a TypeError): each names the field and value."""
    if "@" in (u.host or "") or "@" in (u.database or ""):
        # user:pa@ss@host parses as host "ss@host": the password is cut, and its tail would be
        # printed as the host. Say what to do without quoting any of it.
        raise ValueError(
            "the database URL has an '@' after its user:password@ part: a password with '@', ':' or "
            "'/' must be percent-encoded (%40, %3A, %2F)"
        )
    where = repr(redact(u.render_as_string(hide_password=False)))
    if u.host and not _HOST_NAMES.fullmatch(u.host):
        try:
            ipaddress.ip_address(u.host)
        except ValueError:
            # "[bad" (an IPv6 bracket left open), "ho st": no lookup can succeed, so it is the
            # URL that is wrong (a usage error), not the network.
            raise ValueError(
                f"{where}: host {u.host!r} is neither a host name nor an IP address (an IPv6 address is "
                "written in brackets, as in @[::1]:5432/db)"
            ) from None
    if u.port is not None and not 1 <= u.port <= 65535:
        raise ValueError(f"{where}: port {u.port} is outside 1-65535")
    for key, value in u.query.items():
        if key == "sslmode":
            raise ValueError(f"{where}: asyncpg takes ssl=<mode>, not sslmode= (modes: {', '.join(SSL_MODES)})")
        if key not in ASYNCPG_QUERY:
            raise ValueError(f"{where}: unknown query parameter {key!r} (accepted: {', '.join(sorted(ASYNCPG_QUERY))})")
        if key == "ssl" and value not in SSL_MODES:
            raise ValueError(f"{where}: ssl={value!r} is not one of {', '.join(SSL_MODES)}")
        if not isinstance(value, str):
            raise ValueError(f"{where}: query parameter {key!r} is given more than once")
        if key in NUMBER_QUERY and (problem := NUMBER_QUERY[key](value)) is not None:
            raise ValueError(f"{where}: {key}={value!r} {problem}")


def _seconds(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "is not a number of seconds"
    return None if math.isfinite(number) and number > 0 else "must be a positive, finite number of seconds"


def _count(value: str) -> str | None:
    return None if value.isascii() and value.isdigit() and len(value) < 19 else "must be a whole number >= 0"


NUMBER_QUERY = {
    "timeout": _seconds,
    "command_timeout": _seconds,
    "statement_cache_size": _count,
    "prepared_statement_cache_size": _count,
}
"""Numeric query parameters, each checked before connecting (asyncpg raises a TypeError or an
error that does not name the URL at connect time): its check returns what is wrong, or None."""


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite+aiosqlite`` URL points at (relative to the working directory)."""
    return Path(parse_url(url).database or "")


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
            f"{redact(url)}: no such ledger file {str(path)!r} (nothing was created); "
            f"{absolute_hint(url, path)}check the path, "
            f"or create a ledger there with `duplex-ledger db upgrade --db {redact(url)}`"
        )


def absolute_hint(url: str, path: Path) -> str:
    """``"did you mean …? Otherwise "`` when the missing SQLite ``path`` of ``url`` is relative (three
    slashes: ``sqlite+aiosqlite:///tmp/x.db`` is ``tmp/x.db`` under the working directory) and
    the absolute reading (``/tmp/x.db``, four slashes) is an existing file, else ``""``."""
    if path.is_absolute() or not (Path("/") / path).is_file():
        return ""
    absolute = make_url(url).set(database=str(Path("/") / path)).render_as_string(hide_password=True)
    return f"did you mean {absolute} (four slashes for an absolute path)? Otherwise "


def redact(url: str) -> str:
    """The URL with its password masked (``***``), for every message and log line. A string
    SQLAlchemy cannot parse is masked by pattern (``scheme://user:***@…``)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return _USERINFO.sub(r"\1***@", url)
    secret = {k: "***" for k in parsed.query if k.lower() in SECRET_QUERY}
    return (parsed.update_query_dict(secret) if secret else parsed).render_as_string(hide_password=True)


SECRET_QUERY = frozenset({"password", "passfile", "sslpassword", "sslkey"})
"""URL query parameters whose values are masked like the password."""
# user:password@ — up to the LAST '@' of the URL: an unencoded '@', ':' or '/' in a password
# must not leave its tail in clear.
_USERINFO = re.compile(r"(://[^/:@\s'\"]*:)[^\s'\"]*@")


def scrub(text: str, url: str | None) -> str:
    """``text`` with the password of ``url`` (as typed and as URL-decoded) replaced by ``***``:
    for driver messages that may quote the URL they were given."""
    if not url:
        return text
    try:
        parsed = make_url(url)
        password, others = parsed.password, {parsed.username, parsed.host, parsed.database}
    except (ArgumentError, ValueError):
        password, others = None, set()
    text = text.replace(url, redact(url))
    text = _USERINFO.sub(r"\1***@", text)  # user:password@ wherever a URL is quoted
    # A password quoted on its own is masked as a whole token, unless it is also the user, host or
    # database name: masking those would garble the message and give the password away by
    # elimination ("***:***@host/***_test", "run duplex-*** db upgrade").
    if password and len(str(password)) >= 6 and str(password) not in others:
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(str(password))}(?![A-Za-z0-9])", "***", text)
    return text


def missing_ancestor(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist (None: ``path`` exists)."""
    if path.exists():
        return None
    top = path
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


def remove_sqlite_file(created: Path) -> None:
    """Undo the creation of a SQLite ledger: ``created`` is what :func:`missing_ancestor`
    returned before (the file, or the topmost folder made for it); the file's ``-wal``,
    ``-shm`` and ``-journal`` companions go too."""
    if created.is_dir():
        shutil.rmtree(created, ignore_errors=True)
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{created}{suffix}").unlink(missing_ok=True)


def numeric_query(url: str) -> dict[str, float | int]:
    """The numeric query parameters of a (checked) PostgreSQL URL as numbers, for the
    driver's ``connect_args`` (SQLAlchemy hands ``timeout=5`` to asyncpg as the string
    ``'5'``, a TypeError at connect time): seconds as float, cache sizes as int."""
    query = parse_url(url).query
    return {
        key: (float(value) if NUMBER_QUERY[key] is _seconds else int(value))
        for key, value in query.items()
        if key in NUMBER_QUERY and isinstance(value, str)
    }


def on_read_only_file_system(path: str | Path) -> bool:
    """True when the folder of the SQLite file ``path`` is on a file system mounted read-only
    (``statvfs``'s ``ST_RDONLY``): no process can write the file there."""
    try:
        return bool(os.statvfs(Path(path).resolve().parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def read_only_sqlite_ledger(url: str | None) -> bool:
    """True for a SQLite ledger URL (None: :func:`default_url`) whose file is on a read-only
    file system (:func:`on_read_only_file_system`): no read model can be stored there, so the
    readers fold it in memory. False for any other URL (PostgreSQL, unparsable: the command's
    own checks name those)."""
    try:
        url = url or default_url()
        return backend_of(url) == "sqlite" and on_read_only_file_system(sqlite_path(url))
    except ValueError:
        return False


def readonly_file_uri(path: str | Path) -> str:
    """The ``file:`` URI that opens the SQLite file ``path`` read-only (the path escaped as a
    file URI, so ``#``, ``?`` and ``%`` in it are not parsed): ``mode=ro``; on a file system
    mounted read-only, when no ``-wal`` holding transactions lies beside the file, also
    ``immutable=1``. SQLite must create ``-wal``/``-shm`` beside a WAL-mode file to read it
    even read-only, which such a file system refuses ("unable to open database file": a ledger
    archived on read-only media could not be read at all); there no process can write the file,
    so reading it as immutable (no locks, no WAL) sees all of it. A non-empty ``-wal`` (a
    writer that never closed) holds committed transactions an immutable read would skip: that
    file is read through its ``-wal``/``-shm`` as before."""
    resolved = Path(path).resolve()
    uri = resolved.as_uri() + "?mode=ro"
    try:
        wal_bytes = os.stat(resolved.with_name(resolved.name + "-wal")).st_size
    except FileNotFoundError:
        wal_bytes = 0
    except OSError:
        return uri
    return uri + "&immutable=1" if wal_bytes == 0 and on_read_only_file_system(resolved) else uri
