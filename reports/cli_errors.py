"""One error policy for every ``duplex-ledger`` command: a clear line, never a traceback.

Exit codes (the same error gives the same code from every command):

* **2 — rejected input**, nothing was written: a bad URL (empty, unparsable, unsupported), a
  SQLite path that is missing, a directory, not a ledger or a damaged (truncated) SQLite
  file, a schema at another revision than the code
  (:class:`~events.store.errors.SchemaRevisionError`), bad JSONL or trace lines, a version or
  event-id conflict, a value the store refuses (DOMAIN §5.7 D12), an unknown ``--session``.
* **1 — operational**: the database could not be reached or refused the login, the file
  system failed, a lock could not be had, or anything unexpected (the message names the
  exception; ``DUPLEX_LEDGER_DEBUG=1`` shows its traceback). ``audit`` also exits 1 for
  leaks; its error line on stderr tells the two apart.
* **1 — tampered**: a command that folds or exports the log's events (``audit``, ``tables``,
  ``metrics``, ``timeline``, ``events export``) found its hash chain broken; it prints its
  output (the edited log's account), then one line on stderr naming the first bad position
  and what is wrong (:func:`exit_if_tampered`), as ``verify`` does. When a command fails and
  the log's chain is broken, ``TAMPERED … position N`` is its first line, before the error
  the edited row caused (:func:`run`), and the exit is 1.

* **1 — the output could not be written**: stdout is a full disk or a failing device
  (``> /dev/full``): one ``error: could not write the output: …`` line, no traceback
  (:func:`output_failed`). The same for ``--output FILE`` when writing it fails with ENOSPC,
  EIO, EFBIG or EDQUOT (the file system failed); an ``--output`` path that cannot be used at all
  (a directory, a missing directory, permission denied, a read-only file system) is rejected
  input, exit 2 (:func:`output_error_code`).

* **Messages that cannot be written change no exit code.** A command's exit code is its own: a
  line for stderr (an ``error:``, a ``note:``, a progress line) that cannot be written because
  stderr is a full disk or a failing device (``2>/dev/full``) is dropped, stderr is pointed at
  ``/dev/null`` and the command goes on — a rejection still exits 2, a clean ``audit`` 0
  (:func:`guard_stderr`, installed by ``reports.cli.main``). A closed stderr *pipe* is still
  the reader going away (141, below).

* **0 — committed, but the summary could not be written**: a command that changed the ledger
  (``events import``, ``rebuild``, ``db upgrade``/``downgrade``/``grant``) has committed before
  it prints its summary line. When that line cannot be written (a full disk, a failing device,
  a closed pipe), stderr says ``warning: … was committed …; its summary could not be written:
  …`` (``nothing was committed (…)`` when it found nothing to change: ``db upgrade`` at head,
  a re-import) and the exit is 0: an operator's retry loop (``until duplex-ledger events import f; do
  …``) must not run it again — a file whose lines carry no ``event_id`` would be imported
  twice (:func:`committed`).

* **141 — the reader went away**: stdout (or stderr) is a pipe whose reader closed it
  (``duplex-ledger audit | head -1``). The command stops at once and quietly — no message, no
  traceback — and exits 141, 128 + SIGPIPE: what ``git log | head`` and the coreutils report
  (a shell with ``pipefail`` sees that the output was cut short; without it, the pipeline's
  status is the reader's). Python's own ``json.tool`` exits 32 (EPIPE's errno) and click 1,
  which reads as a failure of the command; ``rg`` exits 0, which hides that the output was
  cut. The process does not take SIGPIPE's default action itself: a database socket that
  breaks must still be an error line, not a silent death. ``reports.cli`` ends every command
  this way (:func:`closed_pipe`), rich's consoles included (their own hook exits 1). A
  command that has changed the ledger is the exception: its change is committed, so it exits
  with its own code (see "0 — committed" above).

Every message is one line per problem on stderr, printed without rich markup (user data such
as ``--session '[/]'`` is text, not markup), with characters the terminal cannot encode
escaped and any database password masked (:func:`events.store.url.scrub`).
"""

from __future__ import annotations

import asyncio
import difflib
import errno
import os
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from reports.printable import printable

if TYPE_CHECKING:
    from events.chain_walk import ChainFault
    from events.store.store import EventStore

T = TypeVar("T")
MAX_IDLE_S = 366 * 86400.0  # --max-idle: a year; more is a typo, not a policy
REJECTED = 2
OPERATIONAL = 1
TAMPERED = 1
PIPE_CLOSED = 141
"""Exit code when the reader of stdout/stderr closed the pipe: 128 + SIGPIPE (13), as git."""
DEBUG_ENV = "DUPLEX_LEDGER_DEBUG"

err = Console(stderr=True, highlight=False, soft_wrap=True)


class UnknownSession(LookupError):
    """``--session`` (or ``--stream``) names a session the log has no event of."""


class UnknownResponse(UnknownSession):
    """``--response`` names a response id no event of the log carries."""


def nearest(wanted: str, known: list[str], what: str, hint: str) -> str:
    """``; did you mean 'a', 'b'?`` (difflib's closest of ``known``), else ``hint`` (the
    command that lists the ``what``)."""
    close = difflib.get_close_matches(wanted, known, n=3, cutoff=0.5)
    if close:
        return f"; did you mean {', '.join(map(repr, close))}?"
    return f"; {hint}" if known else f"; the log holds no {what}"


async def check_session(store: EventStore, session: str | None) -> None:
    """Raise UnknownSession when ``session`` is given and the log has no event of it (a typo
    must not read as a clean audit, an empty table or an empty export), naming the nearest
    session ids."""
    if session is not None and await store.stream_version(session) == 0:
        import sqlalchemy as sa

        from events.store.url import redact

        def stream_ids(conn: Any) -> list[str]:
            return sorted(conn.execute(sa.text("SELECT DISTINCT stream_id FROM events")).scalars())

        known = await store.run_read(stream_ids)
        raise UnknownSession(
            f"no session {session!r} in the log {redact(store.url)}{nearest(session, known, 'sessions', '`duplex-ledger sessions` lists them')}"
        )


def rejected_types() -> tuple[type[BaseException], ...]:
    """The exception classes that mean "rejected input" (exit 2)."""
    from events.jsonl import JsonlError
    from events.store.errors import ConcurrencyError, EventIdConflict, InvalidRow, SchemaRevisionError
    from reports.traces import TraceError

    return (
        JsonlError,
        TraceError,
        ConcurrencyError,
        EventIdConflict,
        InvalidRow,
        SchemaRevisionError,
        UnknownSession,
        ValueError,
    )


def damaged_sqlite_file(exc: BaseException) -> bool:
    """The SQLite file itself is damaged: truncated, or pages overwritten (SQLite's
    ``SQLITE_CORRUPT*`` / ``SQLITE_NOTADB``, read off the driver's error under SQLAlchemy's)."""
    cause = getattr(exc, "orig", None) or exc
    return str(getattr(cause, "sqlite_errorname", "")).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def exit_code(exc: BaseException) -> int:
    """2 for rejected input (a damaged SQLite file too: it is not a ledger that can be read),
    1 for an operational failure (see the module doc)."""
    return REJECTED if isinstance(exc, rejected_types()) or damaged_sqlite_file(exc) else OPERATIONAL


def describe(exc: BaseException, url: str | None = None) -> list[str]:
    """The lines that say what went wrong: a driver error as its own first line (not
    SQLAlchemy's SQL dump), every line of a JSONL or trace error. An operational error names
    the database (``url``, password masked) it happened on."""
    from pydantic import ValidationError

    from events.jsonl import JsonlError
    from events.store.errors import ConcurrencyError, EventIdConflict
    from events.store.url import redact
    from reports.traces import TraceError

    if isinstance(exc, JsonlError):
        summary = getattr(exc, "summary", None)  # reports.import_summary.ImportRefused: lines counted
        refused = len({e.line for e in exc.errors})  # one line may carry several errors
        return [*map(str, exc.errors), summary or f"{refused} bad line(s); nothing was imported"]
    if isinstance(exc, TraceError):
        return [*exc.problems, f"{len(exc.problems)} bad trace line(s); nothing was run"]
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or exc.title}: {e['msg']}" for e in exc.errors())
        return [f"error: {exc.title}: {problems}"]
    orig = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError: the driver's own error
    cause = exc if orig is None else orig
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    if isinstance(exc, (ConcurrencyError, EventIdConflict)):
        first += "; nothing was written"
    if orig is None and isinstance(exc, OSError) and exc.errno in _OUTPUT_ERRNOS:
        return [os_error_line(exc)]  # the output's file failed, not the database
    where = f"{redact(url)}: " if url else ""
    if damaged_sqlite_file(exc):
        return [f"error: {where}{first} (the SQLite file is damaged or truncated; nothing was changed)"]
    if exit_code(exc) == REJECTED:
        return [f"error: {first}"]
    return [f"error: {where}{type(cause).__name__}: {first}"]


def say(line: str, url: str | None = None) -> None:
    """Print one line on stderr: password masked, no markup, un-encodable characters escaped."""
    from events.store.url import scrub

    safe = printable(scrub(line, url)).encode("utf-8", "backslashreplace").decode("utf-8")
    err.print(safe, markup=False, highlight=False)


def fail(message: str, code: int = REJECTED, url: str | None = None) -> NoReturn:
    """Print ``error: message`` and exit with ``code``."""
    say(f"error: {message}", url)
    raise typer.Exit(code)


def report(exc: BaseException, url: str | None = None) -> NoReturn:
    """Print what ``exc`` says (see :func:`describe`) and exit with :func:`exit_code`."""
    for line in describe(exc, url):
        say(line, url)
    raise typer.Exit(exit_code(exc))


def exit_if_tampered(fault: ChainFault | None, url: str | None = None) -> None:
    """Nothing for an intact chain (``fault`` None); else one line on stderr naming the first
    bad position and what is wrong, and exit 1 (tampered). Called after the command's output,
    so what the edited log says is still shown."""
    if fault is not None:
        say(f"{tampered_line(fault)} (the output above is the edited log's account; run `duplex-ledger verify`)", url)
        raise typer.Exit(TAMPERED)


def tampered_line(fault: ChainFault) -> str:
    """``TAMPERED: …`` naming the fault's position: the hash chain broken there, or (kind
    ``index``) an index of the log that does not hold the table's rows."""
    if fault.kind == "index":
        return f"TAMPERED: the ledger's index does not match its log at position {fault.position}: {fault.detail}"
    return f"TAMPERED: the log's hash chain is broken at {fault}"


def checked_url(db: str | None) -> str:
    """The URL a ``--db`` value selects (None: the default), checked for shape and backend;
    exits 2 with one line for an empty, unparsable or unsupported URL."""
    from events.store.url import backend_of, resolve_url

    try:
        url = resolve_url(db)
        if backend_of(url) == "sqlite":
            _check_sqlite_form(url)
    except ValueError as exc:
        report(exc, db)
    return url


def _check_sqlite_form(url: str) -> None:
    """A SQLite URL names a file, never a host, user or port (``sqlite+aiosqlite://x/y.db``
    read as the file ``y.db`` on host ``x``): ValueError showing the right form."""
    from sqlalchemy.engine import make_url

    from events.store.url import redact

    parsed = make_url(url)
    if parsed.host or parsed.username or parsed.password or parsed.port:
        raise ValueError(
            f"{redact(url)!r} is not a SQLite file URL (it names a host): use sqlite+aiosqlite:///RELATIVE/PATH.db "
            "or sqlite+aiosqlite:////ABSOLUTE/PATH.db (three slashes, then the path)"
        )


def run(coro_fn: Callable[[], Coroutine[Any, Any, T]], url: str | None = None) -> T:
    """Run an async command body; any error becomes :func:`report` (no traceback unless
    ``$DUPLEX_LEDGER_DEBUG`` is set). ``url``: the database URL, whose password is masked in
    every message."""
    try:
        return asyncio.run(coro_fn())
    except (typer.Exit, KeyboardInterrupt, BrokenPipeError):
        raise  # a closed pipe is no error of the log's: the CLI boundary ends quietly (closed_pipe)
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: one line, one exit code
        if os.environ.get(DEBUG_ENV):
            raise
        fault = None if isinstance(exc, not_about_the_log()) else log_fault(url, exc)
        if fault is not None:  # the edited row is why it failed: say so first (issue 22)
            say(f"{tampered_line(fault)} (run `duplex-ledger verify`)", url)
            for line in describe(exc, url):
                say(line, url)
            raise typer.Exit(TAMPERED) from None
        report(exc, url)


def not_about_the_log() -> tuple[type[BaseException], ...]:
    """Errors a ledger's rows cannot have caused (the input file, the URL, a conflict with a
    row being written, a file that is not a readable ledger): no chain walk after them."""
    from events.jsonl import JsonlError
    from events.store.errors import ConcurrencyError, EventIdConflict, InvalidRow, SchemaRevisionError
    from reports.traces import TraceError

    return (JsonlError, TraceError, ConcurrencyError, EventIdConflict, InvalidRow, SchemaRevisionError)


def log_fault(url: str | None, exc: BaseException | None = None) -> ChainFault | None:
    """The first fault of the hash chain of the ledger at ``url`` (None: intact, or it could
    not be walked): asked when a command failed with ``exc``, so that an error an edited row
    caused is preceded by ``TAMPERED … position N`` (issue 22). A SQLite file is walked with
    plain ``sqlite3`` (:func:`events.chain_walk.walk_sqlite`, its ``events`` indexes checked
    too); PostgreSQL through a read-only store, unless ``exc`` says the server could not be
    reached or refused the connection (asking again would wait as long again)."""
    from sqlalchemy.exc import DBAPIError

    from events.chain_walk import events_structure_fault, walk_log, walk_sqlite
    from events.store.sidecars import no_new_sidecars
    from events.store.url import backend_of, resolve_url, sqlite_path

    try:
        url = resolve_url(url)
        if backend_of(url) == "sqlite":
            path = sqlite_path(url)
            if not path.is_file():
                return None
            with no_new_sidecars(path):  # a refused file is left as it was found: no -wal/-shm
                return walk_sqlite(str(path.resolve())).finish() or events_structure_fault(str(path.resolve()))

        if isinstance(exc, (DBAPIError, OSError, TimeoutError)):
            return None

        async def walk() -> ChainFault | None:
            from events.store.store import EventStore

            async with await EventStore.open(url, read_only=True, tolerate_missing=True) as store:
                return (await walk_log(store))[1]

        return asyncio.run(walk())
    except Exception:  # noqa: BLE001 - no verdict: the command's own error is reported as it is
        return None


_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})
"""What a write to a full or failing file says (a closed pipe is told apart: exit 141)."""


def os_error_line(exc: OSError) -> str:
    """The ``error:`` line of a file-system error: ``could not write the output: No space
    left on device (errno 28); the output is incomplete`` for a write with no file name (stdout),
    else the file named."""
    reason = exc.strerror or type(exc).__name__
    if exc.filename is None:
        return f"error: could not write the output: {reason} (errno {exc.errno}); the output is incomplete"
    return f"error: {exc.filename!r}: {reason} (errno {exc.errno})"


def output_failed(exc: OSError) -> int:
    """A write to stdout failed for another reason than a closed pipe (a full disk, an I/O
    error: ``duplex-ledger tables > /dev/full``): one ``error:`` line on stderr naming it, no
    traceback; stdout is pointed at ``/dev/null`` so the interpreter's final flush does not
    fail again. Returns :data:`OPERATIONAL` (1: "the file system failed"; the ``error:`` line
    tells it from a tampered log's ``TAMPERED`` line)."""
    try:
        say(os_error_line(exc))
    except OSError:  # stderr is just as broken: the exit code is all that is left
        pass
    _quiet_stream(sys.stdout)
    return OPERATIONAL


def output_error_code(exc: OSError) -> int:
    """The exit code of a failed write to a named output file: :data:`OPERATIONAL` (1) when the
    file system failed (ENOSPC, EIO, EFBIG, EDQUOT: the path was fine), :data:`REJECTED` (2)
    when the path cannot be written at all (EISDIR, ENOENT, EACCES, EROFS…)."""
    return OPERATIONAL if exc.errno in _OUTPUT_ERRNOS else REJECTED


def _quiet(fd: int) -> None:
    """Point file descriptor ``fd`` at ``/dev/null`` (later writes, the interpreter's final
    flush included, succeed and go nowhere)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _GuardedStderr:
    """``sys.stderr`` for the CLI: a write or flush that fails (a full disk, a failing device)
    is dropped and the file descriptor is pointed at ``/dev/null``, so that a message that
    cannot be written changes no exit code. A closed pipe (BrokenPipeError) still propagates:
    the reader went away (exit 141). Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError:
            _quiet_stream(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError:
            _quiet_stream(self._stream)
            try:  # what stayed in the buffer now goes to /dev/null
                self._stream.flush()
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stderr() -> None:
    """Install :class:`_GuardedStderr` as ``sys.stderr`` (once; nothing when stderr is closed,
    ``2>&-``). Called by the console-script entry point before any command runs."""
    if sys.stderr is not None and not isinstance(sys.stderr, _GuardedStderr):
        sys.stderr = _GuardedStderr(sys.stderr)  # type: ignore[assignment]


def committed(summary: str | Callable[[], None], what: str, *, unchanged: str | None = None) -> bool:
    """Print ``summary`` on stdout for a command whose change to the ledger is already
    committed (``what``: ``the import (8 event(s) from f.jsonl)``); ``summary`` is a line, or a
    function that prints the command's closing report (``run``'s tables and audit). When it
    cannot be written — a full disk, a failing device, a closed pipe — stdout is pointed at
    ``/dev/null``, one ``warning:`` line on stderr says that ``what`` was committed and why its
    summary is missing, and False is returned; the command then exits with its own code (0 for
    ``events import``): it did what it was asked, and a retry loop must not run it again
    (module doc). ``unchanged``: the command found nothing to change (``the database was
    already at revision R``); the warning then says ``nothing was committed (<unchanged>)``
    instead of claiming a commit. The warning itself is best effort. True when the summary was
    written."""
    try:
        if callable(summary):
            summary()
            if sys.stdout is not None:
                sys.stdout.flush()
        else:
            typer.echo(summary)
        return True
    except SystemExit as exc:  # a plain rich Console's on_broken_pipe exits 1 while handling it
        if not isinstance(exc.__context__, BrokenPipeError):
            raise
        failure: OSError = exc.__context__
    except OSError as exc:
        failure = exc
    _quiet_stream(sys.stdout)
    if isinstance(failure, BrokenPipeError):
        reason = "the reader went away"
    else:
        reason = f"{failure.strerror or type(failure).__name__} (errno {failure.errno})"
    try:
        done = f"{what} was committed" if unchanged is None else f"nothing was committed ({unchanged})"
        say(f"warning: {done}; its summary could not be written: {reason}")
    except OSError:  # stderr is a failing device too: the exit code is all that is left
        _quiet_stream(sys.stderr)
    except SystemExit as exc:  # stderr is a closed pipe too: rich's on_broken_pipe exits 1
        if not isinstance(exc.__context__, BrokenPipeError):
            raise
        _quiet_stream(sys.stderr)
    return False


def _quiet_stream(stream: Any) -> None:
    """:func:`_quiet` the file descriptor of ``stream`` (nothing for one without: a test's
    capture, or None when the process started with it closed)."""
    try:
        _quiet(stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


STDOUT_PIECE = 65_536
"""Characters :func:`echo_text` writes to stdout at a time (a pipe's buffer on Linux)."""


def echo_text(text: str, nl: bool = True) -> None:
    """Write a command's whole output ``text`` (plus a newline when ``nl``) to stdout in pieces
    of :data:`STDOUT_PIECE` characters, each flushed. When the reader of a pipe leaves while a
    write waits, Linux returns the bytes already taken, not EPIPE, and Python's buffered writer
    counts the rest as written: one big write to ``| head -1`` ended with exit 0. The next
    piece then raises BrokenPipeError, which ends the command with 141 (:func:`closed_pipe`)."""
    if nl:
        text += "\n"
    for start in range(0, len(text), STDOUT_PIECE):
        typer.echo(text[start : start + STDOUT_PIECE], nl=False)


def closed_pipe() -> int:
    """The reader of stdout (or stderr) went away: point both at ``/dev/null`` so that nothing
    written later — the interpreter's final flush included — fails again, and return
    :data:`PIPE_CLOSED`. Python's documented way ("Note on SIGPIPE", ``signal`` module)."""
    for stream in (sys.stdout, sys.stderr):
        _quiet_stream(stream)
    return PIPE_CLOSED
