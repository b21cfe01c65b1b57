"""Connections, transactions and the few behaviours that differ between SQLite and PostgreSQL.

Writes (appends and migrations) run as one *synchronous* SQLAlchemy Core function per
transaction, ``fn(connection, *args)``, through :meth:`Backend.run_write`; reads use an async
engine.

SQLite (``sqlite+aiosqlite``)
    The write transaction runs in one dedicated thread on a sync ``pysqlite`` engine for the
    same file: a whole group-commit batch costs one thread hop instead of one per statement
    (aiosqlite's per-statement hop dominated the write path). Every connection runs
    ``busy_timeout`` and the configured ``synchronous`` level (FULL by default: a commit
    returns once the WAL is fsynced; NORMAL, asked for with ``?synchronous=NORMAL`` on the URL
    or the ``synchronous`` argument, may lose the commits since the last WAL checkpoint on
    power loss or an OS crash, never on a process crash, and never corrupts); the write connection also sets ``journal_mode=WAL`` (persistent in the file,
    so readers never set it: a read leaves the file as it was). ``read_only=True`` opens the
    readers through a ``mode=ro`` URI and refuses writes (:class:`ReadOnlyStore`). The driver's own transaction handling is off
    (``isolation_level = None``) and SQLAlchemy's ``begin`` hook sends ``BEGIN IMMEDIATE``,
    which takes the write lock when the transaction starts. Without it, a transaction that
    reads (head position, stream versions) and then writes holds only a read snapshot; two such
    transactions on one file (two processes) deadlock on the upgrade and one gets SQLITE_BUSY at
    once, which no busy timeout can absorb. Reads use aiosqlite in autocommit mode: one
    statement on a WAL snapshot, never blocking the writer; the point reads of a session open
    (a stream, a stream's version, the head) run the same way on a plain sqlite3 connection
    owned by one reader thread (:meth:`SqliteBackend._read_raw`: one hop, issue 23).

PostgreSQL (``postgresql+asyncpg``)
    One async engine; the write function runs via ``run_sync`` inside an async transaction.
    :meth:`Backend.lock_for_append` takes a transaction-scoped advisory lock before positions
    are allocated (why: :mod:`events.store.recorder`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from events.chain import GENESIS
from events.chain_walk import tolerant_text
from events.store import schema
from events.store.errors import ReadOnlyStore
from events.store.probe import readonly_async_engine
from events.store.sidecars import remove_new_sidecars, sidecars_missing
from events.store.url import (
    backend_of,
    numeric_query,
    readonly_file_uri,
    redact,
    sqlite_engine_url,
    sqlite_path,
    sqlite_synchronous,
)
from events.store.writer_thread import WriterThread

Synchronous = Literal["FULL", "NORMAL"]
T = TypeVar("T")
WriteFn = Callable[..., T]
# Arbitrary constant key of the advisory lock serialising position allocation ("dlgr").
APPEND_LOCK_KEY = 0x646C6772
IDLE_TX_TIMEOUT_MS = 5000  # PostgreSQL idle_in_transaction_session_timeout of the store's sessions
_SELECT_ROWS = f"SELECT {', '.join(schema.ROW_COLUMNS)} FROM events WHERE position >= ?"
_SQLITE_INSERT = str(schema.events.insert().compile(dialect=sqlite_dialect(paramstyle="qmark")))
_events = schema.events
HEAD = sa.select(sa.func.coalesce(sa.func.max(_events.c.position), 0))
_TIP = sa.select(_events.c.position, _events.c.hash).order_by(_events.c.position.desc()).limit(1)
_VERSIONS = (
    sa.select(_events.c.stream_id, sa.func.max(_events.c.version))
    .where(_events.c.stream_id.in_(sa.bindparam("streams", expanding=True)))
    .group_by(_events.c.stream_id)
)
# event_id, then the columns of planning.Existing in its field order.
EXISTING_COLUMNS = ("event_id", "stream_id", "version", "position", "type", "schema_version", "ts_us", "data")
_EXISTING = sa.select(*(_events.c[name] for name in EXISTING_COLUMNS)).where(
    _events.c.event_id.in_(sa.bindparam("ids", expanding=True))
)


def tip_of(row: Any) -> tuple[int, bytes]:
    """``(position, hash)`` of the last row, ``(0, GENESIS)`` when there is none. A hash that
    is not 32 bytes (a row the store did not write) is chained from as GENESIS: ``verify``
    reports that row."""
    if row is None:
        return 0, GENESIS
    position, digest = row
    return int(position), bytes(digest) if isinstance(digest, (bytes, bytearray, memoryview)) and len(
        digest
    ) == 32 else GENESIS


def check_synchronous(synchronous: str | None) -> None:
    """ValueError unless ``synchronous`` is FULL, NORMAL or None (the SQLite levels the store
    allows; None: the URL's ``?synchronous=``, else FULL)."""
    if synchronous not in ("FULL", "NORMAL", None):
        raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")


def synchronous_of(url: str, synchronous: Synchronous | None = None) -> Synchronous:
    """The level a SQLite store on ``url`` runs at: ``synchronous`` when given, else the URL's
    ``?synchronous=FULL|NORMAL``, else FULL (an acknowledged append survives power loss)."""
    check_synchronous(synchronous)
    chosen = synchronous or sqlite_synchronous(url) or "FULL"
    return "NORMAL" if chosen == "NORMAL" else "FULL"


class Backend:
    """What both backends offer; subclasses implement it."""

    name = "base"

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only
        self.reader: AsyncEngine = self._make_reader()

    def _make_reader(self) -> AsyncEngine:
        return create_async_engine(self.engine_url, **self._reader_kwargs())

    @property
    def engine_url(self) -> str:
        """The URL the driver is given (SQLite: without the store's own query)."""
        return self.url

    def _reader_kwargs(self) -> dict[str, Any]:
        return {}

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"{redact(self.url)} was opened read-only; nothing was written")

    async def run_write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(sync_connection, *args)`` in one write transaction and commit it.
        Exceptions roll the transaction back and propagate."""
        raise NotImplementedError

    writer_thread: WriterThread | None = None
    """The thread that owns the write connection, when the backend has one (SQLite): the
    group commit then runs on it whole (:meth:`write_now`)."""

    def write_now(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`run_write`, called on :attr:`writer_thread` itself (blocking)."""
        raise NotImplementedError

    async def run_read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(sync_connection, *args)`` on a read connection."""
        async with self.reader.connect() as conn:
            return await conn.run_sync(fn, *args)

    select_rows_raw: Callable[[int, int | None, int, str | None], Awaitable[list[Any]]] | None = None
    """``(from_position, until_position, limit, stream_id)`` -> the rows as plain tuples in
    :data:`schema.ROW_COLUMNS` order, for a backend whose driver reads them faster than a
    Core select (SQLite); None: the recorder runs the Core select."""

    read_raw: Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]] | None = None
    """``(sql, parameters)`` -> the statement's rows as plain driver tuples, read in one hop
    (SQLite: :meth:`SqliteBackend._read_raw`); None: the recorder runs the Core select. Raises
    the driver's own error (``sqlite3.Error``), on which the recorder runs the Core select, so
    a failing read fails exactly as it did without this path."""

    def lock_for_append(self, conn: Connection) -> None:
        """Serialise position allocation with every other writer (inside the transaction)."""

    # The append transaction's statements (run inside it, on its sync connection).
    def select_tip(self, conn: Connection) -> tuple[int, bytes]:
        """The head position and its chain hash ((0, GENESIS) for an empty log)."""
        return tip_of(conn.execute(_TIP).first())

    def select_versions(self, conn: Connection, streams: Sequence[str]) -> dict[str, int]:
        """stream_id -> its last version, for those of ``streams`` that exist."""
        return {s: v for s, v in conn.execute(_VERSIONS, {"streams": list(streams)}).all()}

    def select_existing(self, conn: Connection, event_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """The :data:`EXISTING_COLUMNS` of those of ``event_ids`` already stored."""
        return [tuple(r) for r in conn.execute(_EXISTING, {"ids": list(event_ids)}).all()]

    def insert_rows(self, conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (tuples in ``schema.ROW_COLUMNS`` order) with one executemany."""
        conn.execute(schema.events.insert(), [dict(zip(schema.ROW_COLUMNS, r)) for r in rows])

    def is_transient(self, exc: BaseException) -> bool:
        """True when retrying the whole transaction may succeed (lock contention)."""
        return False

    async def dispose(self) -> None:
        await self.reader.dispose()


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(
        self,
        url: str,
        *,
        synchronous: Synchronous | None = None,
        busy_timeout_ms: int = 30_000,
        read_only: bool = False,
    ) -> None:
        self.synchronous = synchronous_of(url, synchronous)
        self.busy_timeout_ms = busy_timeout_ms
        path = sqlite_path(url)
        self._path = path
        self._sidecars_missing = sidecars_missing(path)  # removed again at dispose when SQLite would
        if not read_only and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(url, read_only=read_only)
        self._install_hooks(self.reader.sync_engine, begin=None, wal=False)  # autocommit reads
        self._thread = self.writer_thread = WriterThread("duplex-ledger-sqlite-writer")
        self.select_rows_raw = self._select_rows_raw
        self._write_engine: Engine | None = None
        self._write_conn: Connection | None = None
        # The point reads of a session open (its stream, a stream's version, the head: issue
        # 23) run on one thread owning a plain sqlite3 autocommit connection: one hop, no
        # SQLAlchemy pool or aiosqlite (~5 hops and ~300 µs of loop CPU a read).
        self._read_thread = WriterThread("duplex-ledger-sqlite-reader")
        self._read_conn: sqlite3.Connection | None = None
        self._read_closed = False  # dispose() has begun: later reads take the Core select
        # Its URI, fixed now: the file this store was opened on, whatever the working directory
        # at the first read; mode=rw never creates a file (one deleted meanwhile: the Core read).
        self._read_uri = readonly_file_uri(path) if read_only else path.resolve().as_uri() + "?mode=rw"
        self.read_raw = self._read_raw

    def _make_reader(self) -> AsyncEngine:
        return readonly_async_engine(self.url) if self.read_only else super()._make_reader()

    @property
    def engine_url(self) -> str:
        return sqlite_engine_url(self.url)

    async def _select_rows_raw(
        self, from_position: int, until_position: int | None, limit: int, stream_id: str | None
    ) -> list[Any]:
        """The recorder's row read on the reader's own aiosqlite connection, its SQL sent
        as is: sqlite3 already gives the column types the store reads (int, str, bytes), so
        SQLAlchemy's result rows (~1.5 µs a row, a fifth of a decoded read) are skipped."""
        sql, params = _SELECT_ROWS, [from_position]
        if until_position is not None:
            sql += " AND position <= ?"
            params.append(until_position)
        where_stream = () if stream_id is None else (stream_id,)
        if stream_id is not None:
            sql += " AND stream_id = ?"
        query = (f"{sql} ORDER BY position LIMIT ?", (*params, *where_stream, limit))
        async with self.reader.connect() as conn:
            driver: Any = (await conn.get_raw_connection()).driver_connection
            try:
                return list(await driver.execute_fetchall(*query))
            except sqlite3.OperationalError as exc:
                if "decode to UTF-8" not in str(exc):
                    raise
            # An edited row's TEXT that is not UTF-8 (verify names it edited): read the batch
            # again keeping such a value's bytes (NotUtf8), so the row is still read as stored.
            driver.text_factory = tolerant_text
            try:
                return list(await driver.execute_fetchall(*query))
            finally:
                driver.text_factory = str

    def _read_connection(self) -> sqlite3.Connection:
        """The read thread's connection, opened on first use: autocommit (each statement reads
        its own WAL snapshot, which holds every commit acknowledged before the statement
        began, and never blocks the writer), ``mode=ro`` on a read-only store, else ``mode=rw``
        (never creating a file), on the path resolved when the store was opened (a relative
        URL stays the store's file after a ``chdir``), the store's busy timeout."""
        if self._read_conn is None:
            timeout_s = self.busy_timeout_ms / 1000
            conn = sqlite3.connect(self._read_uri, uri=True, timeout=timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            self._read_conn = conn
        return self._read_conn

    def _fetch_in_thread(self, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
        return self._read_connection().execute(sql, parameters).fetchall()

    async def _read_raw(self, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
        """``sql`` on the read thread's sqlite3 connection: its rows as sqlite3 gives them
        (the column types SQLAlchemy's rows carry here too: no result processors on SQLite).
        Raises sqlite3.ProgrammingError once the store is closed (the recorder then runs the
        Core select, as it did before this path existed)."""
        if self._read_closed:  # after close: no new thread nor connection left behind
            raise sqlite3.ProgrammingError("the store is closed: the Core select reads")
        return await self._read_thread.call(self._fetch_in_thread, sql, parameters)

    def _close_read_in_thread(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    def _reader_kwargs(self) -> dict[str, Any]:
        return {"connect_args": {"timeout": self.busy_timeout_ms / 1000}}

    def _install_hooks(self, engine: Engine, *, begin: str | None, wal: bool = True) -> None:
        pragmas = (
            f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}",
            *(("PRAGMA journal_mode=WAL",) if wal else ()),
            f"PRAGMA synchronous={self.synchronous}",
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # SQLAlchemy, not the driver, sends BEGIN
            cursor = dbapi_connection.cursor()
            for pragma in pragmas:
                cursor.execute(pragma)
            cursor.close()

        if begin is not None:

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Any) -> None:
                conn.exec_driver_sql(begin)

    def make_write_engine(self) -> Engine:
        """A sync engine on the same file whose transactions start with ``BEGIN IMMEDIATE``."""
        engine = create_engine(
            self.engine_url.replace("sqlite+aiosqlite", "sqlite+pysqlite", 1),
            connect_args={"timeout": self.busy_timeout_ms / 1000},
        )
        self._install_hooks(engine, begin="BEGIN IMMEDIATE")
        return engine

    def _connection(self) -> Connection:
        if self._write_conn is None:
            if self._write_engine is None:
                self._write_engine = self.make_write_engine()
            self._write_conn = self._write_engine.connect()
        return self._write_conn

    def _write_in_thread(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        conn = self._connection()
        try:
            with conn.begin():
                return fn(conn, *args)
        except BaseException:
            self._write_conn = None
            conn.close()
            raise

    async def run_write(self, fn: Callable[..., T], *args: Any) -> T:
        self._refuse_if_read_only()
        return await self._thread.call(self._write_in_thread, fn, args)

    def write_now(self, fn: Callable[..., T], *args: Any) -> T:
        """The append transaction: ``BEGIN IMMEDIATE`` and ``COMMIT`` sent on the sqlite3
        connection itself (SQLAlchemy's begin/commit cost ~100 µs a batch), so ``fn`` must
        use the raw cursor only (:meth:`_cursor`: every append statement here does). Errors
        roll back and drop the connection, as :meth:`run_write` does."""
        self._refuse_if_read_only()
        conn = self._connection()
        raw = conn.connection.dbapi_connection
        try:
            raw.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
            try:
                result = fn(conn, *args)
                raw.execute("COMMIT")  # type: ignore[union-attr]
            except BaseException:
                if raw.in_transaction:  # type: ignore[union-attr]
                    raw.execute("ROLLBACK")  # type: ignore[union-attr]
                raise
        except BaseException:
            self._write_conn = None
            conn.close()
            raise
        return result

    # The append transaction's statements go straight to the sqlite3 cursor of the
    # transaction's connection: SQLAlchemy's per-statement execution context cost ~60 µs
    # each, half of a small append's CPU (the live session log appends several times a turn).
    @staticmethod
    def _cursor(conn: Connection) -> Any:
        return conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]

    def select_tip(self, conn: Connection) -> tuple[int, bytes]:
        return tip_of(
            self._cursor(conn).execute("SELECT position, hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
        )

    def select_versions(self, conn: Connection, streams: Sequence[str]) -> dict[str, int]:
        marks = ",".join("?" * len(streams))
        sql = f"SELECT stream_id, max(version) FROM events WHERE stream_id IN ({marks}) GROUP BY stream_id"
        return dict(self._cursor(conn).execute(sql, tuple(streams)).fetchall())

    def select_existing(self, conn: Connection, event_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        marks = ",".join("?" * len(event_ids))
        sql = f"SELECT {', '.join(EXISTING_COLUMNS)} FROM events WHERE event_id IN ({marks})"
        return self._cursor(conn).execute(sql, tuple(event_ids)).fetchall()  # type: ignore[no-any-return]

    def insert_rows(self, conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        # The Core insert compiled once to SQL, tuples straight to cursor.executemany: no
        # per-row parameter processing (the writer's hottest loop).
        self._cursor(conn).executemany(_SQLITE_INSERT, rows)

    def is_transient(self, exc: BaseException) -> bool:
        msg = str(getattr(exc, "orig", exc)).lower()
        return isinstance(exc, (DBAPIError, sqlite3.OperationalError)) and (
            "database is locked" in msg or "database is busy" in msg
        )

    def _dispose_in_thread(self) -> None:
        if self._write_conn is not None:
            self._write_conn.close()
            self._write_conn = None
        if self._write_engine is not None:
            self._write_engine.dispose()
            self._write_engine = None

    async def dispose(self) -> None:
        await self._thread.call(self._dispose_in_thread)
        await self._thread.stop()
        self._read_closed = True
        if self._read_thread.started:  # queued after any read in flight (which may open it)
            await self._read_thread.call(self._close_read_in_thread)
        await self._read_thread.stop()
        await super().dispose()
        remove_new_sidecars(self._path, self._sidecars_missing)


class PostgresBackend(Backend):
    name = "postgresql"

    def _reader_kwargs(self) -> dict[str, Any]:
        # A client paused inside a transaction (SIGSTOP, a long GC pause) would hold the append
        # lock and stall every replica; the server ends such a session after this long
        # (issue 14). Milliseconds; $DUPLEX_LEDGER_PG_IDLE_TX_TIMEOUT_MS, 0 = never.
        idle_ms = os.environ.get("DUPLEX_LEDGER_PG_IDLE_TX_TIMEOUT_MS", str(IDLE_TX_TIMEOUT_MS))
        return {
            "pool_size": 5,
            "max_overflow": 10,
            "connect_args": {
                "server_settings": {"idle_in_transaction_session_timeout": idle_ms},
                **numeric_query(self.url),
            },
        }

    async def run_write(self, fn: Callable[..., T], *args: Any) -> T:
        self._refuse_if_read_only()
        async with self.reader.connect() as conn:
            async with conn.begin():
                return await conn.run_sync(fn, *args)

    def lock_for_append(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPEND_LOCK_KEY})

    def is_transient(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", None)
        code = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "__cause__", None), "sqlstate", None)
        return code in ("40001", "40P01")  # serialization failure, deadlock detected


def make_backend(
    url: str, *, synchronous: Synchronous | None = None, busy_timeout_ms: int = 30_000, read_only: bool = False
) -> Backend:
    """The backend a URL selects (see :func:`events.store.url.backend_of`). Raises ValueError
    for an unsupported URL."""
    if backend_of(url) == "sqlite":
        return SqliteBackend(url, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, read_only=read_only)
    return PostgresBackend(url, read_only=read_only)
