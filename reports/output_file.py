"""Files a command writes (``--output``): never the ledger itself, and written whole or not
at all.

A ``--output`` that resolves to the SQLite ledger file or one of its ``-wal``, ``-shm`` or
``-journal`` siblings (by path after following symlinks, or by device and inode: a hard link)
is refused before anything is opened for writing — writing it would destroy the log. A
regular file is written to a temporary file in its directory and renamed over the target
when complete (``os.replace``), so a failed export leaves an existing target as it was; a
device or FIFO (``/dev/stdout``, ``/dev/full``) is written in place. Every write error names
``--output``, not the database: exit 2 (rejected input) for a path that cannot be written at
all (a directory, a missing directory, permission denied), exit 1 (operational: the file
system failed) for a full disk or an I/O error while writing (ENOSPC, EIO, EFBIG, EDQUOT), as
standard output on a full disk (:func:`reports.cli_errors.output_error_code`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, TextIO

from events.store.url import backend_of, sqlite_path
from reports.cli_errors import fail, output_error_code

LEDGER_SUFFIXES: tuple[str, ...] = ("", "-wal", "-shm", "-journal")
"""The ledger file and the siblings SQLite keeps next to it."""


def _ledger_files(url: str) -> set[str]:
    base = str(sqlite_path(url))
    return {name + suffix for name in (base, os.path.realpath(base)) for suffix in LEDGER_SUFFIXES}


def named_output(output: Path | None) -> Path | None:
    """An ``--output`` option's file, or None for standard output: the option left out, or
    ``-`` (the Unix convention; never a file named ``-`` in the working directory)."""
    return None if output is None or str(output) == "-" else output


def refuse_ledger_target(output: Path, url: str, option: str = "--output") -> None:
    """Exit 2 (one line naming ``option``) when ``output`` is the SQLite ledger of ``url`` or
    one of its -wal/-shm/-journal files: same real path (symlinks followed) or same
    ``st_dev``/``st_ino`` (a hard link). PostgreSQL URLs have no such file: nothing to check."""
    if backend_of(url) != "sqlite":
        return
    target = os.path.realpath(output)
    try:
        out_stat: os.stat_result | None = os.stat(output)
    except OSError:
        out_stat = None
    for name in sorted(_ledger_files(url)):
        same = os.path.realpath(name) == target
        if not same and out_stat is not None:
            with contextlib.suppress(OSError):
                found = os.stat(name)
                same = (found.st_dev, found.st_ino) == (out_stat.st_dev, out_stat.st_ino)
        if same:
            fail(
                f"{option} {str(output)!r} is the ledger file {name!r} (or links to it); writing it would destroy the log"
            )


class _Checked:
    """A text handle whose write errors exit naming the option (not the database)."""

    def __init__(self, fh: TextIO, output: Path, option: str) -> None:
        self.fh, self.output, self.option = fh, output, option

    def write(self, text: str) -> int:
        try:
            return self.fh.write(text)
        except OSError as exc:
            cannot_write(self.output, exc, self.option)


def cannot_write(output: Path, exc: OSError, option: str = "--output") -> NoReturn:
    """Exit with ``--output 'PATH': cannot write: REASON (errno N)``: 2 for a path that cannot
    be written, 1 when the file system failed (:func:`reports.cli_errors.output_error_code`).
    A closed pipe is re-raised: the CLI ends as for standard output (exit 141)."""
    if isinstance(exc, BrokenPipeError):  # --output /dev/stdout | head: the reader went away (141)
        raise exc
    reason = f"{exc.strerror} (errno {exc.errno})" if exc.strerror else str(exc)
    fail(f"{option} {str(output)!r}: cannot write: {reason}", output_error_code(exc))


def _mode_for(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def output_file(output: Path, option: str = "--output") -> Iterator[_Checked]:
    """Open ``output`` for writing UTF-8 text (``\\n`` newlines) and yield a handle with
    ``write(str)``; on leaving the block without an error the text replaces the target
    atomically (regular files) or has been flushed (devices, FIFOs). On an error in the block
    the temporary file is removed and the target is untouched. Open, write, flush and rename
    errors exit naming ``option`` (:func:`cannot_write`). Call :func:`refuse_ledger_target` first."""
    target = Path(os.path.realpath(output))
    try:  # what the path opens (os.stat follows links): /dev/stdout on a pipe resolves to no
        regular = stat.S_ISREG(os.stat(output).st_mode)  # file (``pipe:[N]``), yet opens the pipe
    except OSError:  # a new file (or a path mkstemp then refuses, naming why)
        regular = True
    tmp: str | None = None
    try:
        if regular:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            fh: TextIO = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        else:
            fh = open(output, "w", encoding="utf-8", newline="\n")
    except OSError as exc:
        cannot_write(output, exc, option)
    done = False
    try:
        yield _Checked(fh, output, option)
        try:
            fh.close()
            if tmp is not None:
                os.chmod(tmp, _mode_for(target))
                os.replace(tmp, target)
        except OSError as exc:
            cannot_write(output, exc, option)
        done = True
    finally:
        if not done:
            with contextlib.suppress(OSError):
                fh.close()
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
